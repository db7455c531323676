"""``rota.channel("rota:///orders")``: a :class:`grpc.Channel` that routes each call by rota.

grpcio has no pluggable load-balancing policy, so the channel is a :class:`grpc.Channel` of its
own: one plain channel per instance of the service (followed through ``Watch``), and per call the
next ticket of a leased block of rota's shared rotation, mapped to an instance exactly as rota's
rule maps it. Every multicallable kind is offered, so generated stubs and
:func:`grpc.intercept_channel` work unchanged.

- Per call version: the ``x-rota-version`` metadata entry, else the version of the request
  being handled (:func:`rota.use_version`), else the channel's ``version``.
- An instance the channel cannot use (its channel in TRANSIENT_FAILURE, a call to it that could
  not connect in the last second, or held out after 3 timeouts in a row) does not take its
  tickets; each of them goes, with the same ticket, to a usable instance, so that the usable
  ones keep the rule's shares. A unary call that could not connect is sent again on the next
  ticket.
- Outcomes (status, latency) are reported to rota in batches, off the call's path.
- rota unreachable: calls go on over the last known instances by a local rotation.

The routing itself (version, ticket, instance, outcome) is :class:`rota._routing.CallRouting`,
shared with the asyncio channel; this module adapts it to grpcio's synchronous API.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grpc

from ._router import Router
from ._routing import CallRouting, Metadata, is_connect_failure, open_router
from ._tickets import Draw, Member


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
    (``L<n>`` for a local pick); it is off by default because it adds bytes to every call.
    ``options`` and ``credentials`` apply to the instance channels.
    """
    return RotaChannel(open_router(target, server, rule, version), ticket_header, options, credentials)


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
        self._options = list(options or ())
        self._credentials = credentials
        self.routing: CallRouting[grpc.Channel] = CallRouting(router, ticket_header, self._open, lambda ch: ch.close())
        self.instances = self.routing.instances

    def _open(self, member: Member) -> grpc.Channel:
        if self._credentials is not None:
            ch = grpc.secure_channel(member.address, self._credentials, options=self._options)
        else:
            ch = grpc.insecure_channel(member.address, options=self._options)
        ch.subscribe(lambda state: self.instances.set_state(member.id, state), try_to_connect=True)
        return ch

    def subscribe(self, callback: Callable[[grpc.ChannelConnectivity], None], try_to_connect: bool = False) -> None:
        callback(self.routing.connectivity())

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
        self.routing.close()

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
        # The instance channels' multicallables, made once per channel (grpcio's are costly to make).
        self._calls: dict[str, tuple[grpc.Channel, Any]] = {}

    def _route(self, metadata: Metadata | None, timeout: float | None) -> tuple[Draw, Metadata | None]:
        return self._channel.routing.route(metadata, timeout)

    def _inner(self, draw: Draw) -> Any:
        ch = self._channel.routing.channel_for(draw)
        cached = self._calls.get(draw.member.id)
        if cached is not None and cached[0] is ch:
            return cached[1]
        factory = getattr(ch, self._kind)
        call = factory(self._method, request_serializer=self._serializer, response_deserializer=self._deserializer)
        self._calls[draw.member.id] = (ch, call)
        return call

    def _report(
        self, draw: Draw, started: int, code: grpc.StatusCode | None, details: str | None, answered: bool
    ) -> None:
        self._channel.routing.finished(draw, started, code, details, answered)

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
            draw, md = self._route(metadata, left)
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
        draw, md = self._route(metadata, timeout)
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
        draw, md = self._route(metadata, timeout)
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
        draw, md = self._route(metadata, timeout)
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
        draw, md = self._route(metadata, timeout)
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
