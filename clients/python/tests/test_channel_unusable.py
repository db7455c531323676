"""Instances the channels cannot use, without a server: the hold-out bookkeeping on a clock the
test moves (rota._tickets.Holds) and what a finished call says of its instance (rota._routing).
What the rotation does with an unusable instance's tickets is test_channel_tickets.py."""

from __future__ import annotations

from typing import Any

import grpc

from rota._pb import rota_pb2 as pb
from rota._routing import CallRouting, health_of
from rota._tickets import ANSWERED, CONNECT_HOLD, NEUTRAL, TIMED_OUT, Draw, Holds, Member

A = Member("echo-a", "127.0.0.1", 9001)
B = Member("echo-b", "127.0.0.1", 9002)
C = Member("echo-c", "127.0.0.1", 9003)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def timeouts(holds: Holds, clock: Clock, count: int, instance: str = "c") -> list[float | None]:
    """``count`` calls in a row to the instance, each started now and timed out."""
    return [holds.finished(instance, TIMED_OUT, clock.now) for _ in range(count)]


def test_three_timeouts_in_a_row_hold_an_instance_out_for_ten_seconds() -> None:
    clock = Clock()
    holds = Holds(clock)
    assert timeouts(holds, clock, 2) == [None, None]
    assert holds.usable("c"), "two timeouts are not a run"
    assert holds.finished("c", TIMED_OUT, clock.now) == 10.0
    assert not holds.usable("c") and holds.usable("a")
    clock.now += 9.999
    assert not holds.usable("c")
    clock.now += 0.001
    assert holds.usable("c"), "after 10 s the next call tries it again"


def test_each_further_run_doubles_the_hold_up_to_sixty_seconds() -> None:
    clock = Clock()
    holds = Holds(clock)
    lengths = []
    for _ in range(5):
        lengths.append(timeouts(holds, clock, 3)[-1])
        until = holds.held_until("c")
        assert until is not None
        clock.now = until
        assert holds.usable("c")
        clock.now += 0.5
    assert lengths == [10.0, 20.0, 40.0, 60.0, 60.0]


def test_an_answer_ends_the_run_and_the_doubling() -> None:
    clock = Clock()
    holds = Holds(clock)
    timeouts(holds, clock, 2)
    holds.finished("c", ANSWERED, clock.now)
    assert timeouts(holds, clock, 2) == [None, None], "the count started again"
    assert holds.usable("c")
    assert timeouts(holds, clock, 1) == [10.0]
    clock.now += 10
    holds.finished("c", ANSWERED, clock.now)
    assert holds.held_until("c") is None, "an expired hold is dropped with the answer"
    assert timeouts(holds, clock, 3)[-1] == 10.0, "not 20: the answer ended the doubling"


def test_cancelled_and_unconnected_calls_neither_count_nor_end_a_run() -> None:
    clock = Clock()
    holds = Holds(clock)
    timeouts(holds, clock, 2)
    assert holds.finished("c", NEUTRAL, clock.now) is None
    assert timeouts(holds, clock, 1) == [10.0]


def test_timeouts_of_calls_sent_before_the_hold_do_not_count_again() -> None:
    clock = Clock()
    holds = Holds(clock)
    sent = clock.now
    clock.now += 1
    timeouts(holds, clock, 3)
    # More calls that were already on their way when the hold began time out now.
    assert [holds.finished("c", TIMED_OUT, sent) for _ in range(6)] == [None] * 6
    clock.now += 10
    assert holds.usable("c")
    assert timeouts(holds, clock, 2) == [None, None], "the new run counts only calls sent since"


def test_a_refused_connection_holds_for_a_second_or_until_ready() -> None:
    clock = Clock()
    holds = Holds(clock)
    holds.refused("a")
    assert not holds.usable("a")
    clock.now += CONNECT_HOLD
    assert holds.usable("a")
    holds.refused("a")
    holds.connected("a")
    assert holds.usable("a")
    timeouts(holds, clock, 3)
    holds.connected("c")
    assert not holds.usable("c"), "a hung instance's connection is READY: that ends no hold"


def test_instances_that_left_are_forgotten() -> None:
    clock = Clock()
    holds = Holds(clock)
    timeouts(holds, clock, 3)
    timeouts(holds, clock, 2, "b")
    holds.refused("a")
    holds.forget(lambda i: i == "b")
    assert holds.usable("a") and holds.usable("c")
    assert timeouts(holds, clock, 1, "b") == [10.0], "b's run is kept"


def test_what_a_finished_call_says_of_its_instance() -> None:
    assert health_of(grpc.StatusCode.DEADLINE_EXCEEDED, pb.CALL_RESULT_ERROR) == TIMED_OUT
    assert health_of(grpc.StatusCode.OK, pb.CALL_RESULT_OK) == ANSWERED
    assert health_of(None, pb.CALL_RESULT_OK) == ANSWERED
    assert health_of(grpc.StatusCode.INTERNAL, pb.CALL_RESULT_ERROR) == ANSWERED
    assert health_of(grpc.StatusCode.UNAVAILABLE, pb.CALL_RESULT_ERROR) == ANSWERED
    assert health_of(grpc.StatusCode.UNAVAILABLE, pb.CALL_RESULT_CONNECT_FAILURE) == NEUTRAL
    assert health_of(grpc.StatusCode.CANCELLED, pb.CALL_RESULT_ERROR) == NEUTRAL


class FakeRouter:
    """What CallRouting needs of a router: the instance list and somewhere to report."""

    service = "echo"

    def __init__(self) -> None:
        self.reported: list[tuple[str, int, Any]] = []

    def on_members(self, listener: Any) -> None:
        listener({m.id: m for m in (A, B, C)})

    def report(self, draw: Draw, latency_ns: int, result: Any) -> None:
        self.reported.append((draw.member.id, draw.ticket, result))


def test_the_channels_hold_out_an_instance_after_three_timeouts_and_still_report_them() -> None:
    router = FakeRouter()
    routing: CallRouting[object] = CallRouting(router, False, lambda m: object(), lambda ch: None)  # type: ignore[arg-type]
    started = 0  # monotonic_ns of a call sent long before: it counts, as no hold began since

    def finish(member: Member, code: grpc.StatusCode, details: str | None = None) -> None:
        routing.finished(Draw(member, 7, "round_robin", False), started, code, details, False)

    finish(C, grpc.StatusCode.DEADLINE_EXCEEDED)
    finish(C, grpc.StatusCode.DEADLINE_EXCEEDED)
    finish(C, grpc.StatusCode.CANCELLED)
    assert routing.usable(C.id)
    finish(C, grpc.StatusCode.DEADLINE_EXCEEDED)
    assert not routing.usable(C.id) and routing.usable(A.id)
    assert [r[2] for r in router.reported] == [pb.CALL_RESULT_ERROR] * 4, "timeouts go to rota as errors"

    finish(A, grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses")
    assert not routing.usable(A.id), "a refused connection holds for a second"
    assert router.reported[-1][2] == pb.CALL_RESULT_CONNECT_FAILURE
