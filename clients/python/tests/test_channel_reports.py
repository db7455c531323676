"""What rota.channel sends rota, seen by a recording stand-in, and how it follows the stand-in's
answers: its leases (with the unusable instances in ``exclude``), the positions it routes by, an
answer it cannot use, and the reported outcomes."""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

import rota
from echo_fleet import EchoFleet, echo_pb2, echo_pb2_grpc
from rota._pb import rota_pb2 as pb
from rota._pb import rota_pb2_grpc as pb_grpc
from rota._tickets import MAX_BLOCK, MIN_BLOCK
from test_channel_conformance import AioConsumer, SyncConsumer


def backwards(ticket: int, n: int) -> int:
    """The stand-in's positions: no rule's, so that only indexing them reaches the right instance."""
    return n - 1 - ticket % n


class RecordingRota(pb_grpc.BalancerServicer, pb_grpc.RegistryServicer):
    """Watch: one snapshot. Lease: tickets from 1000 on, over the instances not excluded, ticket
    t at :func:`backwards`; ``short`` answers one position too few, ``refuse_excluding`` refuses
    every lease that excludes an instance, as rota does. Report: every outcome kept."""

    def __init__(self, instances: list[pb.Instance], short: bool = False, refuse_excluding: bool = False) -> None:
        self.instances = instances
        self.short = short
        self.refuse_excluding = refuse_excluding
        self.leases: list[pb.LeaseRequest] = []
        self.outcomes: list[pb.CallOutcome] = []
        self._tickets = itertools.count(1000)
        self._lock = threading.Lock()
        self._closed = threading.Event()

    def Lease(self, request: pb.LeaseRequest, context: Any) -> pb.LeaseResponse:  # noqa: N802
        with self._lock:
            self.leases.append(request)
            if self.refuse_excluding and request.exclude:
                # As rota refuses a lease excluding every eligible instance (of a gray version).
                context.set_trailing_metadata((("rota-error", "no_eligible_instance"),))
                context.abort(grpc.StatusCode.UNAVAILABLE, "no eligible instance that is not excluded")
            first = next(self._tickets)
            for _ in range(request.count - 1):
                next(self._tickets)
        listed = [i for i in self.instances if i.id not in request.exclude]
        first = first if request.count else 0
        positions = [backwards(t, len(listed)) for t in range(first, first + request.count)]
        return pb.LeaseResponse(
            first_ticket=first,
            count=request.count,
            instances=listed,
            epoch=1,
            rule="round_robin",
            positions=positions[1:] if self.short else positions,
        )

    def Report(self, request: pb.ReportRequest, context: Any) -> pb.ReportResponse:  # noqa: N802
        with self._lock:
            self.outcomes.extend(request.outcomes)
        return pb.ReportResponse(accepted=len(request.outcomes))

    def Watch(self, request: pb.WatchRequest, context: Any) -> Iterator[pb.WatchEvent]:  # noqa: N802
        yield pb.WatchEvent(snapshot=pb.InstanceList(instances=self.instances), epoch=1)
        self._closed.wait(30)


Recording = tuple[RecordingRota, EchoFleet, str]


def serve(fake: RecordingRota) -> tuple[grpc.Server, str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pb_grpc.add_BalancerServicer_to_server(fake, server)
    pb_grpc.add_RegistryServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
def recording_with() -> Iterator[Callable[..., Recording]]:
    """Starts a stand-in over echo servers of these ids (``None`` as port: registered at a port
    nothing listens on)."""
    started: list[tuple[RecordingRota, grpc.Server, EchoFleet]] = []

    def start(
        ids: tuple[str, ...] = ("echo-a", "echo-b", "echo-c"), unreachable: tuple[str, ...] = (), **kw: Any
    ) -> Recording:
        fleet = EchoFleet()
        instances = [
            pb.Instance(
                id=i, service="echo", host="127.0.0.1", port=fleet.unreachable() if i in unreachable else fleet.start(i)
            )
            for i in ids
        ]
        fake = RecordingRota(instances, **kw)
        server, address = serve(fake)
        started.append((fake, server, fleet))
        return fake, fleet, address

    try:
        yield start
    finally:
        for fake, server, fleet in started:
            fake._closed.set()
            server.stop(None).wait(10)
            fleet.close()


@pytest.fixture
def recording(recording_with: Callable[..., Recording]) -> Recording:
    return recording_with()


def test_every_call_is_reported_with_its_ticket(recording: Recording) -> None:
    fake, fleet, address = recording
    with rota.channel(f"rota://{address}/echo", ticket_header=True) as channel:
        stub = echo_pb2_grpc.EchoStub(channel)
        for i in range(300):
            stub.Echo(echo_pb2.EchoRequest(message=str(i)), timeout=20)
        deadline = time.monotonic() + 20
        while len(fake.outcomes) < 300:
            assert time.monotonic() < deadline, f"{len(fake.outcomes)} outcomes reported"
            time.sleep(0.02)
    received = {int(r.ticket or "-1"): r.instance for r in fleet.received}
    assert len(fake.outcomes) == 300
    for outcome in fake.outcomes:
        assert outcome.result == pb.CALL_RESULT_OK and outcome.service == "echo" and outcome.rule == "round_robin"
        assert received[outcome.ticket] == outcome.instance_id
        assert outcome.latency_us > 0
        assert outcome.leased, "a leased call never counted in flight at rota"
    counts = [lease.count for lease in fake.leases if lease.count]
    assert all(MIN_BLOCK <= c <= MAX_BLOCK for c in counts), counts
    assert sum(counts) >= 300


def test_calls_go_to_the_positions_rota_sent(recording: Recording) -> None:
    fake, fleet, address = recording
    with rota.channel(f"rota://{address}/echo", ticket_header=True) as channel:
        stub = echo_pb2_grpc.EchoStub(channel)
        for i in range(100):
            stub.Echo(echo_pb2.EchoRequest(message=str(i)), timeout=20)
    ids = [i.id for i in fake.instances]
    reached = [(int(r.ticket or "-1"), r.instance) for r in fleet.received]
    assert len(reached) == 100 and all(instance == ids[backwards(t, 3)] for t, instance in reached), reached
    assert any(instance != ids[t % 3] for t, instance in reached), "not round robin's t mod 3"
    assert all(not lease.exclude for lease in fake.leases), "every instance was usable"


def test_leases_exclude_an_instance_the_channel_cannot_reach(recording_with: Callable[..., Recording]) -> None:
    # echo-c is registered at a port nothing listens on: once a call to it could not connect
    # (and went to the next ticket), the leases name it in exclude, and the stand-in positions
    # their tickets over echo-a and echo-b.
    fake, fleet, address = recording_with(unreachable=("echo-c",))
    with rota.channel(f"rota://{address}/echo", ticket_header=True) as channel:
        stub = echo_pb2_grpc.EchoStub(channel)
        for i in range(200):
            stub.Echo(echo_pb2.EchoRequest(message=str(i)), timeout=20)
        router = channel.router
        assert router.lease_calls == len(fake.leases)
    excluding = [lease for lease in fake.leases if lease.exclude]
    assert excluding, [list(lease.exclude) for lease in fake.leases]
    assert all(list(lease.exclude) == ["echo-c"] for lease in excluding)
    counts = Counter(r.instance for r in fleet.received)
    assert set(counts) == {"echo-a", "echo-b"} and sum(counts.values()) == 200
    assert abs(counts["echo-a"] - counts["echo-b"]) <= 20, counts


@pytest.mark.parametrize("flavour", ["sync", "aio"])
def test_an_answer_the_channel_cannot_use_fails_the_calls_naming_it(
    recording_with: Callable[..., Recording], flavour: str
) -> None:
    fake, fleet, address = recording_with(short=True)
    target = f"rota://{address}/echo"
    consumer = SyncConsumer(target, "round_robin") if flavour == "sync" else AioConsumer(target, "round_robin")
    try:
        failures = [consumer.call("", 5000) for _ in range(3)]
    finally:
        consumer.close()
    assert all(f is not None and "positions for" in f and "cannot route by it" in f for f in failures), failures
    assert fleet.received == [], "no call was sent"


def test_a_lease_refused_for_its_exclude_is_asked_again_without_it(recording_with: Callable[..., Recording]) -> None:
    fake, fleet, address = recording_with(unreachable=("echo-c",), refuse_excluding=True)
    with rota.channel(f"rota://{address}/echo", ticket_header=True) as channel:
        stub = echo_pb2_grpc.EchoStub(channel)
        for i in range(200):
            stub.Echo(echo_pb2.EchoRequest(message=str(i)), timeout=20)
    excludes = [list(lease.exclude) for lease in fake.leases]
    refused = [k for k, e in enumerate(excludes) if e]
    assert refused, excludes
    # Each refused lease is followed at once by the same lease without exclude, and the set
    # rota refused is not sent again.
    assert all(k + 1 < len(excludes) and excludes[k + 1] == [] for k in refused), excludes
    assert len(refused) == 1, excludes
    counts = Counter(r.instance for r in fleet.received)
    assert set(counts) == {"echo-a", "echo-b"} and sum(counts.values()) == 200, counts
