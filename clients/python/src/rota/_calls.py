"""What the clients do around their unary calls to rota and around a timed call to an instance.

A :class:`UnaryCall` is one call to rota as both clients make it: which stub and method, the
request, what the answer becomes and what a grpc error becomes (a :class:`~rota.errors.RotaError`
raised, unless the call says otherwise: a pick may fall back), or an answer at hand without a
call. :func:`rota_errors` turns grpc's errors into :class:`~rota.errors.RotaError` around other
calls; :class:`TimedCall` measures a call made to a picked instance and says which outcome to
report for it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, NoReturn, TypeVar

import grpc

from . import _convert as convert
from ._convert import pb
from ._picking import PickAttempt
from .errors import RotaError
from .model import CallOutcome, CallResult, InstanceList, PickResult, ReportResult, ServiceSummary

log = logging.getLogger("rota")

T = TypeVar("T")

#: The stubs a unary call goes through.
BALANCER = "Balancer"
REGISTRY = "Registry"


def raise_rota_error(rpc_error: grpc.RpcError) -> NoReturn:
    """What a failed call to rota does unless told otherwise: raise it as :class:`RotaError`."""
    raise RotaError.from_rpc_error(rpc_error) from None


@dataclass(frozen=True)
class UnaryCall(Generic[T]):
    """One unary call to rota, less its I/O; the shell sends ``request`` with ``stub.method``."""

    stub: str
    method: str
    request: Any
    #: The result of rota's answer.
    answered: Callable[[Any], T]
    #: The result (or the error raised) when the call failed.
    failed: Callable[[grpc.RpcError], T] = raise_rota_error
    #: The result without a call, when it is at hand.
    local: T | None = None


def pick_call(attempt: PickAttempt) -> UnaryCall[PickResult]:
    return UnaryCall(BALANCER, "Pick", attempt.request, attempt.answered, attempt.failed, attempt.local)


def report_call(outcomes: Iterable[CallOutcome]) -> UnaryCall[ReportResult]:
    return UnaryCall(BALANCER, "Report", convert.report_request(outcomes), convert.report_result)


def list_services_call() -> UnaryCall[list[ServiceSummary]]:
    return UnaryCall(REGISTRY, "ListServices", pb.ListServicesRequest(), convert.service_summaries)


def list_instances_call(service: str) -> UnaryCall[InstanceList]:
    return UnaryCall(REGISTRY, "ListInstances", pb.ListInstancesRequest(service=service), convert.instance_list)


@contextmanager
def rota_errors() -> Iterator[None]:
    """Raises a :class:`grpc.RpcError` of the block as :class:`RotaError` (without the grpc one as context)."""
    try:
        yield
    except grpc.RpcError as rpc_error:
        raise_rota_error(rpc_error)


def client_closed() -> RuntimeError:
    """The error of a call on a closed client."""
    return RuntimeError("the client is closed")


def failure_result(error: BaseException) -> CallResult:
    """The outcome of a timed call that raised ``error``: ``ConnectionError`` never reached the instance."""
    return CallResult.CONNECT_FAILURE if isinstance(error, ConnectionError) else CallResult.ERROR


class TimedCall:
    """One call made to a picked instance, timed from its creation.

    :meth:`outcome` is what to report once the call ended, or ``None`` for an instance picked
    locally (rota is unreachable; the outcome has nowhere to go).
    """

    def __init__(self, picked: PickResult, started_ns: int | None = None) -> None:
        self.picked = picked
        self.started_ns = time.perf_counter_ns() if started_ns is None else started_ns

    def outcome(self, result: CallResult, ended_ns: int | None = None) -> CallOutcome | None:
        if self.picked.local_fallback:
            return None
        ended = time.perf_counter_ns() if ended_ns is None else ended_ns
        return CallOutcome.of(self.picked, result, (ended - self.started_ns) // 1000)

    def failed(self, error: BaseException) -> CallOutcome | None:
        """The outcome of the call that raised ``error``."""
        return self.outcome(failure_result(error))


def report_failed(error: RotaError) -> None:
    """Logs an outcome that could not be reported: a report must never fail the call it reports."""
    log.info("could not report a call outcome to rota: %s", error)
