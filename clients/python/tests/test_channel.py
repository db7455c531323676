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
from rota_harness import RotaServer

IDS = ["echo-a", "echo-b", "echo-c"]


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


def test_the_rule_goes_to_rota_which_refuses_one_it_cannot_lease(fleet: Any) -> None:
    # The channel has no list of rules: "random" reaches rota, and the call fails with its answer.
    server, echoes, _, _ = fleet
    with rota.channel(f"rota://{server.address}/echo", rule="random") as ch:
        with pytest.raises(grpc.RpcError) as failure:
            echo_pb2_grpc.EchoStub(ch).Echo(echo_pb2.EchoRequest(message="x"), timeout=20)
    assert "random" in (failure.value.details() or ""), failure.value
    assert echoes.received == []


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
