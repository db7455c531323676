"""The asyncio rota client, on ``grpc.aio``: the surface of :class:`rota.RotaClient`, awaited.

Like the blocking client it only does the I/O (here coroutines and tasks); the decisions are
in the modules both clients share (see :mod:`rota.client`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterable
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

import grpc
import grpc.aio

from . import _calls as calls
from . import _convert as convert
from ._aio_channel import AsyncRotaChannel as AsyncRotaChannel
from ._aio_channel import channel as channel
from ._convert import pb, pb_grpc
from ._following import Following
from ._picking import PickAttempt
from ._register_stream import StreamAcks, broken, no_ack
from ._registry_state import HEARTBEAT, RECONNECT, Change, RegistrationState, check_instances
from ._rota_connection import PathArg, rota_connection
from ._settings import ACK_TIMEOUT, CLOSE_TIMEOUT, DEFAULT_TIMEOUT, channel_options, timeout_or
from .errors import RotaError
from .fallback import InstanceCache, OutageState
from .model import (
    Ack,
    CallOutcome,
    CallResult,
    Instance,
    InstanceList,
    InstanceRef,
    InstanceStatus,
    PickResult,
    ReportResult,
    ServiceSummary,
    WatchEvent,
)

P = ParamSpec("P")
T = TypeVar("T")


class AsyncRotaClient:
    """A connection to a rota server, for asyncio code.

    >>> async with AsyncRotaClient("127.0.0.1:50051") as rota:             # doctest: +SKIP
    ...     picked = await rota.pick("orders")

    Create it inside the event loop that uses it. ``follow`` starts background watchers
    (see :meth:`follow`).
    """

    def __init__(
        self,
        target: str,
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        follow: Iterable[str] = (),
        credentials: grpc.ChannelCredentials | None = None,
        options: Iterable[tuple[str, Any]] = (),
        token: str | None = None,
        tls_ca: PathArg | None = None,
        tls_cert: PathArg | None = None,
        tls_key: PathArg | None = None,
    ) -> None:
        connection = rota_connection(
            target, token=token, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key, credentials=credentials
        )
        self.target = connection.target
        self.timeout = timeout
        self._channel: grpc.aio.Channel = connection.dial(grpc.aio, channel_options(options))
        self._balancer = pb_grpc.BalancerStub(self._channel)
        self._registry = pb_grpc.RegistryStub(self._channel)
        self._watchers: dict[str, tuple[InstanceCache, asyncio.Task[None]]] = {}
        self._registrations: list[AsyncRegistration] = []
        self._closed = False
        self._outage = OutageState()
        for service in follow:
            self.follow(service)

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> AsyncRotaClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Withdraws open registrations, stops watchers and closes the channel."""
        if self._closed:
            return
        self._closed = True
        registrations, self._registrations = self._registrations, []
        for registration in registrations:
            await registration.close()
        watchers = [task for _, task in self._watchers.values()]
        for task in watchers:
            task.cancel()
        for task in watchers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._channel.close()

    # -- Balancer --------------------------------------------------------------------------

    async def pick(
        self,
        service: str,
        *,
        rule: str = "",
        version: str | None = None,
        key: str = "",
        zone: str = "",
        exclude: Iterable[str] = (),
        timeout: float | None = None,
    ) -> PickResult:
        """Asks rota for one instance of ``service``; see :meth:`rota.RotaClient.pick`."""
        cache = self._watchers[service][0] if service in self._watchers else None
        attempt = PickAttempt(self._outage, cache, service, rule, version, key, zone, exclude)
        return await self._call(calls.pick_call(attempt), timeout)

    async def report(self, outcomes: Iterable[CallOutcome], *, timeout: float | None = None) -> ReportResult:
        """Sends outcomes of calls made to picked instances (at most 1000 per call)."""
        return await self._call(calls.report_call(outcomes), timeout)

    async def _call(self, call: calls.UnaryCall[T], timeout: float | None) -> T:
        if call.local is not None:
            return call.local
        stub = self._balancer if call.stub == calls.BALANCER else self._registry
        try:
            response = await getattr(stub, call.method)(call.request, timeout=timeout_or(self.timeout, timeout))
        except grpc.RpcError as rpc_error:
            return call.failed(rpc_error)
        return call.answered(response)

    async def timed_call(
        self, picked: PickResult, call: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Awaits ``call(*args, **kwargs)``, reports how it went, returns its result.

        See :meth:`rota.RotaClient.timed_call` for the outcomes reported.
        """
        timed = calls.TimedCall(picked)
        try:
            result = await call(*args, **kwargs)
        except Exception as error:
            await self._report_quietly(timed.failed(error))
            raise
        await self._report_quietly(timed.outcome(CallResult.OK))
        return result

    async def _report_quietly(self, outcome: CallOutcome | None) -> None:
        if outcome is not None:
            try:
                await self.report([outcome])
            except RotaError as error:
                calls.report_failed(error)

    # -- Registry --------------------------------------------------------------------------

    async def list_services(self, *, timeout: float | None = None) -> list[ServiceSummary]:
        return await self._call(calls.list_services_call(), timeout)

    async def list_instances(self, service: str, *, timeout: float | None = None) -> InstanceList:
        """Every registered instance of ``service`` (any status), sorted by id."""
        return await self._call(calls.list_instances_call(service), timeout)

    async def watch(self, service: str) -> AsyncIterator[WatchEvent]:
        """A snapshot of ``service``'s instances, then each change, until the iteration stops."""
        call = self._registry.Watch(pb.WatchRequest(service=service))
        try:
            with calls.rota_errors():
                async for message in call:
                    event = convert.watch_event(message)
                    if event is not None:
                        yield event
        finally:
            call.cancel()

    def follow(self, service: str) -> InstanceCache:
        """Watches ``service`` in a background task (once per client); returns its cache."""
        if self._closed:
            raise calls.client_closed()
        if service not in self._watchers:
            following = Following(InstanceCache(service), self._outage)
            task = asyncio.get_running_loop().create_task(self._watch_into(following), name=f"rota-watch-{service}")
            self._watchers[service] = (following.cache, task)
        return self._watchers[service][0]

    async def _watch_into(self, following: Following) -> None:
        while True:
            call = self._registry.Watch(following.request)
            following.opened()
            try:
                async for message in call:
                    following.received(message)
            except grpc.RpcError as rpc_error:
                if not following.interrupted(rpc_error):
                    return
            finally:
                call.cancel()
                following.ended()
            await asyncio.sleep(following.next_delay())

    def register(
        self,
        *instances: Instance,
        strict: bool = True,
        ack_timeout: float = ACK_TIMEOUT,
    ) -> AsyncRegistration:
        """Registers ``instances`` and keeps them registered; see :meth:`rota.RotaClient.register`.

        The result is awaitable and an async context manager::

            registration = await rota.register(instance)
            async with rota.register(instance) as registration: ...
        """
        check_instances(instances)
        if self._closed:
            raise calls.client_closed()
        return AsyncRegistration(self, instances, strict=strict, ack_timeout=ack_timeout)


# ---------------------------------------------------------------------------------------------
# Registration
# ---------------------------------------------------------------------------------------------


def _retrieve(future: asyncio.Future[Any]) -> None:
    # An ack nobody waits for any more (its request timed out) must not log "never retrieved".
    if not future.cancelled():
        future.exception()


class _Stream:
    """One ``Register`` call; a reader task routes the acks to their requests."""

    def __init__(self, stub: pb_grpc.RegistryStub, on_end: Callable[[], None]) -> None:
        self._call: Any = stub.Register()
        self._acks: StreamAcks[asyncio.Future[Ack]] = StreamAcks()
        self._write_lock = asyncio.Lock()
        self._on_end = on_end
        self._half_closed = False
        self.ended = asyncio.Event()
        self._reader = asyncio.get_running_loop().create_task(self._read(), name="rota-register-reader")

    @property
    def end_reason(self) -> str:
        return self._acks.end_reason

    async def send(self, request: pb.RegisterRequest, *, acked: bool) -> asyncio.Future[Ack] | None:
        async with self._write_lock:
            if self.ended.is_set() or self._half_closed:
                raise self._acks.gone()
            future: asyncio.Future[Ack] | None = None
            if acked:
                future = asyncio.get_running_loop().create_future()
                future.add_done_callback(_retrieve)
                self._acks.expect(future)
            try:
                await self._call.write(request)
            except (grpc.RpcError, asyncio.InvalidStateError) as error:
                if future is not None and self._acks.forget(future):
                    future.cancel()
                raise broken(error) from None
            return future

    async def request(self, request: pb.RegisterRequest, timeout: float) -> Ack:
        """Sends one Announce, Update or Withdraw and waits for its acknowledgement."""
        future = await self.send(request, acked=True)
        assert future is not None
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError:
            raise no_ack(timeout) from None

    async def _read(self) -> None:
        try:
            while True:
                response = await self._call.read()
                if response is grpc.aio.EOF:
                    break
                answered = self._acks.received(response)
                if answered is not None and not answered[0].done():
                    answered[0].set_result(answered[1])
        except grpc.RpcError as rpc_error:
            self._acks.broke(rpc_error)
        except asyncio.CancelledError:
            self._acks.cancelled()
        finally:
            waiting, error = self._acks.end()
            self.ended.set()
            for future in waiting:
                if not future.done():
                    future.set_exception(error)
            self._on_end()

    async def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Half-closes the stream, lets rota end it, and cancels it if rota does not in time."""
        async with self._write_lock:
            if not self.ended.is_set() and not self._half_closed:
                self._half_closed = True
                with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
                    await self._call.done_writing()
        try:
            await asyncio.wait_for(self.ended.wait(), timeout)
        except TimeoutError:
            self._call.cancel()
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader


class AsyncRegistration:
    """A provider's registration for asyncio code; see :class:`rota.Registration`.

    Returned unopened by :meth:`AsyncRotaClient.register`: ``await`` it, or enter it with
    ``async with``, to announce the instances.
    """

    def __init__(
        self,
        client: AsyncRotaClient,
        instances: Iterable[Instance],
        *,
        strict: bool = True,
        ack_timeout: float = ACK_TIMEOUT,
    ) -> None:
        self._client = client
        self._stub = client._registry
        self._initial = list(instances)
        self._strict = strict
        self._state = RegistrationState(ack_timeout)
        self._wake = asyncio.Event()
        self._opening: asyncio.Task[AsyncRegistration] | None = None
        self._stream: _Stream | None = None
        self._keeper: asyncio.Task[None] | None = None
        #: True while the keeper opens a new stream and waits for its acknowledgement.
        self._reannouncing = False

    # -- opening ---------------------------------------------------------------------------

    def __await__(self) -> Generator[Any, None, AsyncRegistration]:
        return self._ensure_open().__await__()

    async def __aenter__(self) -> AsyncRegistration:
        return await self._ensure_open()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def _ensure_open(self) -> AsyncRegistration:
        if self._opening is None:
            self._opening = asyncio.get_running_loop().create_task(self._open_first())
        return await asyncio.shield(self._opening)

    async def _open_first(self) -> AsyncRegistration:
        self._stream, ack = await self._open(self._initial)
        self._state.opened(self._initial, ack)
        self._keeper = asyncio.get_running_loop().create_task(self._keep_alive(), name="rota-registration")
        refusal = self._state.refusal(self._strict)
        if refusal is not None:
            await self.close()
            raise refusal
        self._client._registrations.append(self)
        return self

    async def _open(self, instances: list[Instance]) -> tuple[_Stream, Ack]:
        stream = _Stream(self._stub, self._wake.set)
        try:
            ack = await stream.request(convert.announce(instances), self._state.ack_timeout)
        except BaseException:  # RotaError, or the keeper cancelled by close(): end the stream
            await stream.close(0)
            raise
        return stream, ack

    # -- public ----------------------------------------------------------------------------

    @property
    def ack(self) -> Ack | None:
        """rota's answer to the first announcement (``None`` until the registration is open)."""
        return self._state.ack

    @property
    def lease_id(self) -> int:
        """The lease of the current stream (a new one after each reconnection)."""
        return self._state.lease_id

    @property
    def reconnects(self) -> int:
        """How many times the registration opened a new stream and announced its instances again."""
        return self._state.reconnects

    @property
    def instances(self) -> list[Instance]:
        """The instances rota acknowledged and holds on this registration's stream; one whose
        re-announcement rota refused for now is left out until rota accepts it."""
        return self._state.desired.instances()

    @property
    def closed(self) -> bool:
        return self._state.stopping

    async def announce(self, *instances: Instance, timeout: float | None = None) -> Ack:
        """Adds (or replaces) instances on this registration."""
        return await self._change(self._state.announce(instances), timeout)

    async def update(
        self,
        instance: Instance | InstanceRef,
        *,
        weight: int | None = None,
        status: InstanceStatus | None = None,
        metadata: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> Ack:
        """Changes one registered instance; arguments left ``None`` keep their value."""
        return await self._change(self._state.update(instance, weight, status, metadata), timeout)

    async def withdraw(self, *refs: Instance | InstanceRef, timeout: float | None = None) -> Ack:
        """Withdraws some instances (all of them when none are named); the stream stays open."""
        return await self._change(self._state.withdraw(refs), timeout)

    async def close(self, timeout: float = CLOSE_TIMEOUT) -> Ack | None:
        """Withdraws every instance, waits (at most ``timeout``) for rota's ack, ends the stream.

        Returns the acknowledgement, or ``None`` when rota could not be reached.
        """
        if not self._state.begin_close():
            return self._state.close_ack
        self._wake.set()
        ack: Ack | None = None
        stream = self._stream
        if stream is not None:
            try:
                ack = await stream.request(convert.withdraw(), timeout)
            except RotaError as error:
                self._state.withdraw_failed(error)
            await stream.close(timeout)
        if self._keeper is not None:
            if self._reannouncing:
                # Let a re-announcement in flight be answered (it then withdraws what it
                # registered) rather than cut it off with its instances still on rota.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(self._keeper), timeout)
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
        close_ack = self._state.closed(ack)
        if self in self._client._registrations:
            self._client._registrations.remove(self)
        return close_ack

    # -- internals -------------------------------------------------------------------------

    async def _change(self, change: Change, timeout: float | None, stream: _Stream | None = None) -> Ack:
        """Sends ``change`` (on the current stream unless told one) and records rota's answer."""
        if stream is None:
            self._state.check_open()
            if self._stream is None:
                raise RuntimeError("the registration is not open yet: await it first")
            stream = self._stream
        ack = await stream.request(change.request, self._state.timeout(timeout))
        change.record(ack)
        return ack

    async def _send_heartbeat(self, stream: _Stream) -> None:
        await stream.send(convert.heartbeat(), acked=False)

    async def _keep_alive(self) -> None:
        while not self._state.stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._state.interval)
            self._wake.clear()
            if self._state.stopping:
                return
            stream = self._stream
            assert stream is not None
            try:
                step = self._state.next_step(stream.ended.is_set(), stream.end_reason)
                if step == RECONNECT:
                    await self._reconnect()
                elif step == HEARTBEAT:
                    await self._send_heartbeat(stream)
                else:
                    await self._change(self._state.retry(), None, stream)
            except RotaError as error:
                self._state.step_failed(error)
                self._wake.set()

    async def _reconnect(self) -> None:
        while not self._state.stopping:
            await asyncio.sleep(self._state.reconnect_delay())
            if self._state.stopping:
                return
            instances = self._state.reannouncement()
            self._reannouncing = True
            try:
                try:
                    stream, ack = await self._open(instances)
                except RotaError as error:
                    self._state.reconnect_failed(error)
                    continue
                if not self._state.reconnected(instances, ack):
                    await self._withdraw_late(stream)
                    return
            finally:
                self._reannouncing = False
            self._stream = stream
            return

    async def _withdraw_late(self, stream: _Stream) -> None:
        late_ack: Ack | None = None
        try:
            late_ack = await stream.request(convert.withdraw(), CLOSE_TIMEOUT)
        except RotaError as error:
            self._state.withdraw_failed(error)
        self._state.withdrawn_late(late_ack)
        await stream.close(0)
