"""The values the rota client hands out and takes in: plain, typed dataclasses."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import grpc


class InstanceStatus(enum.IntEnum):
    """Whether an instance receives picks (``rota.v1.InstanceStatus``)."""

    #: Unset on the wire; rota treats an announced instance without a status as UP.
    UNSPECIFIED = 0
    #: Eligible for picks.
    UP = 1
    #: Registered but receives no new picks (finishing its in-flight work).
    DRAINING = 2
    #: Registered but not eligible.
    DOWN = 3


class CallResult(enum.IntEnum):
    """How a call to a picked instance ended (``rota.v1.CallResult``)."""

    OK = 1
    #: The instance could not be reached (refused, reset, timed out connecting).
    CONNECT_FAILURE = 2
    #: The instance answered with an error.
    ERROR = 3


@dataclass(frozen=True)
class InstanceRef:
    """Names one instance of one service."""

    service: str
    id: str


@dataclass(frozen=True)
class Instance:
    """One instance of a service: where it listens and what it serves.

    ``id`` may be left empty when announcing; rota then uses ``"host:port"``. An empty
    ``version`` means the instance serves requests that carry no version.
    """

    service: str
    host: str
    port: int
    id: str = ""
    version: str = ""
    zone: str = ""
    #: ``None`` means rota's default (100); 0 means never picked by weighted rules.
    weight: int | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)
    status: InstanceStatus = InstanceStatus.UP

    def __hash__(self) -> int:
        return hash((self.service, self.id, self.host, self.port, self.version))

    @property
    def address(self) -> str:
        """``host:port``, with an IPv6 host in brackets."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def ref(self) -> InstanceRef:
        """The reference rota files this instance under (the id defaults to ``host:port``)."""
        return InstanceRef(self.service, self.id or f"{self.host}:{self.port}")


@dataclass(frozen=True)
class PickResult:
    """One instance chosen by rota (or, when rota is unreachable, by the local fallback)."""

    instance: Instance
    #: The number drawn from the shared rotation of (service, rule, subset) for this pick.
    ticket: int
    #: The rule that ran, in canonical form, e.g. ``"repeat(n=3)"``.
    rule: str
    #: Empty when served as asked; otherwise why a fallback was taken.
    fallback: str
    #: Generation of the service's instance list the pick was made from.
    epoch: int
    #: True when rota could not be reached and the instance came from the last list seen
    #: through ``Watch`` (round robin kept by this process, not rota's shared rotation).
    local_fallback: bool = False

    @property
    def fell_back(self) -> bool:
        """True when the requested version had no instance and an unversioned one was used."""
        return bool(self.fallback)


@dataclass(frozen=True)
class Refusal:
    """Why one instance of an Announce, Update or Withdraw was not applied."""

    instance: InstanceRef
    code: grpc.StatusCode
    message: str


@dataclass(frozen=True)
class Ack:
    """rota's answer to one Announce, Update or Withdraw on a registration stream."""

    lease_id: int
    seq: int
    accepted: tuple[InstanceRef, ...]
    refused: tuple[Refusal, ...]
    #: Seconds without a message after which rota drops the stream.
    heartbeat_timeout: float


@dataclass(frozen=True)
class CallOutcome:
    """The outcome of one call made to a picked instance, for :meth:`RotaClient.report`."""

    service: str
    instance_id: str
    result: CallResult
    latency_us: int = 0
    #: The ticket and rule of the pick the call followed, when it followed one.
    ticket: int = 0
    rule: str = ""

    @classmethod
    def of(cls, picked: PickResult, result: CallResult, latency_us: int) -> CallOutcome:
        """The outcome of a call to ``picked.instance``."""
        return cls(picked.instance.service, picked.instance.ref.id, result, latency_us, picked.ticket, picked.rule)


@dataclass(frozen=True)
class ReportResult:
    """How many reported outcomes rota recorded, and how many named unknown instances."""

    accepted: int
    ignored: int


@dataclass(frozen=True)
class InstanceList:
    """A service's registered instances (every status), sorted by id."""

    instances: tuple[Instance, ...]
    epoch: int

    @property
    def ids(self) -> list[str]:
        return [instance.id for instance in self.instances]


@dataclass(frozen=True)
class ServiceSummary:
    name: str
    instances: int
    up: int
    epoch: int


@dataclass(frozen=True)
class WatchEvent:
    """One event of a service watch.

    ``snapshot`` carries the full list in ``instances``; ``added`` and ``updated`` carry
    ``instance``; ``removed`` carries ``ref``.
    """

    kind: Literal["snapshot", "added", "updated", "removed"]
    epoch: int
    instances: tuple[Instance, ...] = ()
    instance: Instance | None = None
    ref: InstanceRef | None = None
