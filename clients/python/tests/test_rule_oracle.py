"""The test oracle of the leasable rules (rule_oracle.py), which the channel scenarios check rota's
rotation against: pinned sequences, and rota's own lease positions for the same tickets."""

from __future__ import annotations

import grpc

import rota
from rota._pb import rota_pb2 as pb
from rota._pb import rota_pb2_grpc as pb_grpc
from rota_harness import RotaServer
from rule_oracle import position, positions, run_length, weighted_schedule


def test_rotating_rules_follow_their_formulas() -> None:
    assert positions("round_robin", [1] * 3, 0, 7) == [0, 1, 2, 0, 1, 2, 0]
    assert positions("repeat(n=3)", [1] * 3, 0, 12) == [0, 0, 0, 1, 1, 1, 2, 2, 2, 0, 0, 0]
    assert run_length("repeat") == 3 and run_length("repeat(n=2)") == 2 and run_length("round_robin") == 1
    assert position("", [1] * 3, 2**64 - 1) == (2**64 - 1) % 3


def test_weighted_schedule_interleaves_by_earliest_deadline() -> None:
    assert weighted_schedule([5, 1, 1]) == [0, 0, 0, 1, 2, 0, 0]
    assert weighted_schedule([2, 1]) == [0, 1, 0]
    assert weighted_schedule([100, 100, 100]) == [0, 1, 2]
    assert weighted_schedule([3, 0, 1]) == [0, 0, 2, 0]
    assert weighted_schedule([300, 100, 100]) == [0, 0, 1, 2, 0]
    assert positions("weighted", [2, 1, 1], 6, 4) == [2, 0, 0, 1]


def test_the_oracle_gives_rotas_lease_positions(rota_server: RotaServer, service_name: str) -> None:
    weights = [7, 3, 0, 5, 1]
    with rota.RotaClient(rota_server.address) as client, grpc.insecure_channel(rota_server.address) as ch:
        client.register(
            *[
                rota.Instance(service=service_name, host="127.0.0.1", port=9000 + i, id=f"m{i}", weight=w)
                for i, w in enumerate(weights)
            ]
        )
        balancer = pb_grpc.BalancerStub(ch)
        for rule in ("round_robin", "repeat(n=3)", "weighted"):
            for exclude in ([], ["m1"], ["m0", "m3"]):
                request = pb.LeaseRequest(service=service_name, rule=rule, count=40, exclude=exclude)
                leased = balancer.Lease(request, timeout=20)
                listed = list(leased.instances)
                assert [i.id for i in listed] == [f"m{i}" for i in range(len(weights)) if f"m{i}" not in exclude]
                kept = [i.weight if i.HasField("weight") else 100 for i in listed]
                want = positions(leased.rule, kept, leased.first_ticket, leased.count)
                assert list(leased.positions) == want, (rule, exclude, leased.first_ticket)
