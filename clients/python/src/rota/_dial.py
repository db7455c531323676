"""Opening a grpc channel, plain or with credentials, in either grpc flavour."""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

import grpc


def dial(
    flavour: ModuleType,
    target: str,
    credentials: grpc.ChannelCredentials | None,
    options: Sequence[tuple[str, Any]],
    **extra: Any,
) -> Any:
    """``flavour.secure_channel`` with ``credentials``, else ``flavour.insecure_channel``.

    ``flavour`` is :mod:`grpc` or :mod:`grpc.aio`; ``extra`` goes to both (grpc.aio's
    ``interceptors``).
    """
    if credentials is not None:
        return flavour.secure_channel(target, credentials, options=list(options), **extra)
    return flavour.insecure_channel(target, options=list(options), **extra)
