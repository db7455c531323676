"""What rota.channel sends rota, seen by a recording stand-in: its leases and reported outcomes."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

import rota
from echo_fleet import EchoFleet, echo_pb2, echo_pb2_grpc
from rota._pb import rota_pb2 as pb
from rota._pb import rota_pb2_grpc as pb_grpc
from rota._tickets import MAX_BLOCK, MIN_BLOCK


class RecordingRota(pb_grpc.BalancerServicer, pb_grpc.RegistryServicer):
    def __init__(self, instances: list[pb.Instance]) -> None:
        self.instances = instances
        self.leases: list[pb.LeaseRequest] = []
        self.outcomes: list[pb.CallOutcome] = []
        self._tickets = itertools.count(1000)
        self._lock = threading.Lock()
        self._closed = threading.Event()

    def Lease(self, request: pb.LeaseRequest, context: Any) -> pb.LeaseResponse:  # noqa: N802
        with self._lock:
            self.leases.append(request)
            first = next(self._tickets)
            for _ in range(request.count - 1):
                next(self._tickets)
        return pb.LeaseResponse(
            first_ticket=first if request.count else 0,
            count=request.count,
            instances=self.instances,
            epoch=1,
            rule="round_robin",
        )

    def Report(self, request: pb.ReportRequest, context: Any) -> pb.ReportResponse:  # noqa: N802
        with self._lock:
            self.outcomes.extend(request.outcomes)
        return pb.ReportResponse(accepted=len(request.outcomes))

    def Watch(self, request: pb.WatchRequest, context: Any) -> Iterator[pb.WatchEvent]:  # noqa: N802
        yield pb.WatchEvent(snapshot=pb.InstanceList(instances=self.instances), epoch=1)
        self._closed.wait(30)


@pytest.fixture
def recording() -> Iterator[tuple[RecordingRota, EchoFleet, str]]:
    fleet = EchoFleet()
    instances = [
        pb.Instance(id=i, service="echo", host="127.0.0.1", port=fleet.start(i)) for i in ("echo-a", "echo-b", "echo-c")
    ]
    fake = RecordingRota(instances)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pb_grpc.add_BalancerServicer_to_server(fake, server)
    pb_grpc.add_RegistryServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield fake, fleet, f"127.0.0.1:{port}"
    finally:
        fake._closed.set()
        server.stop(None).wait(10)
        fleet.close()


def test_every_call_is_reported_with_its_ticket(recording: tuple[RecordingRota, EchoFleet, str]) -> None:
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
