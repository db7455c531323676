"""The I/O-free core of rota.channel and rota.aio.channel, without a server: when a call goes
again on the next ticket (rota._routing), one report per call sent, instances whose channel state
is polled, the multicallables (rota._multicallables) and opening an instance channel (rota._dial)."""

from __future__ import annotations

import types
from typing import Any

import grpc
import pytest

from rota._dial import dial
from rota._multicallables import KINDS, InstanceMultiCallables, MultiCallableKinds, RoutedChannel
from rota._pb import rota_pb2 as pb
from rota._routing import CallRouting, Deadline, retries_on_next_ticket
from rota._tickets import Draw, Member

A = Member("echo-a", "127.0.0.1", 9001)
B = Member("echo-b", "127.0.0.1", 9002)
REFUSED = (grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; Connection refused")


class FakeClock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def test_a_deadline_counts_down_and_never_below_zero() -> None:
    clock = FakeClock()
    deadline = Deadline(2.0, clock)
    assert deadline.left() == 2.0 and not deadline.passed()
    clock.now += 1.5
    assert deadline.left() == 0.5
    clock.now += 1.0
    assert deadline.left() == 0.0 and deadline.passed()
    unbounded = Deadline(None, clock)
    clock.now += 1e9
    assert unbounded.left() is None and not unbounded.passed()


def test_only_a_unary_call_that_never_connected_goes_to_the_next_ticket() -> None:
    clock = FakeClock()
    deadline = Deadline(1.0, clock)
    assert retries_on_next_ticket("unary_unary", *REFUSED, deadline)
    assert not retries_on_next_ticket("stream_unary", *REFUSED, deadline)
    assert not retries_on_next_ticket("unary_stream", *REFUSED, deadline)
    assert not retries_on_next_ticket("unary_unary", grpc.StatusCode.UNAVAILABLE, "the server said so", deadline)
    assert not retries_on_next_ticket("unary_unary", grpc.StatusCode.DEADLINE_EXCEEDED, "failed to connect", deadline)
    clock.now += 1.0
    assert not retries_on_next_ticket("unary_unary", *REFUSED, deadline), "not past the call's deadline"
    assert retries_on_next_ticket("unary_unary", *REFUSED, Deadline(None, clock))


class FakeRouter:
    service = "echo"

    def __init__(self) -> None:
        self.reported: list[tuple[str, Any]] = []

    def on_members(self, listener: Any) -> None:
        listener({m.id: m for m in (A, B)})

    def report(self, draw: Draw, latency_ns: int, result: Any) -> None:
        self.reported.append((draw.member.id, result))


def test_a_call_sent_is_reported_once_whoever_sees_it_end() -> None:
    router = FakeRouter()
    routing: CallRouting[object] = CallRouting(router, False, lambda m: object(), lambda ch: None)  # type: ignore[arg-type]
    attempt = routing.start(Draw(A, 3, "round_robin", False))
    assert routing.finish(attempt, grpc.StatusCode.OK, None, answered=True) == pb.CALL_RESULT_OK
    assert routing.finish(attempt, grpc.StatusCode.CANCELLED, "cancelled") is None
    refused = routing.start(Draw(B, 4, "round_robin", False))
    assert routing.finish(refused, *REFUSED) == pb.CALL_RESULT_CONNECT_FAILURE
    assert router.reported == [("echo-a", pb.CALL_RESULT_OK), ("echo-b", pb.CALL_RESULT_CONNECT_FAILURE)]
    assert not routing.usable(B.id), "an instance that refused a connection is held out"


class PolledChannel:
    def __init__(self, state: grpc.ChannelConnectivity) -> None:
        self.state = state

    def get_state(self) -> grpc.ChannelConnectivity:
        return self.state


def test_a_polled_instance_channel_in_failure_takes_no_call() -> None:
    channels: dict[str, PolledChannel] = {}

    def open_channel(member: Member) -> PolledChannel:
        return channels.setdefault(member.id, PolledChannel(grpc.ChannelConnectivity.IDLE))

    routing: CallRouting[PolledChannel] = CallRouting(
        FakeRouter(),  # type: ignore[arg-type]
        False,
        open_channel,
        lambda ch: None,
        state_of=lambda ch: ch.get_state(),
    )
    assert routing.usable(A.id), "no channel open yet"
    routing.channel_for(Draw(A, 0, "round_robin", False))
    for state, usable in [
        (grpc.ChannelConnectivity.READY, True),
        (grpc.ChannelConnectivity.TRANSIENT_FAILURE, False),
        (grpc.ChannelConnectivity.SHUTDOWN, False),
        (grpc.ChannelConnectivity.CONNECTING, True),
    ]:
        channels[A.id].state = state
        assert routing.usable(A.id) is usable, state
    assert not routing.usable("unknown")


class FakeInstanceChannel:
    def __init__(self) -> None:
        self.made: list[tuple[str, str]] = []

    def __getattr__(self, kind: str) -> Any:
        def factory(method: str, request_serializer: Any = None, response_deserializer: Any = None) -> object:
            self.made.append((kind, method))
            return object()

        return factory


def test_an_instance_channels_multicallable_is_made_once_per_channel() -> None:
    calls: InstanceMultiCallables[FakeInstanceChannel] = InstanceMultiCallables("unary_stream", "/echo/Say", None, None)
    first, second = FakeInstanceChannel(), FakeInstanceChannel()
    made = calls.on(A.id, first)
    assert calls.on(A.id, first) is made and first.made == [("unary_stream", "/echo/Say")]
    assert calls.on(A.id, second) is not made, "the instance's channel was replaced"
    assert calls.on(B.id, second) is not calls.on(A.id, second)
    assert not calls.streams_requests and InstanceMultiCallables("stream_unary", "/m", None, None).streams_requests
    with pytest.raises(ValueError):
        InstanceMultiCallables("unary", "/m", None, None)


class Kinds(MultiCallableKinds):
    def _multicallable(self, kind: str, method: str, serializer: Any, deserializer: Any) -> Any:
        return (kind, method, serializer, deserializer)


def test_every_multicallable_kind_goes_through_one_factory() -> None:
    kinds = Kinds()
    made = [getattr(kinds, kind)("/m", "ser", response_deserializer="de") for kind in KINDS]
    assert made == [(kind, "/m", "ser", "de") for kind in KINDS]
    with pytest.raises(NotImplementedError):
        MultiCallableKinds().unary_unary("/m")


def test_dial_uses_credentials_when_given() -> None:
    opened: list[tuple[Any, ...]] = []
    flavour = types.ModuleType("flavour")
    flavour.insecure_channel = lambda target, **kw: opened.append(("insecure", target, kw))  # type: ignore[attr-defined]
    flavour.secure_channel = lambda target, creds, **kw: opened.append(("secure", target, creds, kw))  # type: ignore[attr-defined]
    dial(flavour, "h:1", None, (("o", 1),))
    dial(flavour, "h:2", "creds", [], interceptors=["i"])  # type: ignore[arg-type]
    assert opened == [
        ("insecure", "h:1", {"options": [("o", 1)]}),
        ("secure", "h:2", "creds", {"options": [], "interceptors": ["i"]}),
    ]


class Routed(RoutedChannel[tuple[str, list[tuple[str, Any]]]]):
    def _open(self, member: Member) -> tuple[str, list[tuple[str, Any]]]:
        return member.address, self._options

    def _close_instance(self, channel: tuple[str, list[tuple[str, Any]]]) -> None:
        closed.append(channel)

    def _multicallable(self, kind: str, method: str, serializer: Any, deserializer: Any) -> Any:
        return kind


closed: list[Any] = []


def test_a_routed_channel_opens_its_instance_channels_with_its_options() -> None:
    closed.clear()
    channel = Routed(FakeRouter(), False, [("o", 1)], None)  # type: ignore[arg-type]
    assert channel.routing.usable == channel.instances.usable, "told its instances' state, not polling it"
    assert channel.routing.channel_for(Draw(A, 0, "round_robin", False)) == ("127.0.0.1:9001", [("o", 1)])
    assert channel.instances is channel.routing.instances
    assert channel.stream_unary("/m") == "stream_unary"
    channel.instances.close()
    assert closed == [("127.0.0.1:9001", [("o", 1)])]


class Polling(Routed):
    polls_state = True

    def _state_of(self, channel: tuple[str, list[tuple[str, Any]]]) -> grpc.ChannelConnectivity:
        return grpc.ChannelConnectivity.TRANSIENT_FAILURE


def test_a_polling_channel_reads_its_instance_channels_state() -> None:
    channel = Polling(FakeRouter(), False, None, None)  # type: ignore[arg-type]
    assert channel.routing.usable(A.id), "no instance channel yet"
    channel.routing.channel_for(Draw(A, 0, "round_robin", False))
    assert not channel.routing.usable(A.id) and channel.routing.usable(B.id)
