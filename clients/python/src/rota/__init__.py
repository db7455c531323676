"""Python client for rota, the central load-balancing decision service.

Providers keep their instances registered with :meth:`RotaClient.register`; consumers ask
rota which instance to call with :meth:`RotaClient.pick`, from one rotation shared by every
consumer. :class:`rota.aio.AsyncRotaClient` offers the same for asyncio code, and
:mod:`rota.version` carries a request's version through the whole call chain.
:func:`rota.channel` (and :func:`rota.aio.channel`) is a gRPC channel for ``rota:///SERVICE``
that routes every call by leased tickets of rota's rotation.
"""

from ._channel import RotaChannel, channel
from .aio import AsyncRegistration, AsyncRotaClient
from .backoff import Backoff
from .client import Registration, RotaClient
from .errors import RegistrationError, RotaError
from .fallback import InstanceCache
from .model import (
    Ack,
    CallOutcome,
    CallResult,
    Instance,
    InstanceList,
    InstanceRef,
    InstanceStatus,
    PickResult,
    Refusal,
    ReportResult,
    ServiceSummary,
    WatchEvent,
)
from .version import VERSION_HEADER, current_version, use_version, version_from_headers

__version__ = "0.1.0"

__all__ = [
    "VERSION_HEADER",
    "Ack",
    "AsyncRegistration",
    "AsyncRotaClient",
    "Backoff",
    "CallOutcome",
    "CallResult",
    "Instance",
    "InstanceCache",
    "InstanceList",
    "InstanceRef",
    "InstanceStatus",
    "PickResult",
    "Refusal",
    "RegistrationError",
    "ReportResult",
    "RotaChannel",
    "RotaClient",
    "RotaError",
    "Registration",
    "ServiceSummary",
    "WatchEvent",
    "channel",
    "current_version",
    "use_version",
    "version_from_headers",
]
