"""``rota.channel("rota:///orders")``: a :class:`grpc.Channel` that routes each call by rota.

grpcio has no pluggable load-balancing policy, so the channel is a :class:`grpc.Channel` of its
own: one plain channel per instance of the service (followed through ``Watch``), and per call the
next ticket of a leased block of rota's shared rotation, mapped to an instance exactly as rota's
rule maps it. Every multicallable kind is offered, so generated stubs and
:func:`grpc.intercept_channel` work unchanged.

- Per call version: the ``x-rota-version`` metadata entry, else the version of the request
  being handled (:func:`rota.use_version`), else the channel's ``version``.
- An instance whose connection failed (its channel in TRANSIENT_FAILURE, or a call that could
  not connect) is skipped the way ``exclude`` skips it: the next ticket over the other instances.
  A unary call that could not connect is sent again on the next ticket.
- Outcomes (status, latency) are reported to rota in batches.
- rota unreachable: calls go on over the last known instances by a local rotation.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grpc

from ._pb import rota_pb2 as pb
from ._router import TICKET_HEADER, VERSION_HEADER, NoInstance, Router, parse_target
from ._tickets import Draw, Member, Refused
from .version import current_version

#: How long a call waits for the rotation's first lease or a usable instance when it has no timeout.
DEFAULT_ROUTE_TIMEOUT = 10.0
#: How long an instance that refused a connection is skipped before it is tried again.
FAILED_HOLD = 1.0

Metadata = Sequence[tuple[str, str | bytes]]


def channel(
    target: str,
    *,
    server: str | None = None,
    rule: str | None = None,
    version: str | None = None,
    ticket_header: bool = False,
    options: Sequence[tuple[str, Any]] | None = None,
    credentials: grpc.ChannelCredentials | None = None,
) -> RotaChannel:
    """A channel for ``rota:///SERVICE`` (or ``rota://ROTA_HOST:PORT/SERVICE?rule=..&version=..``).

    ``server`` is rota's ``host:port`` (else the target's authority, ``ROTA_SERVER``,
    ``127.0.0.1:50051``); ``rule`` a leasable rule (``round_robin``, ``repeat(n=N)``,
    ``weighted``; default: the service's policy rule); ``version`` the version of calls without
    an ``x-rota-version`` entry. ``ticket_header`` adds each call's ticket as ``x-rota-ticket``
    (``L<n>`` for a local pick). ``options`` and ``credentials`` apply to the instance channels.
    """
    service, rota_server, chosen_rule, chosen_version = parse_target(target, server, rule, version)
    return RotaChannel(Router(service, rota_server, chosen_rule, chosen_version), ticket_header, options, credentials)


def version_of(metadata: Metadata | None) -> str | None:
    """The call's ``x-rota-version`` entry, else the version of the request being handled
    (:func:`rota.use_version`), else None (the channel's version)."""
    for key, value in metadata or ():
        if key.lower() == VERSION_HEADER:
            return value.decode() if isinstance(value, bytes) else value
    return current_version()


def with_ticket(metadata: Metadata | None, draw: Draw, enabled: bool) -> Metadata | None:
    if not enabled:
        return metadata
    ticket = f"L{draw.ticket}" if draw.local else str(draw.ticket)
    return [*(m for m in metadata or () if m[0].lower() != TICKET_HEADER), (TICKET_HEADER, ticket)]


def result_of(code: grpc.StatusCode | None, details: str | None, answered: bool) -> pb.CallResult:
    if code is None or code == grpc.StatusCode.OK:
        return pb.CALL_RESULT_OK
    if is_connect_failure(code, details) and not answered:
        return pb.CALL_RESULT_CONNECT_FAILURE
    return pb.CALL_RESULT_ERROR


def is_connect_failure(code: grpc.StatusCode | None, details: str | None) -> bool:
    """A call that never reached its instance (grpc core's wording for a refused or failed connect)."""
    text = (details or "").lower()
    return code == grpc.StatusCode.UNAVAILABLE and ("failed to connect" in text or "connection refused" in text)


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


class Instances:
    """The per-instance channels of a rota channel and whether each is usable; ``factory`` makes one."""

    def __init__(self, factory: Callable[[Member], Any], close: Callable[[Any], None]) -> None:
        self._factory = factory
        self._close = close
        self._lock = threading.Lock()
        self._channels: dict[str, tuple[Member, Any]] = {}
        self._failed_until: dict[str, float] = {}
        self._states: dict[str, grpc.ChannelConnectivity] = {}

    def update(self, members: dict[str, Member]) -> None:
        gone = []
        with self._lock:
            for id_, (member, ch) in list(self._channels.items()):
                if members.get(id_) != member:
                    gone.append(ch)
                    del self._channels[id_]
                    self._states.pop(id_, None)
            self.known = set(members)
        for ch in gone:
            self._close(ch)

    def get(self, member: Member) -> Any:
        with self._lock:
            entry = self._channels.get(member.id)
            if entry is None:
                entry = (member, self._factory(member))
                self._channels[member.id] = entry
            return entry[1]

    def peek(self, member_id: str) -> Any:
        """The instance's channel if one is open, else None."""
        entry = self._channels.get(member_id)
        return None if entry is None else entry[1]

    def set_state(self, member_id: str, state: grpc.ChannelConnectivity) -> None:
        self._states[member_id] = state
        if state == grpc.ChannelConnectivity.READY:
            self._failed_until.pop(member_id, None)

    def failed(self, member_id: str) -> None:
        self._failed_until[member_id] = time.monotonic() + FAILED_HOLD

    def usable(self, member_id: str) -> bool:
        if member_id not in getattr(self, "known", ()):
            return False
        until = self._failed_until.get(member_id)
        if until is not None and time.monotonic() < until:
            return False
        return self._states.get(member_id) not in (
            grpc.ChannelConnectivity.TRANSIENT_FAILURE,
            grpc.ChannelConnectivity.SHUTDOWN,
        )

    def close(self) -> None:
        with self._lock:
            channels = [ch for _, ch in self._channels.values()]
            self._channels.clear()
        for ch in channels:
            self._close(ch)


class RotaChannel(grpc.Channel):
    """A :class:`grpc.Channel` whose calls are routed by rota; see :func:`channel`."""

    def __init__(
        self,
        router: Router,
        ticket_header: bool,
        options: Sequence[tuple[str, Any]] | None,
        credentials: grpc.ChannelCredentials | None,
    ) -> None:
        self.router = router
        self._ticket_header = ticket_header
        self._options = list(options or ())
        self._credentials = credentials
        self.instances = Instances(self._open, lambda ch: ch.close())
        router.on_members(self.instances.update)

    def _open(self, member: Member) -> grpc.Channel:
        if self._credentials is not None:
            ch = grpc.secure_channel(member.address, self._credentials, options=self._options)
        else:
            ch = grpc.insecure_channel(member.address, options=self._options)
        ch.subscribe(lambda state: self.instances.set_state(member.id, state), try_to_connect=True)
        return ch

    def route(self, metadata: Metadata | None, timeout: float | None) -> tuple[Draw, Metadata | None]:
        try:
            self.router.wait_synced(timeout or DEFAULT_ROUTE_TIMEOUT)
            draw = self.router.route(version_of(metadata), self.instances.usable, timeout or DEFAULT_ROUTE_TIMEOUT)
        except (NoInstance, Refused) as error:
            raise routing_error(error) from None
        return draw, with_ticket(metadata, draw, self._ticket_header)

    def instance_channel(self, draw: Draw) -> grpc.Channel:
        channel: grpc.Channel = self.instances.get(draw.member)
        return channel

    def subscribe(self, callback: Callable[[grpc.ChannelConnectivity], None], try_to_connect: bool = False) -> None:
        callback(grpc.ChannelConnectivity.READY if self.router.members() else grpc.ChannelConnectivity.CONNECTING)

    def unsubscribe(self, callback: Callable[[grpc.ChannelConnectivity], None]) -> None:
        pass

    def unary_unary(
        self,
        method: str,
        request_serializer: Any = None,
        response_deserializer: Any = None,
        _registered_method: bool | None = False,
    ) -> grpc.UnaryUnaryMultiCallable[Any, Any]:
        return _UnaryUnary(self, method, request_serializer, response_deserializer)

    def unary_stream(
        self,
        method: str,
        request_serializer: Any = None,
        response_deserializer: Any = None,
        _registered_method: bool | None = False,
    ) -> grpc.UnaryStreamMultiCallable[Any, Any]:
        return _Streaming(self, "unary_stream", method, request_serializer, response_deserializer)

    def stream_unary(
        self,
        method: str,
        request_serializer: Any = None,
        response_deserializer: Any = None,
        _registered_method: bool | None = False,
    ) -> grpc.StreamUnaryMultiCallable[Any, Any]:
        return _StreamUnary(self, method, request_serializer, response_deserializer)

    def stream_stream(
        self,
        method: str,
        request_serializer: Any = None,
        response_deserializer: Any = None,
        _registered_method: bool | None = False,
    ) -> grpc.StreamStreamMultiCallable[Any, Any]:
        return _Streaming(self, "stream_stream", method, request_serializer, response_deserializer)

    def close(self) -> None:
        self.instances.close()
        self.router.close()

    def __enter__(self) -> RotaChannel:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class _Callable:
    def __init__(self, channel: RotaChannel, kind: str, method: str, serializer: Any, deserializer: Any) -> None:
        self._channel = channel
        self._kind = kind
        self._method = method
        self._serializer = serializer
        self._deserializer = deserializer

    def _inner(self, draw: Draw) -> Any:
        ch = self._channel.instance_channel(draw)
        factory = getattr(ch, self._kind)
        return factory(self._method, request_serializer=self._serializer, response_deserializer=self._deserializer)

    def _report(
        self, draw: Draw, started: int, code: grpc.StatusCode | None, details: str | None, answered: bool
    ) -> None:
        result = result_of(code, details, answered)
        if result == pb.CALL_RESULT_CONNECT_FAILURE:
            self._channel.instances.failed(draw.member.id)
        self._channel.router.report(draw, time.monotonic_ns() - started, result)

    def _track(self, draw: Draw, started: int, call: Any) -> Any:
        def done(_: object = None) -> None:
            self._report(draw, started, call.code(), call.details(), False)

        call.add_done_callback(done) if hasattr(call, "add_done_callback") else call.add_callback(done)
        return call


class _UnaryUnary(_Callable, grpc.UnaryUnaryMultiCallable):  # type: ignore[type-arg]
    def __init__(self, channel: RotaChannel, method: str, serializer: Any, deserializer: Any) -> None:
        super().__init__(channel, "unary_unary", method, serializer, deserializer)

    def __call__(
        self,
        request: Any,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        credentials: Any = None,
        wait_for_ready: bool | None = None,
        compression: Any = None,
    ) -> Any:
        response, _ = self.with_call(request, timeout, metadata, credentials, wait_for_ready, compression)
        return response

    def with_call(
        self,
        request: Any,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        credentials: Any = None,
        wait_for_ready: bool | None = None,
        compression: Any = None,
    ) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            draw, md = self._channel.route(metadata, left)
            started = time.monotonic_ns()
            try:
                result = self._inner(draw).with_call(
                    request,
                    timeout=left,
                    metadata=md,
                    credentials=credentials,
                    wait_for_ready=wait_for_ready,
                    compression=compression,
                )
            except grpc.RpcError as error:
                code, details = error.code(), error.details()
                self._report(draw, started, code, details, False)
                if is_connect_failure(code, details) and (deadline is None or time.monotonic() < deadline):
                    continue  # never reached the instance: the next ticket
                raise
            self._report(draw, started, grpc.StatusCode.OK, None, True)
            return result

    def future(
        self,
        request: Any,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        credentials: Any = None,
        wait_for_ready: bool | None = None,
        compression: Any = None,
    ) -> Any:
        draw, md = self._channel.route(metadata, timeout)
        started = time.monotonic_ns()
        call = self._inner(draw).future(
            request,
            timeout=timeout,
            metadata=md,
            credentials=credentials,
            wait_for_ready=wait_for_ready,
            compression=compression,
        )
        return self._track(draw, started, call)


class _StreamUnary(_Callable, grpc.StreamUnaryMultiCallable):  # type: ignore[type-arg]
    def __init__(self, channel: RotaChannel, method: str, serializer: Any, deserializer: Any) -> None:
        super().__init__(channel, "stream_unary", method, serializer, deserializer)

    def __call__(
        self,
        request_iterator: Iterator[Any],
        timeout: float | None = None,
        metadata: Metadata | None = None,
        credentials: Any = None,
        wait_for_ready: bool | None = None,
        compression: Any = None,
    ) -> Any:
        response, _ = self.with_call(request_iterator, timeout, metadata, credentials, wait_for_ready, compression)
        return response

    def with_call(
        self,
        request_iterator: Iterator[Any],
        timeout: float | None = None,
        metadata: Metadata | None = None,
        credentials: Any = None,
        wait_for_ready: bool | None = None,
        compression: Any = None,
    ) -> Any:
        draw, md = self._channel.route(metadata, timeout)
        started = time.monotonic_ns()
        try:
            result = self._inner(draw).with_call(
                request_iterator,
                timeout=timeout,
                metadata=md,
                credentials=credentials,
                wait_for_ready=wait_for_ready,
                compression=compression,
            )
        except grpc.RpcError as error:
            self._report(draw, started, error.code(), error.details(), False)
            raise
        self._report(draw, started, grpc.StatusCode.OK, None, True)
        return result

    def future(
        self,
        request_iterator: Iterator[Any],
        timeout: float | None = None,
        metadata: Metadata | None = None,
        credentials: Any = None,
        wait_for_ready: bool | None = None,
        compression: Any = None,
    ) -> Any:
        draw, md = self._channel.route(metadata, timeout)
        started = time.monotonic_ns()
        call = self._inner(draw).future(
            request_iterator,
            timeout=timeout,
            metadata=md,
            credentials=credentials,
            wait_for_ready=wait_for_ready,
            compression=compression,
        )
        return self._track(draw, started, call)


class _Streaming(_Callable, grpc.UnaryStreamMultiCallable, grpc.StreamStreamMultiCallable):  # type: ignore[type-arg]
    """unary-stream and stream-stream: the call object of the instance channel, its outcome reported when done."""

    def __call__(
        self,
        request: Any,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        credentials: Any = None,
        wait_for_ready: bool | None = None,
        compression: Any = None,
    ) -> Any:
        draw, md = self._channel.route(metadata, timeout)
        started = time.monotonic_ns()
        call = self._inner(draw)(
            request,
            timeout=timeout,
            metadata=md,
            credentials=credentials,
            wait_for_ready=wait_for_ready,
            compression=compression,
        )
        return self._track(draw, started, call)
