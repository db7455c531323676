"""The blocking rota client, on ``grpcio``.

It only does the I/O (grpc calls, threads, waiting); what is decided is in the modules both
clients share: :mod:`rota._picking` (a pick and its local fallback), :mod:`rota._calls` (errors
and timed calls), :mod:`rota._following` (the watch behind :meth:`RotaClient.follow`),
:mod:`rota._registry_state` and :mod:`rota._register_stream` (registrations).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

import grpc

from . import _calls as calls
from . import _convert as convert
from ._convert import pb, pb_grpc
from ._following import Following
from ._picking import PickAttempt
from ._register_stream import StreamAcks, no_ack
from ._registry_state import HEARTBEAT, RECONNECT, Change, RegistrationState, check_instances
from ._rota_connection import PathArg, rota_connection
from ._settings import ACK_TIMEOUT, CLOSE_TIMEOUT, DEFAULT_TIMEOUT, channel_options, timeout_or
from ._settings import CHANNEL_OPTIONS as CHANNEL_OPTIONS
from ._settings import HEARTBEATS_PER_TIMEOUT as HEARTBEATS_PER_TIMEOUT
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
        self._channel: grpc.Channel = connection.dial(grpc, channel_options(options))
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
        watcher = self._watchers.get(service)
        cache = None if watcher is None else watcher.cache
        attempt = PickAttempt(self._outage, cache, service, rule, version, key, zone, exclude)
        return self._call(calls.pick_call(attempt), timeout)

    def report(self, outcomes: Iterable[CallOutcome], *, timeout: float | None = None) -> ReportResult:
        """Sends outcomes of calls made to picked instances (at most 1000 per call)."""
        return self._call(calls.report_call(outcomes), timeout)

    def _call(self, call: calls.UnaryCall[T], timeout: float | None) -> T:
        if call.local is not None:
            return call.local
        stub = self._balancer if call.stub == calls.BALANCER else self._registry
        try:
            response = getattr(stub, call.method)(call.request, timeout=timeout_or(self.timeout, timeout))
        except grpc.RpcError as rpc_error:
            return call.failed(rpc_error)
        return call.answered(response)

    def timed_call(self, picked: PickResult, call: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Runs ``call(*args, **kwargs)`` against ``picked``, reports how it went, returns its result.

        The outcome is ``OK`` when it returns, ``CONNECT_FAILURE`` when it raises
        :class:`ConnectionError`, ``ERROR`` for any other exception (which is re-raised). A
        failed report is logged, never raised: it must not fail the call.
        """
        timed = calls.TimedCall(picked)
        try:
            result = call(*args, **kwargs)
        except Exception as error:
            self._report_quietly(timed.failed(error))
            raise
        self._report_quietly(timed.outcome(CallResult.OK))
        return result

    def _report_quietly(self, outcome: CallOutcome | None) -> None:
        if outcome is not None:
            try:
                self.report([outcome])
            except RotaError as error:
                calls.report_failed(error)

    # -- Registry --------------------------------------------------------------------------

    def list_services(self, *, timeout: float | None = None) -> list[ServiceSummary]:
        return self._call(calls.list_services_call(), timeout)

    def list_instances(self, service: str, *, timeout: float | None = None) -> InstanceList:
        """Every registered instance of ``service`` (any status), sorted by id."""
        return self._call(calls.list_instances_call(service), timeout)

    def watch(self, service: str) -> Iterator[WatchEvent]:
        """A snapshot of ``service``'s instances, then each change, until the iterator is closed."""
        call = self._registry.Watch(pb.WatchRequest(service=service))
        try:
            with calls.rota_errors():
                for message in call:
                    event = convert.watch_event(message)
                    if event is not None:
                        yield event
        finally:
            call.cancel()

    def follow(self, service: str) -> InstanceCache:
        """Watches ``service`` in the background (once per client); returns its cache.

        The cache is what :meth:`pick` falls back to when rota is unreachable.
        """
        with self._lock:
            if self._closed:
                raise calls.client_closed()
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
        check_instances(instances)
        with self._lock:
            if self._closed:
                raise calls.client_closed()
        registration = Registration(self._registry, instances, ack_timeout=ack_timeout, on_close=self._forget)
        refusal = registration._state.refusal(strict)
        if refusal is not None:
            registration.close()
            raise refusal
        with self._lock:
            self._registrations.append(registration)
        return registration

    def _forget(self, registration: Registration) -> None:
        with self._lock:
            if registration in self._registrations:
                self._registrations.remove(registration)


# ---------------------------------------------------------------------------------------------
# Registration
# ---------------------------------------------------------------------------------------------

_END: Any = object()


class _Stream:
    """One ``Register`` call: requests go out through a queue, a reader thread routes the acks."""

    def __init__(self, stub: pb_grpc.RegistryStub, on_end: Callable[[], None]) -> None:
        self._requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._acks: StreamAcks[Future[Ack]] = StreamAcks()
        self._lock = threading.Lock()
        self._on_end = on_end
        self.ended = threading.Event()
        self._call = stub.Register(iter(self._requests.get, _END))
        self._reader = threading.Thread(target=self._read, name="rota-register-reader", daemon=True)
        self._reader.start()

    @property
    def end_reason(self) -> str:
        return self._acks.end_reason

    def send(self, request: pb.RegisterRequest, *, acked: bool) -> Future[Ack] | None:
        with self._lock:
            if self.ended.is_set():
                raise self._acks.gone()
            future: Future[Ack] | None = None
            if acked:
                future = Future()
                self._acks.expect(future)
            self._requests.put(request)
            return future

    def request(self, request: pb.RegisterRequest, timeout: float) -> Ack:
        """Sends one Announce, Update or Withdraw and waits for its acknowledgement."""
        future = self.send(request, acked=True)
        assert future is not None
        try:
            return future.result(timeout)
        except FutureTimeout:
            raise no_ack(timeout) from None

    def _read(self) -> None:
        try:
            for response in self._call:
                with self._lock:
                    answered = self._acks.received(response)
                if answered is not None:
                    answered[0].set_result(answered[1])
        except grpc.RpcError as rpc_error:
            self._acks.broke(rpc_error)
        finally:
            with self._lock:
                waiting, error = self._acks.end()
                self.ended.set()
                self._requests.put(_END)
            for future in waiting:
                future.set_exception(error)
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
        self._on_close = on_close
        self._state = RegistrationState(ack_timeout)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        #: Set with the state's ``stopping``; wakes the keeper's waits.
        self._stopping = threading.Event()
        instances = list(instances)
        self._stream, ack = self._open(instances)
        self._state.opened(instances, ack)
        self._ack = ack
        self._keeper = threading.Thread(target=self._keep_alive, name="rota-registration", daemon=True)
        self._keeper.start()

    # -- public ----------------------------------------------------------------------------

    @property
    def ack(self) -> Ack:
        """rota's answer to the first announcement."""
        return self._ack

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
        with self._lock:
            return self._state.desired.instances()

    @property
    def closed(self) -> bool:
        return self._state.stopping

    def announce(self, *instances: Instance, timeout: float | None = None) -> Ack:
        """Adds (or replaces) instances on this registration."""
        return self._change(self._state.announce(instances), timeout)

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
        return self._change(self._state.update(instance, weight, status, metadata), timeout)

    def withdraw(self, *refs: Instance | InstanceRef, timeout: float | None = None) -> Ack:
        """Withdraws some instances (all of them when none are named); the stream stays open."""
        return self._change(self._state.withdraw(refs), timeout)

    def close(self, timeout: float = CLOSE_TIMEOUT) -> Ack | None:
        """Withdraws every instance, waits (at most ``timeout``) for rota's ack, ends the stream.

        Returns the acknowledgement of the withdrawal, or ``None`` when rota could not be
        reached (rota removes a lost stream's instances by itself). Closing twice is harmless.
        """
        with self._lock:
            if not self._state.begin_close():
                return self._state.close_ack
            self._stopping.set()
            stream = self._stream
        self._wake.set()
        ack: Ack | None = None
        try:
            ack = stream.request(convert.withdraw(), timeout)
        except RotaError as error:
            self._state.withdraw_failed(error)
        stream.close(timeout)
        # A re-announcement in flight withdraws what it registered before the keeper ends.
        self._keeper.join(timeout)
        with self._lock:
            close_ack = self._state.closed(ack)
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

    def _change(self, change: Change, timeout: float | None, stream: _Stream | None = None) -> Ack:
        """Sends ``change`` (on the current stream unless told one) and records rota's answer."""
        if stream is None:
            with self._lock:
                self._state.check_open()
                stream = self._stream
        ack = stream.request(change.request, self._state.timeout(timeout))
        with self._lock:
            change.record(ack)
        return ack

    def _open(self, instances: list[Instance]) -> tuple[_Stream, Ack]:
        stream = _Stream(self._stub, self._wake.set)
        try:
            ack = stream.request(convert.announce(instances), self._state.ack_timeout)
        except RotaError:
            stream.close(0)
            raise
        return stream, ack

    def _send_heartbeat(self, stream: _Stream) -> None:
        stream.send(convert.heartbeat(), acked=False)

    def _keep_alive(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(self._state.interval)
            self._wake.clear()
            if self._stopping.is_set():
                return
            stream = self._stream
            try:
                step = self._state.next_step(stream.ended.is_set(), stream.end_reason)
                if step == RECONNECT:
                    self._reconnect()
                elif step == HEARTBEAT:
                    self._send_heartbeat(stream)
                else:
                    with self._lock:
                        retry = self._state.retry()
                    self._change(retry, None, stream)
            except RotaError as error:
                self._state.step_failed(error)
                self._wake.set()

    def _reconnect(self) -> None:
        while not self._stopping.is_set():
            if self._stopping.wait(self._state.reconnect_delay()):
                return
            with self._lock:
                instances = self._state.reannouncement()
            try:
                stream, ack = self._open(instances)
            except RotaError as error:
                self._state.reconnect_failed(error)
                continue
            with self._lock:
                current = self._state.reconnected(instances, ack)
                if current:
                    self._stream = stream
            if not current:
                self._withdraw_late(stream)
            return

    def _withdraw_late(self, stream: _Stream) -> None:
        late_ack: Ack | None = None
        try:
            late_ack = stream.request(convert.withdraw(), CLOSE_TIMEOUT)
        except RotaError as error:
            self._state.withdraw_failed(error)
        with self._lock:
            self._state.withdrawn_late(late_ack)
        stream.close(0)


# ---------------------------------------------------------------------------------------------
# Watching for the local fallback
# ---------------------------------------------------------------------------------------------


class _Watcher(threading.Thread):
    """Keeps one service's :class:`InstanceCache` in step with rota through ``Watch``."""

    def __init__(self, stub: pb_grpc.RegistryStub, service: str, outage: OutageState) -> None:
        super().__init__(name=f"rota-watch-{service}", daemon=True)
        self._stub = stub
        self.following = Following(InstanceCache(service), outage)
        self.cache = self.following.cache
        self._stopping = threading.Event()
        self._call: Any = None
        self._lock = threading.Lock()

    def run(self) -> None:
        following = self.following
        while not self._stopping.is_set():
            with self._lock:
                if self._stopping.is_set():
                    return
                self._call = call = self._stub.Watch(following.request)
            following.opened()
            try:
                for message in call:
                    following.received(message)
            except grpc.RpcError as rpc_error:
                if self._stopping.is_set() or not following.interrupted(rpc_error):
                    return
            finally:
                following.ended()
            self._stopping.wait(following.next_delay())

    def stop(self) -> None:
        with self._lock:
            self._stopping.set()
            if self._call is not None:
                self._call.cancel()
