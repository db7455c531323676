"""The rota side of a ``rota:///SERVICE`` channel: the service's instances through ``Watch``,
one :class:`~rota._tickets.Rotation` per version asked for, leases, and batched outcome reports.

It runs on its own threads and a plain gRPC channel to rota, so that the sync and the asyncio
channels share it; the channels own the connections to the instances.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import parse_qs, urlsplit

import grpc

from ._pb import rota_pb2 as pb
from ._pb import rota_pb2_grpc as pb_grpc
from ._reports import Outcome, OutcomeBuffer
from ._rota_connection import RotaConnection
from ._settings import CHANNEL_OPTIONS
from ._tickets import WAIT, Draw, Lease, Member, Refused, Rotation, UnusableLease, excluded_ids
from .errors import error_reason

log = logging.getLogger("rota.channel")

DEFAULT_SERVER = "127.0.0.1:50051"
VERSION_HEADER = "x-rota-version"
TICKET_HEADER = "x-rota-ticket"
LEASE_TIMEOUT = 2.0
#: rota's answers to a Watch that no retry changes: the calls of the channel fail with them.
REFUSING_CODES = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})


def parse_target(target: str, server: str | None, rule: str | None, version: str | None) -> tuple[str, str, str, str]:
    """(service, rota server, rule, version) of ``rota:///SERVICE`` or ``rota://HOST:PORT/SERVICE?rule=..``.

    The rule goes to rota as it is: rota refuses one it cannot lease, and the calls fail with its answer.
    """
    parts = urlsplit(target)
    if parts.scheme != "rota" or not parts.path.strip("/") or "/" in parts.path.strip("/"):
        raise ValueError(f"a rota channel target is rota:///SERVICE, got {target!r}")
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    chosen_server = parts.netloc or server or os.environ.get("ROTA_SERVER") or DEFAULT_SERVER
    chosen_rule = rule if rule is not None else query.get("rule", "")
    chosen_version = version if version is not None else query.get("version", "")
    return parts.path.strip("/"), chosen_server, chosen_rule, chosen_version


class NoInstance(Exception):
    """No instance can take the call now (none known, or none usable)."""


class Router:
    """Routes calls of one service: ``route(version, usable)`` returns a :class:`Draw`.

    ``usable`` says whether an instance may take a call now (the channel sets it); every lease
    names the known instances it refuses in ``exclude``.
    """

    def __init__(self, service: str, connection: RotaConnection, rule: str, version: str) -> None:
        self.service = service
        self.server = connection.target
        self.rule = rule
        self.version = version
        self._channel: grpc.Channel = connection.dial(grpc, CHANNEL_OPTIONS)
        self._balancer = pb_grpc.BalancerStub(self._channel)
        self._registry = pb_grpc.RegistryStub(self._channel)
        self._lock = threading.Condition()
        self._members: dict[str, Member] = {}
        self._synced = False
        self._watch_error = ""
        # rota's refusal of the watch itself (UNAUTHENTICATED, PERMISSION_DENIED): calls fail with it.
        self._watch_refusal: Refused | None = None
        self._rotations: dict[str, Rotation] = {}
        self._listeners: list[Callable[[dict[str, Member]], None]] = []
        self._closed = threading.Event()
        self.lease_calls = 0
        self.usable: Callable[[str], bool] = lambda _: True
        self._watch_call: grpc.Future[Any] | None = None
        self.outcomes = OutcomeBuffer(self._send_report, f"rota-report-{service}")
        self._watch_thread = threading.Thread(target=self._watch_loop, name=f"rota-watch-{service}", daemon=True)
        self._watch_thread.start()

    # --- instances ---------------------------------------------------------------------------

    def members(self) -> dict[str, Member]:
        with self._lock:
            return dict(self._members)

    def has_members(self) -> bool:
        """Whether an instance is known; a plain read (the dict is replaced, never changed in place)."""
        return bool(self._members)

    def on_members(self, listener: Callable[[dict[str, Member]], None]) -> None:
        with self._lock:
            self._listeners.append(listener)
            members = dict(self._members)
        listener(members)

    def wait_synced(self, timeout: float) -> None:
        """Waits for the first instance list; raises :class:`NoInstance` naming the service if there is none."""
        with self._lock:
            self._lock.wait_for(lambda: self._synced or bool(self._watch_error) or self._closed.is_set(), timeout)
            if self._members:
                return
            if self._watch_refusal is not None and not self._synced:
                raise self._watch_refusal
            if self._synced:
                raise NoInstance(f"rota at {self.server} has no UP instance of service {self.service!r}")
            raise NoInstance(
                f"cannot watch service {self.service!r} at rota {self.server}: {self._watch_error or 'no answer yet'}"
            )

    def _watch_loop(self) -> None:
        failures = 0
        ever_synced = False
        holding_stale = False
        while not self._closed.is_set():
            try:
                call = self._registry.Watch(pb.WatchRequest(service=self.service))
                self._watch_call = call
                for event in call:
                    kind = event.WhichOneof("event")
                    with self._lock:
                        members = dict(self._members)
                        if kind == "snapshot":
                            failures = 0
                            self._watch_refusal = None
                            if not event.snapshot.instances and ever_synced and members:
                                # rota restarted: its registry fills again as providers announce.
                                holding_stale = True
                                log.info(
                                    "rota lists no instance of %s after a reconnect; keeping the last known",
                                    self.service,
                                )
                            else:
                                holding_stale = False
                                members = {i.id: _member(i) for i in event.snapshot.instances if _up(i)}
                            ever_synced = True
                            self._synced = True
                        elif kind in ("added", "updated"):
                            if holding_stale:
                                holding_stale = False
                                members = {}
                            instance = event.added if kind == "added" else event.updated
                            if _up(instance):
                                members[instance.id] = _member(instance)
                            else:
                                members.pop(instance.id, None)
                        elif kind == "removed" and not holding_stale:
                            members.pop(event.removed.id, None)
                        self._publish(members)
            except grpc.RpcError as error:
                with self._lock:
                    self._watch_error = f"{error.code().name}: {error.details()}"
                    if error.code() in REFUSING_CODES:
                        self._watch_refusal = Refused(error.code(), error.details() or "")
                    self._lock.notify_all()
                    rotations = list(self._rotations.values())
                if ever_synced and not self._closed.is_set():
                    # rota is gone (or restarting with a new counter): stop drawing held tickets.
                    for rotation in rotations:
                        rotation.lost()
                if failures == 0 and ever_synced and not self._closed.is_set():
                    log.warning(
                        "watch of %s at rota %s ended (%s); keeping %d last known instances, reconnecting",
                        self.service,
                        self.server,
                        self._watch_error,
                        len(self._members),
                    )
            failures += 1
            self._closed.wait(random.uniform(0, min(5.0, 0.1 * 2 ** min(failures, 6))))

    def _publish(self, members: dict[str, Member]) -> None:
        changed = members.keys() != self._members.keys()
        self._members = members
        self._lock.notify_all()
        listeners = list(self._listeners)
        for listener in listeners:
            listener(dict(members))
        if changed:
            for rotation in list(self._rotations.values()):
                count = rotation.refresh()
                if count is not None:
                    self._lease(rotation, count)

    # --- routing -----------------------------------------------------------------------------

    def rotation(self, version: str | None) -> Rotation:
        key = self.version if version is None else version
        with self._lock:
            rotation = self._rotations.get(key)
            if rotation is None:
                # A plain read of the known list (replaced, never changed in place): a rotation
                # reads it under its own lock, which a list change takes under the router's.
                rotation = Rotation(self.rule, key, lambda: list(self._members.values()))
                self._rotations[key] = rotation
            return rotation

    def draw(self, rotation: Rotation, usable: Callable[[str], bool]) -> Draw | str | Refused:
        """One decision: a Draw, WAIT (no lease yet), NONE_USABLE, or rota's refusal; never blocks."""
        decision, count = rotation.draw(usable)
        if count is not None:
            self._lease(rotation, count)
        return decision

    def route(self, version: str | None, usable: Callable[[str], bool], timeout: float) -> Draw:
        """A Draw for one call, waiting up to ``timeout`` for a lease when none holds a usable ticket."""
        deadline = time.monotonic() + timeout
        rotation = self.rotation(version)
        while True:
            decision = self.draw(rotation, usable)
            if isinstance(decision, Draw):
                return decision
            if isinstance(decision, Refused):
                raise decision
            if decision != WAIT:
                raise NoInstance(f"no instance of {self.service} is reachable")
            with self._lock:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise NoInstance(f"no lease from rota at {self.server} within {timeout:.1f}s")
                self._lock.wait(min(left, 0.05))

    def _lease(self, rotation: Rotation, count: int) -> None:
        self.lease_calls += 1
        # The known instances the channel cannot use now: rota maps the tickets over the others.
        exclude = rotation.exclusion(excluded_ids(self._members, self.usable))
        request = pb.LeaseRequest(
            service=self.service, rule=rotation.rule, version=rotation.version, count=count, exclude=exclude
        )
        future = self._balancer.Lease.future(request, timeout=LEASE_TIMEOUT)
        future.add_done_callback(lambda f: self._leased(rotation, f, exclude))

    def _leased(self, rotation: Rotation, future: grpc.Future[Any], exclude: list[str]) -> None:
        try:
            lease = lease_of(future.result())
        except grpc.RpcError as error:
            answered = bool(error_reason(error))
            if answered and exclude:
                # rota refuses a lease excluding every eligible instance (under gray release:
                # every instance of one version); it took no ticket. The same lease without
                # exclude: the calls pass over the unusable instances' tickets themselves.
                self._lease(rotation, rotation.refused_excluding(exclude))
                return
            self._failed(rotation, error.code(), error.details() or "", answered)
        except UnusableLease as problem:
            # An answer the channel cannot route by fails like rota's refusal, naming the problem.
            details = f"{problem} (service {self.service!r})"
            log.warning("%s", details)
            self._failed(rotation, grpc.StatusCode.UNAVAILABLE, details, True)
        else:
            follow_up, recovered = rotation.leased(lease)
            if recovered:
                log.info("rota reachable again: %s routed by leased tickets", self.service)
            if follow_up is not None:
                self._lease(rotation, follow_up)
        with self._lock:
            self._lock.notify_all()

    def _failed(self, rotation: Rotation, code: grpc.StatusCode, details: str, answered_by_rota: bool) -> None:
        if rotation.failed(Refused(code, details), answered_by_rota=answered_by_rota):
            log.warning(
                "rota at %s refused or unreachable (%s: %s); routing %s by a local rotation over "
                "the last known instances",
                self.server,
                code.name,
                details,
                self.service,
            )

    # --- outcomes ----------------------------------------------------------------------------

    def report(self, draw: Draw, latency_ns: int, result: pb.CallResult) -> None:
        """Queues a call's outcome; never blocks the call (see :mod:`rota._reports`)."""
        ticket = 0 if draw.local else draw.ticket
        self.outcomes.add(Outcome(draw.member.id, ticket, draw.rule, latency_ns // 1000, result))

    def _send_report(self, batch: Sequence[Outcome]) -> bool:
        request = pb.ReportRequest(
            outcomes=[
                pb.CallOutcome(
                    service=self.service,
                    instance_id=o.instance_id,
                    ticket=o.ticket,
                    rule=o.rule,
                    latency_us=o.latency_us,
                    result=o.result,
                    # No unary pick counted this call in flight at rota.
                    leased=True,
                )
                for o in batch
            ]
        )
        try:
            self._balancer.Report(request, timeout=LEASE_TIMEOUT)
        except grpc.RpcError as error:
            log.debug("%d outcomes not reported yet: %s", len(batch), error)
            return False
        return True

    def close(self) -> None:
        self._closed.set()
        if self._watch_call is not None:
            self._watch_call.cancel()
        self.outcomes.close(timeout=LEASE_TIMEOUT + 1)
        self._channel.close()


def _up(instance: pb.Instance) -> bool:
    return instance.status in (pb.UP, pb.INSTANCE_STATUS_UNSPECIFIED)


def _member(instance: pb.Instance) -> Member:
    return Member(
        id=instance.id,
        host=instance.host,
        port=instance.port,
        version=instance.version,
        weight=instance.weight if instance.HasField("weight") else 100,
    )


def lease_of(response: pb.LeaseResponse) -> Lease:
    """A lease answer as the rotation takes it: a ticket range with its positions, or rota's
    picks (``picks`` set).

    A ticket range whose positions are not one per ticket, each naming one of ``instances``,
    raises :class:`~rota._tickets.UnusableLease`. A pick naming a position outside
    ``instances`` cannot be routed and is left out.
    """
    members = [_member(i) for i in response.instances]
    if not response.picks:
        return Lease(response.first_ticket, response.count, members, response.rule, list(response.positions))
    picks = [(p.ticket, members[p.position]) for p in response.picks if p.position < len(members)]
    return Lease(0, 0, members, response.rule, picks=picks)
