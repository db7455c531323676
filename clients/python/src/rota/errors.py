"""Errors raised by the rota client."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from .model import Refusal

#: Codes under which gRPC reports that a call never got an answer from the server.
_UNREACHABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


#: Trailer with which rota marks a pick failure it decided itself (proto: ``Balancer.Pick``).
ERROR_REASON_KEY = "rota-error"


class RotaError(Exception):
    """A rota call failed with a gRPC status.

    ``code`` is the :class:`grpc.StatusCode` (``NOT_FOUND`` for a service that was never
    registered, ``UNAVAILABLE`` when nothing is eligible, ``INVALID_ARGUMENT`` for bad input).
    ``reason`` is rota's stable token for a pick it refused (``no_eligible_instance``,
    ``unknown_service``, ``invalid_rule``, ...), empty when rota did not decide the failure.
    ``unreachable`` is true when rota could not be reached (connection refused or lost,
    deadline exceeded) rather than answering with an error.
    """

    def __init__(self, code: grpc.StatusCode, message: str, *, reason: str = "", unreachable: bool = False) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message
        self.reason = reason
        self.unreachable = unreachable

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code!r}, {self.message!r})"

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> RotaError:
        code = _status_code(error) or grpc.StatusCode.UNKNOWN
        details_method = getattr(error, "details", None)
        details = details_method() if callable(details_method) else None
        return cls(code, details or str(error), reason=error_reason(error), unreachable=is_unreachable(error))


class RegistrationError(RotaError):
    """rota refused instances of an announcement made with ``strict=True``."""

    def __init__(self, refusals: Sequence[Refusal]) -> None:
        first = refusals[0]
        message = "; ".join(f"{r.instance.service}/{r.instance.id or '?'}: {r.message}" for r in refusals)
        super().__init__(first.code, f"rota refused {len(refusals)} instance(s): {message}")
        self.refusals = tuple(refusals)


def error_reason(error: grpc.RpcError) -> str:
    """The ``rota-error`` trailer of a failed call: set when rota itself decided the failure."""
    for accessor in ("trailing_metadata", "initial_metadata"):
        method = getattr(error, accessor, None)
        metadata = method() if callable(method) else None
        for key, value in metadata or ():
            if key == ERROR_REASON_KEY:
                return value.decode() if isinstance(value, bytes) else str(value)
    return ""


def is_unreachable(error: grpc.RpcError) -> bool:
    """True when a failed call never got rota's own answer.

    rota marks every pick failure it decides with the ``rota-error`` trailer; an
    ``UNAVAILABLE`` or ``DEADLINE_EXCEEDED`` without it was made up on the way (connection
    refused or lost, deadline exceeded, a proxy with no rota behind it).
    """
    return _status_code(error) in _UNREACHABLE_CODES and not error_reason(error)


def _status_code(error: grpc.RpcError) -> grpc.StatusCode | None:
    # Both grpc's sync errors (grpc.Call) and grpc.aio's AioRpcError have code(); neither
    # is required by grpc.RpcError itself.
    code = getattr(error, "code", None)
    return code() if callable(code) else None
