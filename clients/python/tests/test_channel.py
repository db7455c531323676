"""rota.channel / rota.aio.channel against a live rota server and echo servers on loopback ports.

Every echo server records the ticket of each call (``ticket_header=True``), so the tests check
the rotation ticket by ticket: no ticket is used twice across channels, and each reached the
instance rota's rule maps it to.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

import rota
import rota.aio
from echo_fleet import KINDS, EchoFleet, Received, echo_pb2, echo_pb2_grpc
from rota._pb import rota_pb2 as pb
from rota._pb import rota_pb2_grpc as pb_grpc
from rota._tickets import Eligible, Member, TicketMapping, weighted_schedule
from rota_harness import RotaServer

IDS = ["echo-a", "echo-b", "echo-c"]


def letters(mapping: TicketMapping, count: int, excluded: list[bool] | None = None) -> str:
    return "".join(chr(ord("A") + mapping.map(t, excluded)) for t in range(count))


def test_rotating_rules_follow_their_formulas() -> None:
    assert letters(TicketMapping("round_robin", [1] * 3), 7) == "ABCABCA"
    assert letters(TicketMapping("repeat(n=3)", [1] * 3), 12) == "AAABBBCCCAAA"
    assert letters(TicketMapping("repeat", [1] * 3), 9) == "AAABBBCCC"
    assert letters(TicketMapping("round_robin", [1] * 4), 6, [False, True, False, False]) == "ACDACD"
    assert TicketMapping("round_robin", [1, 1]).map(3, [True, True]) == -1
    assert TicketMapping("round_robin", [1] * 3).map(2**64 - 1) == (2**64 - 1) % 3


def test_weighted_schedule_interleaves_by_earliest_deadline() -> None:
    assert weighted_schedule([5, 1, 1]) == [0, 0, 0, 1, 2, 0, 0]
    assert weighted_schedule([2, 1]) == [0, 1, 0]
    assert weighted_schedule([100, 100, 100]) == [0, 1, 2]
    assert weighted_schedule([3, 0, 1]) == [0, 0, 2, 0]
    assert weighted_schedule([0, 0]) == []
    with pytest.raises(ValueError, match="cannot be leased"):
        TicketMapping("random", [1])


def around(mapping: TicketMapping, count: int, unusable: list[bool]) -> str:
    return "".join(chr(ord("A") + mapping.around(t, unusable)) for t in range(count))


def test_an_unusable_instances_tickets_are_shared_evenly_by_the_others() -> None:
    rr = TicketMapping("round_robin", [1] * 3)
    # echo-c's tickets (2, 5, 8, ...) alternate between A and B; the others keep their own.
    assert around(rr, 18, [False, False, True]) == "ABAABB" * 3
    assert Counter(around(rr, 18, [False, False, True])) == {"A": 9, "B": 9}, "half each over 6 cycles"
    assert around(rr, 12, [True, False, False]) == "BBCCBC" * 2
    # Two of four: each usable one takes one of them per cycle, in turn.
    assert around(TicketMapping("round_robin", [1] * 4), 8, [False, True, False, True]) == "AACC" * 2
    assert around(rr, 9, [False] * 3) == letters(rr, 9), "nothing unusable: the plain mapping"
    assert rr.around(7, [True] * 3) == -1
    assert TicketMapping("weighted", []).around(0, []) == -1


def test_repeat_keeps_its_runs_whole_around_an_unusable_instance() -> None:
    rep = TicketMapping("repeat(n=3)", [1] * 3)
    mapped = around(rep, 54, [False, False, True])
    assert mapped[:18] == "AAABBBAAA" + "AAABBBBBB"
    assert all(len(set(mapped[k : k + 3])) == 1 for k in range(0, 54, 3)), mapped
    assert Counter(mapped) == {"A": 27, "B": 27}


def test_weighted_keeps_the_usable_instances_proportions() -> None:
    weighted = TicketMapping("weighted", [2, 1, 1])  # schedule [0, 1, 2, 0]
    mapped = around(weighted, 4 * 3 * 5, [False, True, False])
    assert Counter(mapped) == {"A": 40, "C": 20}, "2 : 1, as the weights"
    assert around(weighted, 8, [False, True, False]) == "AACA" + "ACCA"


@pytest.mark.parametrize("rule", ["round_robin", "repeat(n=2)", "weighted"])
def test_over_as_many_cycles_as_usable_slots_every_usable_slot_gets_a_whole_cycle(rule: str) -> None:
    # The property the mapping is chosen for, over many unusable sets: in |A| cycles each usable
    # slot takes its own |A| tickets and |D| of the unusable ones, |S| in all.
    weights = [3, 1, 2, 1, 1]
    mapping = TicketMapping(rule, weights)
    slots = weighted_schedule(weights) if rule == "weighted" else list(range(len(weights)))
    unit = 2 if rule == "repeat(n=2)" else 1
    for mask in range(1, 2 ** len(weights) - 1):
        unusable = [bool(mask >> i & 1) for i in range(len(weights))]
        usable_slots = sum(1 for p in slots if not unusable[p])
        tickets = usable_slots * len(slots) * unit
        reached = Counter(mapping.around(t, unusable) for t in range(7 * tickets, 8 * tickets))
        expected = Counter({p: slots.count(p) * len(slots) * unit for p in range(len(weights)) if not unusable[p]})
        assert reached == expected, (rule, unusable)


def test_local_mapping_matches_rotas_pick(rota_server: RotaServer, service_name: str) -> None:
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
            listing = balancer.Lease(pb.LeaseRequest(service=service_name, rule=rule), timeout=20)
            members = [
                Member(i.id, i.host, i.port, i.version, i.weight if i.HasField("weight") else 100)
                for i in listing.instances
            ]
            eligible = Eligible(members, listing.rule)
            for n in range(40):
                exclude = f"m{n % len(weights)}" if n % 4 == 3 else None
                pick = balancer.Pick(
                    pb.PickRequest(service=service_name, rule=rule, exclude=[exclude] if exclude else []), timeout=20
                )

                def usable(id_: str, ex: str | None = exclude) -> bool:
                    return id_ != ex

                excluded = eligible.excluded(usable) if exclude else None
                local = eligible.map(pick.ticket, excluded)
                assert local is not None and local.id == pick.instance.id, (rule, pick.ticket, exclude)


@pytest.fixture
def fleet(private_server: Callable[..., RotaServer]) -> Iterator[tuple[RotaServer, EchoFleet, Any, dict[str, Any]]]:
    server = private_server()
    echo = EchoFleet()
    instances = {i: rota.Instance(service="echo", host="127.0.0.1", port=echo.start(i), id=i) for i in IDS}
    client = rota.RotaClient(server.address)
    registration = client.register(*instances.values())
    try:
        yield server, echo, registration, instances
    finally:
        client.close()
        echo.close()


def stub(server: RotaServer, rule: str = "round_robin", **kwargs: Any) -> tuple[Any, rota.RotaChannel]:
    ch = rota.channel(f"rota://{server.address}/echo", rule=rule, ticket_header=True, **kwargs)
    return echo_pb2_grpc.EchoStub(ch), ch


def echo(s: Any, message: str = "hi", **kwargs: Any) -> str:
    return str(s.Echo(echo_pb2.EchoRequest(message=message), timeout=20, **kwargs).instance_id)


def leased_tickets(received: list[Received]) -> dict[int, str]:
    tickets: dict[int, str] = {}
    for r in received:
        assert r.ticket is not None, "every call carries its ticket"
        if r.ticket.startswith("L"):
            continue
        assert int(r.ticket) not in tickets, f"ticket {r.ticket} used twice"
        tickets[int(r.ticket)] = r.instance
    return tickets


@pytest.mark.parametrize(("rule", "group"), [("round_robin", 1), ("repeat(n=3)", 3)])
def test_two_channels_share_one_rotation(fleet: Any, rule: str, group: int) -> None:
    server, echoes, _, _ = fleet
    first, ch1 = stub(server, rule)
    second, ch2 = stub(server, rule)
    with ch1, ch2:
        for i in range(300):
            echo(first if i % 2 == 0 else second, f"rpc {i}")
    tickets = leased_tickets(echoes.received)
    assert len(tickets) == 300
    cycle = group * len(IDS)
    complete = 0
    for t, instance in tickets.items():
        assert instance == IDS[(t // group) % len(IDS)], (rule, t)
        if t % cycle == 0 and all(t + k in tickets for k in range(cycle)):
            shares = Counter(tickets[t + k] for k in range(cycle))
            assert shares == dict.fromkeys(IDS, group), (t, shares)
            complete += 1
    assert complete >= 300 // cycle // 2, complete


def test_version_metadata_reaches_only_that_version(fleet: Any) -> None:
    server, echoes, registration, _ = fleet
    registration.announce(
        rota.Instance(service="echo", host="127.0.0.1", port=echoes.start("echo-zlt"), id="echo-zlt", version="zlt")
    )
    s, ch = stub(server)
    with ch:
        plain = set()
        for i in range(30):
            assert echo(s, f"zlt {i}", metadata=[("x-rota-version", "zlt")]) == "echo-zlt"
            plain.add(echo(s, f"plain {i}"))
        with rota.use_version("zlt"):  # the version of the request being handled
            assert echo(s, "current") == "echo-zlt"
    assert plain == set(IDS)


def test_withdrawn_instance_stops_receiving_within_one_second(fleet: Any) -> None:
    server, echoes, registration, instances = fleet
    s, ch = stub(server)
    with ch:
        for i in range(30):
            echo(s, f"before {i}")
        registration.withdraw(instances["echo-c"])
        withdrawn = time.monotonic()
        while time.monotonic() - withdrawn < 2.0:
            echo(s, "after")
    late = Counter(r.instance for r in echoes.since(withdrawn + 1.0))
    assert "echo-c" not in late, late
    assert late["echo-a"] > 0 and late["echo-b"] > 0, late


def test_killed_instance_is_skipped_without_failing_calls(fleet: Any) -> None:
    server, echoes, _, _ = fleet
    s, ch = stub(server)
    with ch:
        for i in range(30):
            echo(s, f"before {i}")
        echoes.kill("echo-c")
        reached = Counter(echo(s, f"after {i}") for i in range(200))
    assert set(reached) == {"echo-a", "echo-b"}


def test_rota_stopped_calls_go_on_and_leases_resume(fleet: Any, private_server: Callable[..., RotaServer]) -> None:
    server, echoes, registration, _ = fleet
    s, ch = stub(server)
    with ch:
        for i in range(30):
            echo(s, f"before {i}")
        address = server.address
        server.kill()
        stopped = time.monotonic()
        reached = Counter(echo(s, f"outage {i}") for i in range(100))
        assert set(reached) == set(IDS), "the local rotation covers every known instance"
        assert any(r.ticket and r.ticket.startswith("L") for r in echoes.since(stopped))
        private_server(listen=address)
        restarted = time.monotonic()
        deadline = restarted + 30
        while True:
            echo(s, "back")
            since = echoes.since(restarted)
            if since and since[-1].ticket and not since[-1].ticket.startswith("L"):
                break
            assert time.monotonic() < deadline, "no leased ticket within 30 s of rota's restart"
            time.sleep(0.05)


def test_unknown_service_fails_fast_with_a_clear_error(rota_server: RotaServer) -> None:
    with rota.channel(f"rota://{rota_server.address}/no-such-service") as ch:
        with pytest.raises(grpc.RpcError) as failure:
            echo_pb2_grpc.EchoStub(ch).Echo(echo_pb2.EchoRequest(message="x"), timeout=20)
    assert failure.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "no-such-service" in (failure.value.details() or "")


class _Tag(grpc.UnaryUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    def __init__(self) -> None:
        self.calls = 0

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        self.calls += 1
        return continuation(details, request)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        self.calls += 1
        return continuation(details, requests)


def test_every_call_kind_and_interceptors(fleet: Any) -> None:
    server, echoes, _, _ = fleet
    ch = rota.channel(f"rota://{server.address}/echo", rule="round_robin", ticket_header=True)
    tag = _Tag()
    with ch:
        intercepted = grpc.intercept_channel(ch, tag)
        s = echo_pb2_grpc.EchoStub(intercepted)
        assert echo(s) in IDS
        replies = list(s.EchoStream(iter([echo_pb2.EchoRequest(message=str(i)) for i in range(3)]), timeout=20))
        assert [r.message for r in replies] == ["0", "1", "2"] and len({r.instance_id for r in replies}) == 1
        future = s.Echo.future(echo_pb2.EchoRequest(message="f"), timeout=20)
        assert future.result().instance_id in IDS
        stream = list(ch.unary_stream(f"/{KINDS}/UnaryStream")(b"x", timeout=20))
        assert stream[0].decode() in IDS and stream[1] == b"x"
        joined = ch.stream_unary(f"/{KINDS}/StreamUnary")(iter([b"a", b"b"]), timeout=20)
        assert joined.split(b":")[1] == b"ab"
    assert tag.calls == 3
    assert len(leased_tickets(echoes.received)) == 5


async def test_aio_channel_shares_the_rotation_and_routes_versions(fleet: Any) -> None:
    server, echoes, registration, _ = fleet
    registration.announce(
        rota.Instance(service="echo", host="127.0.0.1", port=echoes.start("echo-zlt"), id="echo-zlt", version="zlt")
    )
    async with rota.aio.channel(f"rota://{server.address}/echo", rule="round_robin", ticket_header=True) as ch:
        s = echo_pb2_grpc.EchoStub(ch)
        reached = [(await s.Echo(echo_pb2.EchoRequest(message=str(i)), timeout=20)).instance_id for i in range(60)]
        zlt = await s.Echo(echo_pb2.EchoRequest(message="v"), timeout=20, metadata=(("x-rota-version", "zlt"),))
        call = s.EchoStream(timeout=20)
        await call.write(echo_pb2.EchoRequest(message="s"))
        await call.done_writing()
        streamed = [r async for r in call]
    assert zlt.instance_id == "echo-zlt"
    assert Counter(reached) == dict.fromkeys(IDS, 20)
    assert [r.message for r in streamed] == ["s"]
    tickets = leased_tickets([r for r in echoes.received if r.version is None])
    assert all(instance == IDS[t % 3] for t, instance in tickets.items())


def test_ticket_header_is_sent_only_when_asked_for(fleet: Any) -> None:
    server, echoes, _, _ = fleet
    with rota.channel(f"rota://{server.address}/echo", rule="round_robin") as ch:
        s = echo_pb2_grpc.EchoStub(ch)
        for i in range(20):
            echo(s, str(i))
    assert [r.ticket for r in echoes.received] == [None] * 20
    s, ch = stub(server)
    with ch:
        for i in range(20):
            echo(s, str(i))
    assert len(leased_tickets(echoes.received[20:])) == 20


async def test_aio_ticket_header_is_sent_only_when_asked_for(fleet: Any) -> None:
    server, echoes, _, _ = fleet
    for ticket_header in (False, True):
        async with rota.aio.channel(
            f"rota://{server.address}/echo", rule="round_robin", ticket_header=ticket_header
        ) as ch:
            s = echo_pb2_grpc.EchoStub(ch)
            for i in range(20):
                await s.Echo(echo_pb2.EchoRequest(message=str(i)), timeout=20)
    assert [r.ticket for r in echoes.received[:20]] == [None] * 20
    assert len(leased_tickets(echoes.received[20:])) == 20


async def test_aio_channel_skips_a_killed_instance(fleet: Any) -> None:
    server, echoes, _, _ = fleet
    async with rota.aio.channel(f"rota://{server.address}/echo", rule="round_robin") as ch:
        s = echo_pb2_grpc.EchoStub(ch)
        for i in range(30):
            await s.Echo(echo_pb2.EchoRequest(message=str(i)), timeout=20)
        echoes.kill("echo-c")
        reached = Counter(
            [(await s.Echo(echo_pb2.EchoRequest(message="k"), timeout=20)).instance_id for _ in range(100)]
        )
    assert set(reached) == {"echo-a", "echo-b"}


GRAY_IDS = ["echo-a", "echo-b", "echo-v"]


@pytest.fixture
def gray_fleet(
    private_server: Callable[..., RotaServer],
) -> Iterator[tuple[RotaServer, EchoFleet, dict[str, Any]]]:
    """echo-a, echo-b (no version) and echo-v (v2), one registration each, under a 2:1 gray split."""
    server = private_server()
    echo = EchoFleet()
    client = rota.RotaClient(server.address)
    registrations = {
        i: client.register(
            rota.Instance(
                service="echo", host="127.0.0.1", port=echo.start(i), id=i, version="v2" if i == "echo-v" else ""
            )
        )
        for i in GRAY_IDS
    }
    gray = pb.GrayRelease(unversioned=2, versions={"v2": 1})
    with grpc.insecure_channel(server.address) as ch:
        pb_grpc.PoliciesStub(ch).SetPolicy(pb.SetPolicyRequest(policy=pb.Policy(service="echo", gray=gray)), timeout=20)
    try:
        yield server, echo, registrations
    finally:
        client.close()
        echo.close()


def check_gray_split(received: list[Received]) -> None:
    """60 calls in 2:1, each by a ticket of its version's own rotation, round robin within the version."""
    assert Counter(r.instance for r in received) == {"echo-a": 20, "echo-b": 20, "echo-v": 20}
    assert all(r.ticket is not None and r.ticket.isdigit() for r in received), [r.ticket for r in received]
    unversioned = [(int(r.ticket or ""), r.instance) for r in received if r.instance != "echo-v"]
    v2 = [int(r.ticket or "") for r in received if r.instance == "echo-v"]
    assert len({t for t, _ in unversioned}) == 40 and len(set(v2)) == 20, "no ticket of a rotation used twice"
    assert all(instance == ["echo-a", "echo-b"][t % 2] for t, instance in unversioned)


def test_gray_release_without_a_version(gray_fleet: Any) -> None:
    server, echoes, registrations = gray_fleet
    s, ch = stub(server)
    with ch:
        for i in range(60):
            echo(s, f"gray {i}")
        check_gray_split(echoes.received)
        # The instance list changes: held picks are dropped, rota's next ones name echo-a and echo-b only.
        registrations["echo-v"].close()
        withdrawn = time.monotonic()
        while time.monotonic() - withdrawn < 1.5:
            echo(s, "after")
        late = echoes.since(withdrawn + 1.0)
        assert {r.instance for r in late} == {"echo-a", "echo-b"}, Counter(r.instance for r in late)
        assert all(r.ticket is not None and not r.ticket.startswith("L") for r in late), "leased after the change"
        # A killed instance: its picks are passed over, no call fails.
        echoes.kill("echo-b")
        reached = Counter(echo(s, f"killed {i}") for i in range(60))
    assert set(reached) == {"echo-a"}, reached


async def test_aio_gray_release_without_a_version(gray_fleet: Any) -> None:
    server, echoes, registrations = gray_fleet
    async with rota.aio.channel(f"rota://{server.address}/echo", rule="round_robin", ticket_header=True) as ch:
        s = echo_pb2_grpc.EchoStub(ch)
        for i in range(60):
            await s.Echo(echo_pb2.EchoRequest(message=str(i)), timeout=20)
        check_gray_split(echoes.received)
        echoes.kill("echo-v")
        reached = Counter(
            [(await s.Echo(echo_pb2.EchoRequest(message="k"), timeout=20)).instance_id for _ in range(60)]
        )
    assert set(reached) == {"echo-a", "echo-b"}, reached
