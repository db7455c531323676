"""The blocking rota client, on ``grpcio``."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

import grpc

from . import _convert as convert
from ._convert import pb, pb_grpc
from ._registry_state import Desired
from .backoff import Backoff
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

#: Seconds a unary call (pick, report, listing) may take unless the client is told otherwise.
DEFAULT_TIMEOUT = 2.0
#: Seconds to wait for the acknowledgement of an Announce, Update or Withdraw.
ACK_TIMEOUT = 5.0
#: Seconds :meth:`Registration.close` waits for the acknowledgement of its Withdraw.
CLOSE_TIMEOUT = 2.0
#: Heartbeats go out at this fraction of rota's timeout, so two in a row may be lost.
HEARTBEATS_PER_TIMEOUT = 3

#: Channel settings: reconnect to rota quickly once it is back, and notice dead connections.
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 10_000),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.http2.max_pings_without_data", 0),
)


def _backoff() -> Backoff:
    return Backoff(initial=0.1, cap=10.0)


class RotaClient:
    """A connection to a rota server.

    >>> with RotaClient("127.0.0.1:50051") as rota:                        # doctest: +SKIP
    ...     picked = rota.pick("orders", rule="repeat(n=3)")
    ...     print(picked.instance.address)

    ``follow`` names services whose instance lists are watched in the background, so that
    :meth:`pick` can still answer from the last list seen when rota is unreachable.
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
            self._channel = grpc.insecure_channel(self.target, options=all_options)
        else:
            self._channel = grpc.secure_channel(self.target, credentials, options=all_options)
        self._balancer = pb_grpc.BalancerStub(self._channel)
        self._registry = pb_grpc.RegistryStub(self._channel)
        self._lock = threading.Lock()
        self._watchers: dict[str, _Watcher] = {}
        self._registrations: list[Registration] = []
        self._closed = False
        self._outage = OutageState()
        for service in follow:
            self.follow(service)

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> RotaClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Withdraws open registrations, stops watchers and closes the channel."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            registrations, self._registrations = self._registrations, []
            watchers = list(self._watchers.values())
        for registration in registrations:
            registration.close()
        for watcher in watchers:
            watcher.stop()
        self._channel.close()
        for watcher in watchers:
            watcher.join(timeout=CLOSE_TIMEOUT)

    # -- Balancer --------------------------------------------------------------------------

    def pick(
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
        """Asks rota for one instance of ``service``.

        ``version=None`` uses :func:`rota.version.current_version` (the version of the request
        being handled); pass ``""`` to ask for unversioned instances explicitly. When rota cannot
        be reached and ``service`` is followed, the instance comes from the last list seen and the
        result has ``local_fallback=True``.

        Raises :class:`RotaError` with the gRPC status: ``NOT_FOUND`` (never registered),
        ``UNAVAILABLE`` (nothing eligible, or rota unreachable with nothing cached),
        ``INVALID_ARGUMENT`` (bad service name or rule).
        """
        if version is None:
            version = current_version() or ""
        exclude = list(exclude)
        if self._outage.shortcut() and self._followed(service):
            # rota failed several picks in a row: answer locally for a while without waiting.
            return self._local_pick(service, version, exclude, SHORTCUT_ERROR)
        request = convert.pick_request(service, rule, version, key, zone, exclude)
        try:
            picked = convert.pick_result(self._balancer.Pick(request, timeout=self._timeout(timeout)))
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
        watcher = self._watchers.get(service)
        return watcher is not None and watcher.cache.synced

    def _local_pick(self, service: str, version: str, exclude: list[str], error: RotaError) -> PickResult:
        picked = self._watchers[service].cache.pick(version, exclude)
        if picked is None:
            raise local_no_eligible(service, version, error)
        self._outage.picked_locally(service, str(error))
        return picked

    def report(self, outcomes: Iterable[CallOutcome], *, timeout: float | None = None) -> ReportResult:
        """Sends outcomes of calls made to picked instances (at most 1000 per call)."""
        request = pb.ReportRequest(outcomes=[convert.outcome_to_pb(o) for o in outcomes])
        try:
            response = self._balancer.Report(request, timeout=self._timeout(timeout))
        except grpc.RpcError as rpc_error:
            raise RotaError.from_rpc_error(rpc_error) from None
        return ReportResult(response.accepted, response.ignored)

    def timed_call(self, picked: PickResult, call: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Runs ``call(*args, **kwargs)`` against ``picked``, reports how it went, returns its result.

        The outcome is ``OK`` when it returns, ``CONNECT_FAILURE`` when it raises
        :class:`ConnectionError`, ``ERROR`` for any other exception (which is re-raised). A
        failed report is logged, never raised: it must not fail the call.
        """
        started = time.perf_counter_ns()
        try:
            result = call(*args, **kwargs)
        except ConnectionError:
            self._report_quietly(picked, CallResult.CONNECT_FAILURE, started)
            raise
        except Exception:
            self._report_quietly(picked, CallResult.ERROR, started)
            raise
        self._report_quietly(picked, CallResult.OK, started)
        return result

    def _report_quietly(self, picked: PickResult, result: CallResult, started_ns: int) -> None:
        if picked.local_fallback:
            return  # rota is unreachable; the outcome has nowhere to go
        latency_us = (time.perf_counter_ns() - started_ns) // 1000
        try:
            self.report([CallOutcome.of(picked, result, latency_us)])
        except RotaError as error:
            log.info("could not report a call outcome to rota: %s", error)

    # -- Registry --------------------------------------------------------------------------

    def list_services(self, *, timeout: float | None = None) -> list[ServiceSummary]:
        try:
            response = self._registry.ListServices(pb.ListServicesRequest(), timeout=self._timeout(timeout))
        except grpc.RpcError as rpc_error:
            raise RotaError.from_rpc_error(rpc_error) from None
        return convert.service_summaries(response)

    def list_instances(self, service: str, *, timeout: float | None = None) -> InstanceList:
        """Every registered instance of ``service`` (any status), sorted by id."""
        request = pb.ListInstancesRequest(service=service)
        try:
            response = self._registry.ListInstances(request, timeout=self._timeout(timeout))
        except grpc.RpcError as rpc_error:
            raise RotaError.from_rpc_error(rpc_error) from None
        return convert.instance_list(response)

    def watch(self, service: str) -> Iterator[WatchEvent]:
        """A snapshot of ``service``'s instances, then each change, until the iterator is closed."""
        call = self._registry.Watch(pb.WatchRequest(service=service))
        try:
            for message in call:
                event = convert.watch_event(message)
                if event is not None:
                    yield event
        except grpc.RpcError as rpc_error:
            raise RotaError.from_rpc_error(rpc_error) from None
        finally:
            call.cancel()

    def follow(self, service: str) -> InstanceCache:
        """Watches ``service`` in the background (once per client); returns its cache.

        The cache is what :meth:`pick` falls back to when rota is unreachable.
        """
        with self._lock:
            if self._closed:
                raise RuntimeError("the client is closed")
            watcher = self._watchers.get(service)
            if watcher is None:
                watcher = self._watchers[service] = _Watcher(self._registry, service, self._outage)
                watcher.start()
        return watcher.cache

    def register(
        self,
        *instances: Instance,
        strict: bool = True,
        ack_timeout: float = ACK_TIMEOUT,
    ) -> Registration:
        """Registers ``instances`` on a new ``Register`` stream and keeps them registered.

        Returns once rota has acknowledged the announcement. The returned
        :class:`Registration` heartbeats in a background thread and, if the stream is lost,
        reconnects with backoff and announces the instances again. Closing it (or leaving its
        ``with`` block) withdraws them.

        With ``strict`` (the default) a refused instance raises :class:`RegistrationError` and
        nothing stays registered; with ``strict=False`` refusals are only reported in
        :attr:`Registration.ack`.
        """
        _check_instances(instances)
        with self._lock:
            if self._closed:
                raise RuntimeError("the client is closed")
        registration = Registration(self._registry, instances, ack_timeout=ack_timeout, on_close=self._forget)
        if strict and registration.ack.refused:
            registration.close()
            raise RegistrationError(registration.ack.refused)
        with self._lock:
            self._registrations.append(registration)
        return registration

    def _forget(self, registration: Registration) -> None:
        with self._lock:
            if registration in self._registrations:
                self._registrations.remove(registration)

    def _timeout(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is None else timeout


def _check_instances(instances: tuple[Instance, ...]) -> None:
    for instance in instances:
        if not isinstance(instance, Instance):
            raise TypeError(f"register() takes Instance arguments (register(*instances) for a list), got {instance!r}")


# ---------------------------------------------------------------------------------------------
# Registration
# ---------------------------------------------------------------------------------------------

_END: Any = object()


class _Stream:
    """One ``Register`` call: requests go out through a queue, a reader thread routes the acks."""

    def __init__(self, stub: pb_grpc.RegistryStub, on_end: Callable[[], None]) -> None:
        self._requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._pending: deque[Future[Ack]] = deque()
        self._lock = threading.Lock()
        self._on_end = on_end
        self.ended = threading.Event()
        self.end_reason = ""
        self._call = stub.Register(iter(self._requests.get, _END))
        self._reader = threading.Thread(target=self._read, name="rota-register-reader", daemon=True)
        self._reader.start()

    def send(self, request: pb.RegisterRequest, *, acked: bool) -> Future[Ack] | None:
        with self._lock:
            if self.ended.is_set():
                raise RotaError(
                    grpc.StatusCode.UNAVAILABLE, f"registration stream ended: {self.end_reason}", unreachable=True
                )
            future: Future[Ack] | None = None
            if acked:
                future = Future()
                self._pending.append(future)
            self._requests.put(request)
            return future

    def request(self, request: pb.RegisterRequest, timeout: float) -> Ack:
        """Sends one Announce, Update or Withdraw and waits for its acknowledgement."""
        future = self.send(request, acked=True)
        assert future is not None
        try:
            return future.result(timeout)
        except FutureTimeout:
            raise RotaError(
                grpc.StatusCode.DEADLINE_EXCEEDED, f"no acknowledgement from rota within {timeout:g}s", unreachable=True
            ) from None

    def _read(self) -> None:
        reason = "rota ended the stream"
        try:
            for response in self._call:
                kind = response.WhichOneof("msg")
                if kind == "ack":
                    with self._lock:
                        future = self._pending.popleft() if self._pending else None
                    if future is not None:
                        future.set_result(convert.ack_from_pb(response.ack))
                elif kind == "closing":
                    reason = f"rota closed the stream: {response.closing.reason}"
        except grpc.RpcError as rpc_error:
            reason = str(RotaError.from_rpc_error(rpc_error))
        finally:
            with self._lock:
                self.end_reason = reason
                self.ended.set()
                pending, self._pending = list(self._pending), deque()
                self._requests.put(_END)
            for future in pending:
                future.set_exception(RotaError(grpc.StatusCode.UNAVAILABLE, reason, unreachable=True))
            self._on_end()

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Half-closes the stream, lets rota end it, and cancels it if rota does not in time."""
        with self._lock:
            if not self.ended.is_set():
                self._requests.put(_END)
        if not self.ended.wait(timeout):
            self._call.cancel()
            self.ended.wait(timeout)


class Registration:
    """A provider's registration: instances that stay registered while it is open.

    Created by :meth:`RotaClient.register`. Use it as a context manager, or call
    :meth:`close`, to withdraw the instances.
    """

    def __init__(
        self,
        stub: pb_grpc.RegistryStub,
        instances: Iterable[Instance],
        *,
        ack_timeout: float = ACK_TIMEOUT,
        on_close: Callable[[Registration], None] | None = None,
    ) -> None:
        self._stub = stub
        self._ack_timeout = ack_timeout
        self._on_close = on_close
        self._backoff = _backoff()
        self._desired = Desired()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._close_ack: Ack | None = None
        #: The withdrawal made by a re-announcement that was answered after close() began.
        self._late_close_ack: Ack | None = None
        self.reconnects = 0
        instances = list(instances)
        self._stream, self.ack = self._open(instances)
        self._desired.announced(instances, self.ack)
        self._lease_id = self.ack.lease_id
        self._interval = max(self.ack.heartbeat_timeout / HEARTBEATS_PER_TIMEOUT, 0.01)
        self._keeper = threading.Thread(target=self._keep_alive, name="rota-registration", daemon=True)
        self._keeper.start()

    # -- public ----------------------------------------------------------------------------

    @property
    def lease_id(self) -> int:
        """The lease of the current stream (a new one after each reconnection)."""
        return self._lease_id

    @property
    def instances(self) -> list[Instance]:
        """The instances this registration keeps registered."""
        with self._lock:
            return self._desired.instances()

    @property
    def closed(self) -> bool:
        return self._stopping.is_set()

    def announce(self, *instances: Instance, timeout: float | None = None) -> Ack:
        """Adds (or replaces) instances on this registration."""
        ack = self._request(convert.announce(instances), timeout)
        with self._lock:
            self._desired.announced(instances, ack)
        return ack

    def update(
        self,
        instance: Instance | InstanceRef,
        *,
        weight: int | None = None,
        status: InstanceStatus | None = None,
        metadata: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> Ack:
        """Changes one registered instance; arguments left ``None`` keep their value.

        ``update(instance, status=InstanceStatus.DRAINING)`` stops new picks of it.
        """
        ref = instance.ref if isinstance(instance, Instance) else instance
        ack = self._request(convert.update(ref, weight, status, metadata), timeout)
        with self._lock:
            self._desired.updated(ref, ack, weight, status, metadata)
        return ack

    def withdraw(self, *refs: Instance | InstanceRef, timeout: float | None = None) -> Ack:
        """Withdraws some instances (all of them when none are named); the stream stays open."""
        refs_only = [r.ref if isinstance(r, Instance) else r for r in refs]
        ack = self._request(convert.withdraw(refs_only), timeout)
        with self._lock:
            self._desired.withdrawn(refs_only, ack)
        return ack

    def close(self, timeout: float = CLOSE_TIMEOUT) -> Ack | None:
        """Withdraws every instance, waits (at most ``timeout``) for rota's ack, ends the stream.

        Returns the acknowledgement of the withdrawal, or ``None`` when rota could not be
        reached (rota removes a lost stream's instances by itself). Closing twice is harmless.
        """
        with self._lock:
            if self._stopping.is_set():
                return self._close_ack
            self._stopping.set()
            stream = self._stream
        self._wake.set()
        ack: Ack | None = None
        try:
            ack = stream.request(convert.withdraw(), timeout)
        except RotaError as error:
            log.info("withdrawing from rota failed (%s); ending the stream", error)
        stream.close(timeout)
        # A re-announcement in flight withdraws what it registered before the keeper ends.
        self._keeper.join(timeout)
        with self._lock:
            # When the stream in hand had already ended, a re-announcement that close() caught
            # in flight was withdrawn on its own stream: that is the acknowledgement to return.
            self._close_ack = ack if ack is not None else self._late_close_ack
            close_ack = self._close_ack
        if self._on_close is not None:
            self._on_close(self)
        return close_ack

    def __enter__(self) -> Registration:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------

    def _request(self, request: pb.RegisterRequest, timeout: float | None) -> Ack:
        with self._lock:
            if self._stopping.is_set():
                raise RuntimeError("the registration is closed")
            stream = self._stream
        return stream.request(request, self._ack_timeout if timeout is None else timeout)

    def _open(self, instances: list[Instance]) -> tuple[_Stream, Ack]:
        stream = _Stream(self._stub, self._wake.set)
        try:
            ack = stream.request(convert.announce(instances), self._ack_timeout)
        except RotaError:
            stream.close(0)
            raise
        return stream, ack

    def _send_heartbeat(self, stream: _Stream) -> None:
        stream.send(convert.heartbeat(), acked=False)

    def _keep_alive(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(self._interval)
            self._wake.clear()
            if self._stopping.is_set():
                return
            stream = self._stream
            try:
                if stream.ended.is_set():
                    log.warning("lost the rota registration stream (%s); reconnecting", stream.end_reason)
                    self._reconnect()
                elif self._desired.pending:
                    self._retry_pending(stream)
                else:
                    self._send_heartbeat(stream)
            except RotaError as error:
                log.info("rota registration: %s", error)
                self._wake.set()

    def _retry_pending(self, stream: _Stream) -> None:
        with self._lock:
            pending = list(self._desired.pending.values())
        ack = stream.request(convert.announce(pending), self._ack_timeout)
        with self._lock:
            self._desired.reannounced(pending, ack)

    def _reconnect(self) -> None:
        while not self._stopping.is_set():
            if self._stopping.wait(self._backoff.next_delay()):
                return
            with self._lock:
                instances = self._desired.instances() + list(self._desired.pending.values())
            try:
                stream, ack = self._open(instances)
            except RotaError as error:
                log.info("reconnecting to rota failed: %s", error)
                continue
            with self._lock:
                if self._stopping.is_set():
                    stream_to_close: _Stream | None = stream
                else:
                    stream_to_close = None
                    self._stream = stream
                    self._lease_id = ack.lease_id
                    self._interval = max(ack.heartbeat_timeout / HEARTBEATS_PER_TIMEOUT, 0.01)
                    self._desired.reannounced(instances, ack)
                    self.reconnects += 1
            if stream_to_close is not None:
                # close() began while this announcement was answered: rota holds the instances
                # on the new stream, so withdraw them there before ending it.
                try:
                    late_ack: Ack | None = stream_to_close.request(convert.withdraw(), CLOSE_TIMEOUT)
                except RotaError as error:
                    log.info("withdrawing from rota failed (%s); ending the stream", error)
                    late_ack = None
                with self._lock:
                    self._late_close_ack = late_ack
                stream_to_close.close(0)
                return
            self._backoff.reset()
            log.info("re-registered %d instance(s) with rota (lease %d)", len(ack.accepted), ack.lease_id)
            return


# ---------------------------------------------------------------------------------------------
# Watching for the local fallback
# ---------------------------------------------------------------------------------------------


class _Watcher(threading.Thread):
    """Keeps one service's :class:`InstanceCache` in step with rota through ``Watch``."""

    def __init__(self, stub: pb_grpc.RegistryStub, service: str, outage: OutageState) -> None:
        super().__init__(name=f"rota-watch-{service}", daemon=True)
        self._stub = stub
        self._outage = outage
        self._clock = time.monotonic
        self.cache = InstanceCache(service)
        self._stopping = threading.Event()
        self._call: Any = None
        self._lock = threading.Lock()
        self._backoff = _backoff()

    def run(self) -> None:
        while not self._stopping.is_set():
            with self._lock:
                if self._stopping.is_set():
                    return
                self._call = call = self._stub.Watch(pb.WatchRequest(service=self.cache.service))
            opened = self._clock()
            try:
                for message in call:
                    event = convert.watch_event(message)
                    if event is not None:
                        self.cache.apply(event)
                        if event.kind == "snapshot":
                            self._outage.answered()  # rota is reachable again
            except grpc.RpcError as rpc_error:
                if self._stopping.is_set():
                    return
                error = RotaError.from_rpc_error(rpc_error)
                if error.code is grpc.StatusCode.INVALID_ARGUMENT:
                    log.error("cannot watch %r: %s", self.cache.service, error)
                    return
                log.info("watch of %r interrupted (%s); keeping the last list", self.cache.service, error)
            finally:
                if self._clock() - opened >= STABLE_STREAM_SECONDS:
                    self._backoff.reset()
            self._stopping.wait(self._backoff.next_delay())

    def stop(self) -> None:
        with self._lock:
            self._stopping.set()
            if self._call is not None:
                self._call.cancel()
