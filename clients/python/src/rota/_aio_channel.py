"""``rota.aio.channel("rota:///orders")``: the asyncio counterpart of :func:`rota.channel`.

It behaves like a :class:`grpc.aio.Channel` (the four multicallable kinds, ``async with``,
``close()``), with one :func:`grpc.aio.insecure_channel` (or secure) per instance; ``interceptors``
go to every instance channel, as grpc.aio takes interceptors at channel creation. Routing,
leases, outcome reports, the local rotation during outages and the multicallables are those of
the sync channel: both use :mod:`rota._routing` and :mod:`rota._multicallables`; only waiting
for a first lease runs in a thread here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Generator, Sequence
from typing import Any

import grpc
import grpc.aio

from ._dial import dial
from ._multicallables import CallOptions, InstanceMultiCallables, RoutedChannel, call_options
from ._rota_connection import PathArg
from ._router import Router
from ._routing import (
    DEFAULT_ROUTE_TIMEOUT,
    Attempt,
    Deadline,
    Metadata,
    open_router,
    retries_on_next_ticket,
)
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
    token: str | None = None,
    tls_ca: PathArg | None = None,
    tls_cert: PathArg | None = None,
    tls_key: PathArg | None = None,
) -> AsyncRotaChannel:
    """An asyncio channel for ``rota:///SERVICE``; the arguments are those of :func:`rota.channel`."""
    router = open_router(target, server, rule, version, token=token, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key)
    return AsyncRotaChannel(router, ticket_header, options, credentials, interceptors)


class AsyncRotaChannel(RoutedChannel[grpc.aio.Channel]):
    """A :class:`grpc.aio.Channel`-like channel whose calls are routed by rota."""

    polls_state = True

    def __init__(
        self,
        router: Router,
        ticket_header: bool,
        options: Sequence[tuple[str, Any]] | None,
        credentials: grpc.ChannelCredentials | None,
        interceptors: Sequence[grpc.aio.ClientInterceptor] | None,
    ) -> None:
        self._interceptors = list(interceptors or ())
        self._closing: list[grpc.aio.Channel] = []
        super().__init__(router, ticket_header, options, credentials)

    def _open(self, member: Member) -> grpc.aio.Channel:
        ch: grpc.aio.Channel = dial(
            grpc.aio, member.address, self._credentials, self._options, interceptors=self._interceptors
        )
        return ch

    def _close_instance(self, channel: grpc.aio.Channel) -> None:
        self._closing.append(channel)  # closed on the event loop, at the next call or close()

    def _state_of(self, channel: grpc.aio.Channel) -> grpc.ChannelConnectivity:
        return channel.get_state()

    def _multicallable(self, kind: str, method: str, serializer: Any, deserializer: Any) -> _Callable:
        return _Callable(self, kind, method, serializer, deserializer)

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
        self._calls: InstanceMultiCallables[grpc.aio.Channel] = InstanceMultiCallables(
            kind, method, serializer, deserializer
        )

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
        return _Call(self, request, metadata, timeout, call_options(credentials, wait_for_ready, compression))

    def start(
        self, draw: Draw, request: Any, metadata: Metadata | None, timeout: float | None, kwargs: CallOptions
    ) -> Any:
        factory = self._calls.on(draw.member.id, self._channel.routing.channel_for(draw))
        if request is None and self._calls.streams_requests:
            return factory(metadata=metadata, timeout=timeout, **kwargs)
        return factory(request, metadata=metadata, timeout=timeout, **kwargs)

    def report(self, attempt: Attempt, code: grpc.StatusCode | None, details: str | None) -> None:
        self._channel.routing.finish(attempt, code, details)


class _Call:
    """An aio call routed on first use: awaitable (unary responses), async-iterable (streams), with
    ``read``, ``write``, ``done_writing``, ``code``, ``details`` and ``cancel`` of the call below.

    A unary-unary call that could not connect is sent again on the next ticket, within the
    timeout counted from its first use."""

    def __init__(
        self,
        callable_: _Callable,
        request: Any,
        metadata: Metadata | None,
        timeout: float | None,
        kwargs: CallOptions,
    ) -> None:
        self._callable = callable_
        self._request = request
        self._metadata = metadata
        self._timeout = timeout
        self._deadline: Deadline | None = None
        self._kwargs = kwargs
        self._call: Any = None
        self._attempt: Attempt | None = None
        self._lock = asyncio.Lock()

    async def _ensure(self) -> Any:
        async with self._lock:
            if self._call is None:
                if self._deadline is None:
                    self._deadline = Deadline(self._timeout)
                left = self._deadline.left()
                draw, md = await self._callable._channel.route(self._metadata, left)
                attempt = self._attempt = self._callable._channel.routing.start(draw)
                self._call = self._callable.start(draw, self._request, md, left, self._kwargs)
                self._call.add_done_callback(lambda c: _spawn(self._report(c, attempt)))
            return self._call

    async def _report(self, call: Any, attempt: Attempt) -> None:
        if attempt.reported:
            return
        try:
            code, details = await call.code(), await call.details()
        except asyncio.CancelledError:
            code, details = grpc.StatusCode.CANCELLED, "cancelled"
        self._callable.report(attempt, code, details)

    async def _unary(self) -> Any:
        while True:
            call = await self._ensure()
            attempt, deadline = self._attempt, self._deadline
            assert attempt is not None and deadline is not None
            try:
                response = await call
            except grpc.aio.AioRpcError as error:
                code, details = error.code(), error.details()
                self._callable.report(attempt, code, details)
                if not retries_on_next_ticket(self._callable._kind, code, details, deadline):
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
