"""What a rota channel does around each call, shared by ``rota.channel`` and ``rota.aio.channel``.

:class:`CallRouting` ties a :class:`~rota._router.Router` (watch, leases, outcome reports) to the
per-instance channels of one rota channel: it chooses a call's version (its ``x-rota-version``
metadata, else the version of the request being handled, else the channel's), draws the call's
ticket and instance, adds ``x-rota-ticket`` when asked, and reports the call's outcome once when
it ends (an :class:`Attempt` per call sent). Whether a failed call goes again on
the next ticket is :func:`retries_on_next_ticket`, within the call's :class:`Deadline`. The two
channel modules only adapt this to their grpc flavour.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import grpc

from ._pb import rota_pb2 as pb
from ._rota_connection import PathArg, rota_connection
from ._router import TICKET_HEADER, VERSION_HEADER, NoInstance, Router, parse_target
from ._tickets import ANSWERED, NEUTRAL, TIMED_OUT, TIMEOUTS_TO_HOLD, Draw, Holds, Member, Refused
from .version import current_version

log = logging.getLogger("rota.channel")

#: How long a call waits for the rotation's first lease or a usable instance when it has no timeout.
DEFAULT_ROUTE_TIMEOUT = 10.0

Metadata = Sequence[tuple[str, str | bytes]]

#: The channel type of one instance: grpc.Channel or grpc.aio.Channel.
C = TypeVar("C")


def open_router(
    target: str,
    server: str | None,
    rule: str | None,
    version: str | None,
    *,
    token: str | None = None,
    tls_ca: PathArg | None = None,
    tls_cert: PathArg | None = None,
    tls_key: PathArg | None = None,
) -> Router:
    """The router of ``rota:///SERVICE`` (or ``rota://ROTA_HOST:PORT/SERVICE?rule=..&version=..``),
    reaching rota with the token and TLS of :func:`rota._rota_connection.rota_connection`."""
    service, rota_server, chosen_rule, chosen_version = parse_target(target, server, rule, version)
    connection = rota_connection(rota_server, token=token, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key)
    return Router(service, connection, chosen_rule, chosen_version)


def version_of(metadata: Metadata | None) -> str | None:
    """The call's ``x-rota-version`` entry, else the version of the request being handled
    (:func:`rota.use_version`), else None (the channel's version)."""
    for key, value in metadata or ():
        if key.lower() == VERSION_HEADER:
            return value.decode() if isinstance(value, bytes) else value
    return current_version()


def ticket_value(draw: Draw) -> str:
    """A draw's ``x-rota-ticket``: the leased ticket, or ``L`` and the local counter."""
    return f"L{draw.ticket}" if draw.local else str(draw.ticket)


def with_ticket(metadata: Metadata | None, draw: Draw, enabled: bool) -> Metadata | None:
    if not enabled:
        return metadata
    return [*(m for m in metadata or () if m[0].lower() != TICKET_HEADER), (TICKET_HEADER, ticket_value(draw))]


def result_of(code: grpc.StatusCode | None, details: str | None, answered: bool) -> pb.CallResult:
    if code is None or code == grpc.StatusCode.OK:
        return pb.CALL_RESULT_OK
    if is_connect_failure(code, details) and not answered:
        return pb.CALL_RESULT_CONNECT_FAILURE
    return pb.CALL_RESULT_ERROR


def health_of(code: grpc.StatusCode | None, result: pb.CallResult) -> str:
    """What a finished call says of its instance (:class:`~rota._tickets.Holds`): a timeout, an
    answer (success or any error the server sent), or nothing (cancelled, never connected)."""
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return TIMED_OUT
    if code == grpc.StatusCode.CANCELLED or result == pb.CALL_RESULT_CONNECT_FAILURE:
        return NEUTRAL
    return ANSWERED


def is_connect_failure(code: grpc.StatusCode | None, details: str | None) -> bool:
    """A call that never reached its instance (grpc core's wording for a refused or failed connect)."""
    text = (details or "").lower()
    return code == grpc.StatusCode.UNAVAILABLE and ("failed to connect" in text or "connection refused" in text)


#: grpc connectivity states in which an instance's channel takes no call.
FAILING_STATES = frozenset({grpc.ChannelConnectivity.TRANSIENT_FAILURE, grpc.ChannelConnectivity.SHUTDOWN})


class Deadline:
    """The end of a call that may be sent more than once: ``timeout`` seconds from now (None: none)."""

    def __init__(self, timeout: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.at = None if timeout is None else clock() + timeout

    def left(self) -> float | None:
        """Seconds left for the next attempt (never below 0), or None without a deadline."""
        return None if self.at is None else max(self.at - self._clock(), 0.0)

    def passed(self) -> bool:
        return self.at is not None and self._clock() >= self.at


def retries_on_next_ticket(kind: str, code: grpc.StatusCode | None, details: str | None, deadline: Deadline) -> bool:
    """Whether a failed call is sent again on the next ticket: a unary-unary call that never
    reached its instance, while its deadline has not passed."""
    return kind == "unary_unary" and is_connect_failure(code, details) and not deadline.passed()


class Attempt:
    """One call sent to an instance. Its outcome is reported once, by whichever sees it first (a
    unary call's own result, at once, so that the next call is routed knowing it; or a done callback)."""

    __slots__ = ("draw", "reported", "started")

    def __init__(self, draw: Draw, started_ns: int) -> None:
        self.draw = draw
        self.started = started_ns
        self.reported = False


class RoutingError(grpc.RpcError, grpc.Call):
    """A call the channel could not route (rota refused, or no instance is usable)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def initial_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return ()

    def trailing_metadata(self) -> Any:
        return ()

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> float:
        return 0.0

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback: Callable[[], None]) -> bool:
        return False


def routing_error(error: Exception) -> RoutingError:
    if isinstance(error, Refused) and isinstance(error.code, grpc.StatusCode):
        return RoutingError(error.code, error.details)
    return RoutingError(grpc.StatusCode.UNAVAILABLE, str(error))


class Instances(Generic[C]):
    """The per-instance channels of a rota channel and whether each is usable; ``factory`` makes one.

    An instance is unusable while its channel is in TRANSIENT_FAILURE (or shut down), and while
    ``holds`` holds it out: for a second after a call to it could not connect, and after
    timeouts in a row (:class:`~rota._tickets.Holds`).
    """

    def __init__(self, factory: Callable[[Member], C], close: Callable[[C], None], holds: Holds | None = None) -> None:
        self._factory = factory
        self._close = close
        self._lock = threading.Lock()
        self._channels: dict[str, tuple[Member, C]] = {}
        self.holds = holds or Holds()
        self._states: dict[str, grpc.ChannelConnectivity] = {}
        self._known: set[str] = set()

    def update(self, members: dict[str, Member]) -> None:
        gone = []
        with self._lock:
            for id_, (member, ch) in list(self._channels.items()):
                if members.get(id_) != member:
                    gone.append(ch)
                    del self._channels[id_]
                    self._states.pop(id_, None)
            self._known = set(members)
        self.holds.forget(members.__contains__)
        for ch in gone:
            self._close(ch)

    def get(self, member: Member) -> C:
        with self._lock:
            entry = self._channels.get(member.id)
            if entry is None:
                entry = (member, self._factory(member))
                self._channels[member.id] = entry
            return entry[1]

    def peek(self, member_id: str) -> C | None:
        """The instance's channel if one is open, else None."""
        entry = self._channels.get(member_id)
        return None if entry is None else entry[1]

    def set_state(self, member_id: str, state: grpc.ChannelConnectivity) -> None:
        self._states[member_id] = state
        if state == grpc.ChannelConnectivity.READY:
            self.holds.connected(member_id)

    def failed(self, member_id: str) -> None:
        self.holds.refused(member_id)

    def usable(self, member_id: str) -> bool:
        if member_id not in self._known or not self.holds.usable(member_id):
            return False
        return self._states.get(member_id) not in FAILING_STATES

    def close(self) -> None:
        with self._lock:
            channels = [ch for _, ch in self._channels.values()]
            self._channels.clear()
        for ch in channels:
            self._close(ch)


class CallRouting(Generic[C]):
    """Routes the calls of one rota channel over its instance channels (of type ``C``).

    ``usable`` says whether an instance may take a call now (default: it is not held out and its
    channel is not failing, as told by :meth:`Instances.set_state`). A channel that polls the
    state of its instance channels instead of subscribing to it (the asyncio one) passes
    ``state_of``, which reads an instance channel's state.
    """

    def __init__(
        self,
        router: Router,
        ticket_header: bool,
        factory: Callable[[Member], C],
        close: Callable[[C], None],
        usable: Callable[[str], bool] | None = None,
        *,
        state_of: Callable[[C], grpc.ChannelConnectivity] | None = None,
    ) -> None:
        self.router = router
        self.ticket_header = ticket_header
        self.instances: Instances[C] = Instances(factory, close)
        self._state_of = state_of
        self.usable = usable or (self._polled_usable if state_of is not None else self.instances.usable)
        # The router's leases name the instances this channel cannot use in their ``exclude``.
        router.usable = self.usable
        router.on_members(self.instances.update)

    def _polled_usable(self, member_id: str) -> bool:
        if not self.instances.usable(member_id):
            return False
        ch = self.instances.peek(member_id)
        return ch is None or self._state_of is None or self._state_of(ch) not in FAILING_STATES

    def try_route(self, metadata: Metadata | None) -> tuple[Draw, Metadata | None] | None:
        """A draw for the call if one is at hand without waiting (a lease held, an instance usable)."""
        if not self.router.has_members():
            return None
        decision = self.router.draw(self.router.rotation(version_of(metadata)), self.usable)
        if isinstance(decision, Draw):
            return decision, with_ticket(metadata, decision, self.ticket_header)
        return None  # waiting for a lease, none usable, or refused: route() waits or says why

    def route(self, metadata: Metadata | None, timeout: float | None) -> tuple[Draw, Metadata | None]:
        """A draw for the call and its metadata, waiting (at most ``timeout``) for a first lease."""
        routed = self.try_route(metadata)
        if routed is not None:
            return routed
        bound = timeout or DEFAULT_ROUTE_TIMEOUT
        try:
            self.router.wait_synced(bound)
            draw = self.router.route(version_of(metadata), self.usable, bound)
        except (NoInstance, Refused) as error:
            raise routing_error(error) from None
        return draw, with_ticket(metadata, draw, self.ticket_header)

    def channel_for(self, draw: Draw) -> C:
        return self.instances.get(draw.member)

    def start(self, draw: Draw) -> Attempt:
        """The call routed by ``draw`` is being sent now."""
        return Attempt(draw, time.monotonic_ns())

    def finish(
        self, attempt: Attempt, code: grpc.StatusCode | None, details: str | None, answered: bool = False
    ) -> pb.CallResult | None:
        """Reports how ``attempt`` ended (see :meth:`finished`), unless it was reported already."""
        if attempt.reported:
            return None
        attempt.reported = True
        return self.finished(attempt.draw, attempt.started, code, details, answered)

    def finished(
        self, draw: Draw, started_ns: int, code: grpc.StatusCode | None, details: str | None, answered: bool
    ) -> pb.CallResult:
        """Reports a call's outcome (it never blocks); an instance it could not reach, or that let
        calls time out in a row, is held out for a while."""
        result = result_of(code, details, answered)
        if result == pb.CALL_RESULT_CONNECT_FAILURE:
            self.instances.failed(draw.member.id)
        hold = self.instances.holds.finished(draw.member.id, health_of(code, result), started_ns / 1e9)
        if hold is not None:
            log.warning(
                "%s: %d calls in a row to %s timed out; sending it nothing for %.0f s",
                self.router.service,
                TIMEOUTS_TO_HOLD,
                draw.member.id,
                hold,
            )
        self.router.report(draw, time.monotonic_ns() - started_ns, result)
        return result

    def connectivity(self) -> grpc.ChannelConnectivity:
        return grpc.ChannelConnectivity.READY if self.router.has_members() else grpc.ChannelConnectivity.CONNECTING

    def close(self) -> None:
        self.instances.close()
        self.router.close()
