"""``rota.aio.channel("rota:///orders")``: the asyncio counterpart of :func:`rota.channel`.

It behaves like a :class:`grpc.aio.Channel` (the four multicallable kinds, ``async with``,
``close()``), with one :func:`grpc.aio.insecure_channel` (or secure) per instance; ``interceptors``
go to every instance channel, as grpc.aio takes interceptors at channel creation. Routing,
leases, outcome reports and the local rotation during outages are those of the sync channel:
both use :class:`rota._routing.CallRouting`; only waiting for a first lease runs in a thread here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Generator, Sequence
from typing import Any

import grpc
import grpc.aio

from ._pb import rota_pb2 as pb
from ._router import Router
from ._routing import DEFAULT_ROUTE_TIMEOUT, CallRouting, Metadata, open_router, result_of
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
    interceptors: Sequence[grpc.aio.ClientInterceptor] | None = None,
) -> AsyncRotaChannel:
    """An asyncio channel for ``rota:///SERVICE``; the arguments are those of :func:`rota.channel`."""
    router = open_router(target, server, rule, version)
    return AsyncRotaChannel(router, ticket_header, options, credentials, interceptors)


class AsyncRotaChannel:
    """A :class:`grpc.aio.Channel`-like channel whose calls are routed by rota."""

    def __init__(
        self,
        router: Router,
        ticket_header: bool,
        options: Sequence[tuple[str, Any]] | None,
        credentials: grpc.ChannelCredentials | None,
        interceptors: Sequence[grpc.aio.ClientInterceptor] | None,
    ) -> None:
        self.router = router
        self._options = list(options or ())
        self._credentials = credentials
        self._interceptors = list(interceptors or ())
        self._closing: list[grpc.aio.Channel] = []
        self.routing: CallRouting[grpc.aio.Channel] = CallRouting(
            router, ticket_header, self._open, self._closing.append, self._usable
        )
        self.instances = self.routing.instances

    def _open(self, member: Member) -> grpc.aio.Channel:
        if self._credentials is not None:
            return grpc.aio.secure_channel(
                member.address, self._credentials, options=self._options, interceptors=self._interceptors
            )
        return grpc.aio.insecure_channel(member.address, options=self._options, interceptors=self._interceptors)

    def _usable(self, member_id: str) -> bool:
        if not self.instances.usable(member_id):
            return False
        ch = self.instances.peek(member_id)
        return ch is None or ch.get_state() not in (
            grpc.ChannelConnectivity.TRANSIENT_FAILURE,
            grpc.ChannelConnectivity.SHUTDOWN,
        )

    async def route(self, metadata: Metadata | None, timeout: float | None) -> tuple[Draw, Metadata | None]:
        await self._close_gone()
        # A held lease answers at once; waiting for one (or for the instance list) runs in a thread.
        routed = self.routing.try_route(metadata)
        if routed is not None:
            return routed
        return await asyncio.to_thread(self.routing.route, metadata, timeout)

    async def _close_gone(self) -> None:
        while self._closing:
            await self._closing.pop().close()

    def unary_unary(
        self,
        method: str,
        request_serializer: Any = None,
        response_deserializer: Any = None,
        _registered_method: bool | None = False,
    ) -> _Callable:
        return _Callable(self, "unary_unary", method, request_serializer, response_deserializer)

    def unary_stream(
        self,
        method: str,
        request_serializer: Any = None,
        response_deserializer: Any = None,
        _registered_method: bool | None = False,
    ) -> _Callable:
        return _Callable(self, "unary_stream", method, request_serializer, response_deserializer)

    def stream_unary(
        self,
        method: str,
        request_serializer: Any = None,
        response_deserializer: Any = None,
        _registered_method: bool | None = False,
    ) -> _Callable:
        return _Callable(self, "stream_unary", method, request_serializer, response_deserializer)

    def stream_stream(
        self,
        method: str,
        request_serializer: Any = None,
        response_deserializer: Any = None,
        _registered_method: bool | None = False,
    ) -> _Callable:
        return _Callable(self, "stream_stream", method, request_serializer, response_deserializer)

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        return self.routing.connectivity()

    async def channel_ready(self) -> None:
        await asyncio.to_thread(self.router.wait_synced, DEFAULT_ROUTE_TIMEOUT)

    async def close(self, grace: float | None = None) -> None:
        self.instances.close()
        await self._close_gone()
        await asyncio.to_thread(self.router.close)

    async def __aenter__(self) -> AsyncRotaChannel:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class _Callable:
    def __init__(self, channel: AsyncRotaChannel, kind: str, method: str, serializer: Any, deserializer: Any) -> None:
        self._channel = channel
        self._kind = kind
        self._method = method
        self._serializer = serializer
        self._deserializer = deserializer
        # The instance channels' multicallables, made once per channel.
        self._calls: dict[str, tuple[grpc.aio.Channel, Any]] = {}

    def __call__(
        self,
        request: Any = None,
        *,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        credentials: Any = None,
        wait_for_ready: bool | None = None,
        compression: Any = None,
    ) -> _Call:
        kwargs = {
            "timeout": timeout,
            "credentials": credentials,
            "wait_for_ready": wait_for_ready,
            "compression": compression,
        }
        return _Call(self, request, metadata, kwargs)

    def start(self, draw: Draw, request: Any, metadata: Metadata | None, kwargs: dict[str, Any]) -> Any:
        ch = self._channel.routing.channel_for(draw)
        cached = self._calls.get(draw.member.id)
        if cached is not None and cached[0] is ch:
            factory = cached[1]
        else:
            factory = getattr(ch, self._kind)(
                self._method, request_serializer=self._serializer, response_deserializer=self._deserializer
            )
            self._calls[draw.member.id] = (ch, factory)
        if request is None and self._kind.startswith("stream"):
            return factory(metadata=metadata, **kwargs)
        return factory(request, metadata=metadata, **kwargs)

    def report(self, attempt: _Attempt, code: grpc.StatusCode | None, details: str | None) -> None:
        if not attempt.reported:
            attempt.reported = True
            self._channel.routing.finished(attempt.draw, attempt.started, code, details, False)


class _Attempt:
    """One call sent to an instance; its outcome is reported once, by whichever sees it first:
    a unary call's own await (at once, so the next call is routed knowing it) or the done callback."""

    __slots__ = ("draw", "reported", "started")

    def __init__(self, draw: Draw, started: int) -> None:
        self.draw = draw
        self.started = started
        self.reported = False


class _Call:
    """An aio call routed on first use: awaitable (unary responses), async-iterable (streams), with
    ``read``, ``write``, ``done_writing``, ``code``, ``details`` and ``cancel`` of the call below."""

    def __init__(self, callable_: _Callable, request: Any, metadata: Metadata | None, kwargs: dict[str, Any]) -> None:
        self._callable = callable_
        self._request = request
        self._metadata = metadata
        self._kwargs = kwargs
        self._call: Any = None
        self._attempt: _Attempt | None = None
        self._lock = asyncio.Lock()

    async def _ensure(self) -> Any:
        async with self._lock:
            if self._call is None:
                draw, md = await self._callable._channel.route(self._metadata, self._kwargs["timeout"])
                attempt = self._attempt = _Attempt(draw, time.monotonic_ns())
                self._call = self._callable.start(draw, self._request, md, self._kwargs)
                self._call.add_done_callback(lambda c: _spawn(self._report(c, attempt)))
            return self._call

    async def _report(self, call: Any, attempt: _Attempt) -> None:
        if attempt.reported:
            return
        try:
            code, details = await call.code(), await call.details()
        except asyncio.CancelledError:
            code, details = grpc.StatusCode.CANCELLED, "cancelled"
        self._callable.report(attempt, code, details)

    async def _unary(self) -> Any:
        kind = self._callable._kind
        while True:
            call = await self._ensure()
            attempt = self._attempt
            assert attempt is not None
            try:
                response = await call
            except grpc.aio.AioRpcError as error:
                code, details = error.code(), error.details()
                self._callable.report(attempt, code, details)
                retry = kind == "unary_unary" and result_of(code, details, False) == pb.CALL_RESULT_CONNECT_FAILURE
                if not retry:
                    raise
                self._call = None  # never reached the instance: the next ticket
            else:
                self._callable.report(attempt, grpc.StatusCode.OK, None)
                return response

    def __await__(self) -> Generator[Any, None, Any]:
        return self._unary().__await__()

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Any]:
        call = await self._ensure()
        async for response in call:
            yield response

    async def read(self) -> Any:
        return await (await self._ensure()).read()

    async def write(self, request: Any) -> None:
        await (await self._ensure()).write(request)

    async def done_writing(self) -> None:
        await (await self._ensure()).done_writing()

    async def code(self) -> grpc.StatusCode:
        code: grpc.StatusCode = await (await self._ensure()).code()
        return code

    async def details(self) -> str:
        details: str = await (await self._ensure()).details()
        return details

    async def initial_metadata(self) -> Any:
        return await (await self._ensure()).initial_metadata()

    async def trailing_metadata(self) -> Any:
        return await (await self._ensure()).trailing_metadata()

    def cancel(self) -> bool:
        return self._call.cancel() if self._call is not None else False

    def done(self) -> bool:
        return self._call is not None and self._call.done()


_background: set[asyncio.Task[None]] = set()


def _spawn(coroutine: Any) -> None:
    task = asyncio.ensure_future(coroutine)
    _background.add(task)
    task.add_done_callback(_background.discard)
