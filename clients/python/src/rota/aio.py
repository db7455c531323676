"""The asyncio rota client, on ``grpc.aio``: the surface of :class:`rota.RotaClient`, awaited."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterable
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

import grpc
import grpc.aio

from . import _convert as convert
from ._convert import pb, pb_grpc
from ._registry_state import Desired
from .client import (
    ACK_TIMEOUT,
    CHANNEL_OPTIONS,
    CLOSE_TIMEOUT,
    DEFAULT_TIMEOUT,
    HEARTBEATS_PER_TIMEOUT,
    _backoff,
    _check_instances,
)
from .errors import RegistrationError, RotaError
from .fallback import (
    SHORTCUT_ERROR,
    STABLE_STREAM_SECONDS,
    InstanceCache,
    OutageState,
    falls_back,
    local_no_eligible,
)
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
from .version import current_version

log = logging.getLogger("rota")

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
    ) -> None:
        self.target = convert.target(target)
        self.timeout = timeout
        all_options = [*CHANNEL_OPTIONS, *options]
        if credentials is None:
            self._channel = grpc.aio.insecure_channel(self.target, options=all_options)
        else:
            self._channel = grpc.aio.secure_channel(self.target, credentials, options=all_options)
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
        if version is None:
            version = current_version() or ""
        exclude = list(exclude)
        if self._outage.shortcut() and self._followed(service):
            # rota failed several picks in a row: answer locally for a while without waiting.
            return self._local_pick(service, version, exclude, SHORTCUT_ERROR)
        request = convert.pick_request(service, rule, version, key, zone, exclude)
        try:
            picked = convert.pick_result(await self._balancer.Pick(request, timeout=self._timeout(timeout)))
        except grpc.RpcError as rpc_error:
            error = RotaError.from_rpc_error(rpc_error)
        else:
            self._outage.answered()
            return picked
        if not falls_back(error):
            self._outage.answered()
            raise error
        self._outage.unreachable()
        if not self._followed(service):
            raise error
        return self._local_pick(service, version, exclude, error)

    def _followed(self, service: str) -> bool:
        return service in self._watchers and self._watchers[service][0].synced

    def _local_pick(self, service: str, version: str, exclude: list[str], error: RotaError) -> PickResult:
        picked = self._watchers[service][0].pick(version, exclude)
        if picked is None:
            raise local_no_eligible(service, version, error)
        self._outage.picked_locally(service, str(error))
        return picked

    async def report(self, outcomes: Iterable[CallOutcome], *, timeout: float | None = None) -> ReportResult:
        """Sends outcomes of calls made to picked instances (at most 1000 per call)."""
        request = pb.ReportRequest(outcomes=[convert.outcome_to_pb(o) for o in outcomes])
        try:
            response = await self._balancer.Report(request, timeout=self._timeout(timeout))
        except grpc.RpcError as rpc_error:
            raise RotaError.from_rpc_error(rpc_error) from None
        return ReportResult(response.accepted, response.ignored)

    async def timed_call(
        self, picked: PickResult, call: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Awaits ``call(*args, **kwargs)``, reports how it went, returns its result.

        See :meth:`rota.RotaClient.timed_call` for the outcomes reported.
        """
        started = time.perf_counter_ns()
        try:
            result = await call(*args, **kwargs)
        except ConnectionError:
            await self._report_quietly(picked, CallResult.CONNECT_FAILURE, started)
            raise
        except Exception:
            await self._report_quietly(picked, CallResult.ERROR, started)
            raise
        await self._report_quietly(picked, CallResult.OK, started)
        return result

    async def _report_quietly(self, picked: PickResult, result: CallResult, started_ns: int) -> None:
        if picked.local_fallback:
            return
        latency_us = (time.perf_counter_ns() - started_ns) // 1000
        try:
            await self.report([CallOutcome.of(picked, result, latency_us)])
        except RotaError as error:
            log.info("could not report a call outcome to rota: %s", error)

    # -- Registry --------------------------------------------------------------------------

    async def list_services(self, *, timeout: float | None = None) -> list[ServiceSummary]:
        try:
            response = await self._registry.ListServices(pb.ListServicesRequest(), timeout=self._timeout(timeout))
        except grpc.RpcError as rpc_error:
            raise RotaError.from_rpc_error(rpc_error) from None
        return convert.service_summaries(response)

    async def list_instances(self, service: str, *, timeout: float | None = None) -> InstanceList:
        """Every registered instance of ``service`` (any status), sorted by id."""
        request = pb.ListInstancesRequest(service=service)
        try:
            response = await self._registry.ListInstances(request, timeout=self._timeout(timeout))
        except grpc.RpcError as rpc_error:
            raise RotaError.from_rpc_error(rpc_error) from None
        return convert.instance_list(response)

    async def watch(self, service: str) -> AsyncIterator[WatchEvent]:
        """A snapshot of ``service``'s instances, then each change, until the iteration stops."""
        call = self._registry.Watch(pb.WatchRequest(service=service))
        try:
            async for message in call:
                event = convert.watch_event(message)
                if event is not None:
                    yield event
        except grpc.RpcError as rpc_error:
            raise RotaError.from_rpc_error(rpc_error) from None
        finally:
            call.cancel()

    def follow(self, service: str) -> InstanceCache:
        """Watches ``service`` in a background task (once per client); returns its cache."""
        if self._closed:
            raise RuntimeError("the client is closed")
        if service not in self._watchers:
            cache = InstanceCache(service)
            task = asyncio.get_running_loop().create_task(self._watch_into(cache), name=f"rota-watch-{service}")
            self._watchers[service] = (cache, task)
        return self._watchers[service][0]

    async def _watch_into(self, cache: InstanceCache) -> None:
        backoff = _backoff()
        while True:
            call = self._registry.Watch(pb.WatchRequest(service=cache.service))
            opened = time.monotonic()
            try:
                async for message in call:
                    event = convert.watch_event(message)
                    if event is not None:
                        cache.apply(event)
                        if event.kind == "snapshot":
                            self._outage.answered()  # rota is reachable again
            except grpc.RpcError as rpc_error:
                error = RotaError.from_rpc_error(rpc_error)
                if error.code is grpc.StatusCode.INVALID_ARGUMENT:
                    log.error("cannot watch %r: %s", cache.service, error)
                    return
                log.info("watch of %r interrupted (%s); keeping the last list", cache.service, error)
            finally:
                call.cancel()
                if time.monotonic() - opened >= STABLE_STREAM_SECONDS:
                    backoff.reset()
            await asyncio.sleep(backoff.next_delay())

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
        _check_instances(instances)
        if self._closed:
            raise RuntimeError("the client is closed")
        return AsyncRegistration(self, instances, strict=strict, ack_timeout=ack_timeout)

    def _timeout(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is None else timeout


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
        self._pending: deque[asyncio.Future[Ack]] = deque()
        self._write_lock = asyncio.Lock()
        self._on_end = on_end
        self._half_closed = False
        self.ended = asyncio.Event()
        self.end_reason = ""
        self._reader = asyncio.get_running_loop().create_task(self._read(), name="rota-register-reader")

    def _gone(self) -> RotaError:
        return RotaError(grpc.StatusCode.UNAVAILABLE, f"registration stream ended: {self.end_reason}", unreachable=True)

    async def send(self, request: pb.RegisterRequest, *, acked: bool) -> asyncio.Future[Ack] | None:
        async with self._write_lock:
            if self.ended.is_set() or self._half_closed:
                raise self._gone()
            future: asyncio.Future[Ack] | None = None
            if acked:
                future = asyncio.get_running_loop().create_future()
                future.add_done_callback(_retrieve)
                self._pending.append(future)
            try:
                await self._call.write(request)
            except (grpc.RpcError, asyncio.InvalidStateError) as error:
                if future is not None and future in self._pending:
                    self._pending.remove(future)
                    future.cancel()
                raise RotaError(
                    grpc.StatusCode.UNAVAILABLE, f"registration stream broken: {error}", unreachable=True
                ) from None
            return future

    async def request(self, request: pb.RegisterRequest, timeout: float) -> Ack:
        """Sends one Announce, Update or Withdraw and waits for its acknowledgement."""
        future = await self.send(request, acked=True)
        assert future is not None
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError:
            raise RotaError(
                grpc.StatusCode.DEADLINE_EXCEEDED, f"no acknowledgement from rota within {timeout:g}s", unreachable=True
            ) from None

    async def _read(self) -> None:
        reason = "rota ended the stream"
        try:
            while True:
                response = await self._call.read()
                if response is grpc.aio.EOF:
                    break
                kind = response.WhichOneof("msg")
                if kind == "ack":
                    future = self._pending.popleft() if self._pending else None
                    if future is not None and not future.done():
                        future.set_result(convert.ack_from_pb(response.ack))
                elif kind == "closing":
                    reason = f"rota closed the stream: {response.closing.reason}"
        except grpc.RpcError as rpc_error:
            reason = str(RotaError.from_rpc_error(rpc_error))
        except asyncio.CancelledError:
            reason = "registration stream cancelled"
        finally:
            self.end_reason = reason
            self.ended.set()
            pending, self._pending = list(self._pending), deque()
            for future in pending:
                if not future.done():
                    future.set_exception(RotaError(grpc.StatusCode.UNAVAILABLE, reason, unreachable=True))
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
        self._ack_timeout = ack_timeout
        self._backoff = _backoff()
        self._desired = Desired()
        self._wake = asyncio.Event()
        self._stopping = False
        self._opening: asyncio.Task[AsyncRegistration] | None = None
        self._stream: _Stream | None = None
        self._keeper: asyncio.Task[None] | None = None
        self._close_ack: Ack | None = None
        #: The withdrawal made by a re-announcement that was answered after close() began.
        self._late_close_ack: Ack | None = None
        #: True while the keeper opens a new stream and waits for its acknowledgement.
        self._reannouncing = False
        self._lease_id = 0
        self._interval = 1.0
        self.ack: Ack | None = None
        self.reconnects = 0

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
        self.ack = ack
        self._desired.announced(self._initial, ack)
        self._lease_id = ack.lease_id
        self._interval = max(ack.heartbeat_timeout / HEARTBEATS_PER_TIMEOUT, 0.01)
        self._keeper = asyncio.get_running_loop().create_task(self._keep_alive(), name="rota-registration")
        if self._strict and ack.refused:
            await self.close()
            raise RegistrationError(ack.refused)
        self._client._registrations.append(self)
        return self

    async def _open(self, instances: list[Instance]) -> tuple[_Stream, Ack]:
        stream = _Stream(self._stub, self._wake.set)
        try:
            ack = await stream.request(convert.announce(instances), self._ack_timeout)
        except BaseException:  # RotaError, or the keeper cancelled by close(): end the stream
            await stream.close(0)
            raise
        return stream, ack

    # -- public ----------------------------------------------------------------------------

    @property
    def lease_id(self) -> int:
        """The lease of the current stream (a new one after each reconnection)."""
        return self._lease_id

    @property
    def instances(self) -> list[Instance]:
        """The instances this registration keeps registered."""
        return self._desired.instances()

    @property
    def closed(self) -> bool:
        return self._stopping

    async def announce(self, *instances: Instance, timeout: float | None = None) -> Ack:
        """Adds (or replaces) instances on this registration."""
        ack = await self._request(convert.announce(instances), timeout)
        self._desired.announced(instances, ack)
        return ack

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
        ref = instance.ref if isinstance(instance, Instance) else instance
        ack = await self._request(convert.update(ref, weight, status, metadata), timeout)
        self._desired.updated(ref, ack, weight, status, metadata)
        return ack

    async def withdraw(self, *refs: Instance | InstanceRef, timeout: float | None = None) -> Ack:
        """Withdraws some instances (all of them when none are named); the stream stays open."""
        refs_only = [r.ref if isinstance(r, Instance) else r for r in refs]
        ack = await self._request(convert.withdraw(refs_only), timeout)
        self._desired.withdrawn(refs_only, ack)
        return ack

    async def close(self, timeout: float = CLOSE_TIMEOUT) -> Ack | None:
        """Withdraws every instance, waits (at most ``timeout``) for rota's ack, ends the stream.

        Returns the acknowledgement, or ``None`` when rota could not be reached.
        """
        if self._stopping:
            return self._close_ack
        self._stopping = True
        self._wake.set()
        ack: Ack | None = None
        stream = self._stream
        if stream is not None:
            try:
                ack = await stream.request(convert.withdraw(), timeout)
            except RotaError as error:
                log.info("withdrawing from rota failed (%s); ending the stream", error)
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
        self._close_ack = ack if ack is not None else self._late_close_ack
        if self in self._client._registrations:
            self._client._registrations.remove(self)
        return self._close_ack

    # -- internals -------------------------------------------------------------------------

    async def _request(self, request: pb.RegisterRequest, timeout: float | None) -> Ack:
        if self._stopping:
            raise RuntimeError("the registration is closed")
        if self._stream is None:
            raise RuntimeError("the registration is not open yet: await it first")
        return await self._stream.request(request, self._ack_timeout if timeout is None else timeout)

    async def _send_heartbeat(self, stream: _Stream) -> None:
        await stream.send(convert.heartbeat(), acked=False)

    async def _keep_alive(self) -> None:
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._interval)
            self._wake.clear()
            if self._stopping:
                return
            stream = self._stream
            assert stream is not None
            try:
                if stream.ended.is_set():
                    log.warning("lost the rota registration stream (%s); reconnecting", stream.end_reason)
                    await self._reconnect()
                elif self._desired.pending:
                    pending = list(self._desired.pending.values())
                    ack = await stream.request(convert.announce(pending), self._ack_timeout)
                    self._desired.reannounced(pending, ack)
                else:
                    await self._send_heartbeat(stream)
            except RotaError as error:
                log.info("rota registration: %s", error)
                self._wake.set()

    async def _reconnect(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self._backoff.next_delay())
            if self._stopping:
                return
            instances = self._desired.instances() + list(self._desired.pending.values())
            self._reannouncing = True
            try:
                try:
                    stream, ack = await self._open(instances)
                except RotaError as error:
                    log.info("reconnecting to rota failed: %s", error)
                    continue
                if self._stopping:
                    # close() began while this announcement was answered: rota holds the
                    # instances on the new stream, so withdraw them there before ending it.
                    try:
                        self._late_close_ack = await stream.request(convert.withdraw(), CLOSE_TIMEOUT)
                    except RotaError as error:
                        log.info("withdrawing from rota failed (%s); ending the stream", error)
                    await stream.close(0)
                    return
            finally:
                self._reannouncing = False
            self._stream = stream
            self._lease_id = ack.lease_id
            self._interval = max(ack.heartbeat_timeout / HEARTBEATS_PER_TIMEOUT, 0.01)
            self._desired.reannounced(instances, ack)
            self.reconnects += 1
            self._backoff.reset()
            log.info("re-registered %d instance(s) with rota (lease %d)", len(ack.accepted), ack.lease_id)
            return
