"""rota.channel and rota.aio.channel against a scripted rota (a Python gRPC server on a loopback
port) that answers versionless leases with picks, as rota does for a service under gray release:
the calls follow the picks exactly, report their tickets, and drop held picks when the instance
list changes. The scripted server makes each lease's picks known in advance, so every call is
checked against the pick it must have used."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from echo_fleet import EchoFleet, Received
from rota._pb import rota_pb2 as pb
from rota._pb import rota_pb2_grpc as pb_grpc
from rota_harness import wait_until
from test_channel_conformance import AioConsumer, SyncConsumer

IDS = ["echo-a", "echo-b", "echo-v"]
PATIENCE = 10.0


def position(k: int, n: int) -> int:
    """The instance of pick k: backwards through the list, unlike any ticket mapping."""
    return n - 1 - k % n


def ticket(k: int) -> int:
    """The ticket of pick k: not k, as a channel numbering its calls would report."""
    return 1000 + 7 * k


class ScriptedRota(pb_grpc.RegistryServicer, pb_grpc.BalancerServicer):
    """Watch: a snapshot, then the events pushed with :meth:`push`. Lease without a version:
    ``count`` picks; pick k (counted over the server's life) names :func:`position` of the
    current n instances, with ticket :func:`ticket`. Report: every outcome kept."""

    def __init__(self, instances: list[pb.Instance]) -> None:
        self.lock = threading.Lock()
        self.instances = {i.id: i for i in instances}
        self.watchers: list[queue.Queue[pb.WatchEvent | None]] = []
        self.leases: list[tuple[pb.LeaseRequest, range]] = []
        self.outcomes: list[pb.CallOutcome] = []
        self.next_pick = 0
        self.epoch = 1

    def listed(self) -> list[pb.Instance]:
        return [self.instances[i] for i in sorted(self.instances)]

    def push(self, event: pb.WatchEvent) -> None:
        with self.lock:
            self.epoch += 1
            event.epoch = self.epoch
            if event.WhichOneof("event") == "removed":
                del self.instances[event.removed.id]
            for watcher in self.watchers:
                watcher.put(event)

    def Watch(self, request: pb.WatchRequest, context: grpc.ServicerContext) -> Iterator[pb.WatchEvent]:  # noqa: N802
        events: queue.Queue[pb.WatchEvent | None] = queue.Queue()
        with self.lock:
            self.watchers.append(events)
            snapshot = pb.WatchEvent(snapshot=pb.InstanceList(instances=self.listed()), epoch=self.epoch)
        context.add_callback(lambda: events.put(None))
        yield snapshot
        while (event := events.get()) is not None:
            yield event

    def Lease(self, request: pb.LeaseRequest, context: grpc.ServicerContext) -> pb.LeaseResponse:  # noqa: N802
        with self.lock:
            listed = self.listed()
            if request.version or request.count == 0:
                self.leases.append((request, range(0)))
                return pb.LeaseResponse(instances=listed, rule="round_robin", epoch=self.epoch)
            first = self.next_pick
            self.next_pick += request.count
            self.leases.append((request, range(first, self.next_pick)))
            n = len(listed)
            picks = [pb.LeasedPick(ticket=ticket(k), position=position(k, n)) for k in range(first, self.next_pick)]
            return pb.LeaseResponse(count=request.count, instances=listed, rule="round_robin", picks=picks)

    def Report(self, request: pb.ReportRequest, context: grpc.ServicerContext) -> pb.ReportResponse:  # noqa: N802
        with self.lock:
            self.outcomes.extend(request.outcomes)
        return pb.ReportResponse(accepted=len(request.outcomes))


@pytest.fixture
def scripted() -> Iterator[tuple[ScriptedRota, str, EchoFleet]]:
    fleet = EchoFleet()
    instances = [
        pb.Instance(service="echo", id=i, host="127.0.0.1", port=fleet.start(i), version="v2" if i == "echo-v" else "")
        for i in IDS
    ]
    rota = ScriptedRota(instances)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pb_grpc.add_RegistryServicer_to_server(rota, server)
    pb_grpc.add_BalancerServicer_to_server(rota, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield rota, f"127.0.0.1:{port}", fleet
    finally:
        server.stop(None).wait(10)
        fleet.close()


def tickets(received: list[Received]) -> list[int]:
    assert all(r.ticket is not None and r.ticket.isdigit() for r in received), [r.ticket for r in received]
    return [int(r.ticket or "") for r in received]


@pytest.mark.parametrize("flavour", ["sync", "aio"])
def test_calls_follow_rotas_picks_and_drop_them_when_the_list_changes(
    scripted: tuple[ScriptedRota, str, EchoFleet], flavour: str
) -> None:
    rota, address, fleet = scripted
    target = f"rota://{address}/echo"
    consumer = SyncConsumer(target, "round_robin") if flavour == "sync" else AioConsumer(target, "round_robin")
    try:
        for _ in range(40):
            assert consumer.call("", 5000) is None
        # Every pick used once, in order: call k went to pick k's instance with pick k's ticket.
        before = list(fleet.received)
        assert tickets(before) == [ticket(k) for k in range(40)]
        assert [r.instance for r in before] == [IDS[position(k, 3)] for k in range(40)]
        assert all(request.version == "" and request.count > 0 for request, _ in rota.leases)
        held = max(k for _, given in rota.leases for k in given)
        assert held >= 40, "the next block was leased before this one ran out"

        leases_before = len(rota.leases)
        rota.push(pb.WatchEvent(removed=pb.InstanceRef(service="echo", id="echo-b")))
        router = consumer.channel.router
        assert wait_until(lambda: "echo-b" not in router.members(), PATIENCE)
        for _ in range(20):
            assert consumer.call("", 5000) is None
        after = fleet.received[len(before) :]
        assert "echo-b" not in {r.instance for r in after}
        # The picks held when the list changed were dropped: every later call used a pick of a
        # block leased after the change, and that lease asked for picks, not for no tickets.
        assert min(tickets(after)) > ticket(held), (held, tickets(after))
        assert rota.leases[leases_before][0].count > 0
        assert tickets(after) == sorted(tickets(after)) and len(set(tickets(after))) == 20
        picks = [((t - 1000) // 7, r.instance) for t, r in zip(tickets(after), after, strict=True)]
        assert all(instance == ["echo-a", "echo-v"][position(k, 2)] for k, instance in picks), picks
    finally:
        consumer.close()
    reported = sorted(o.ticket for o in rota.outcomes)
    assert reported == sorted(tickets(fleet.received)), "each call reports the ticket of its pick"
    assert all(o.leased and o.rule == "round_robin" for o in rota.outcomes)
