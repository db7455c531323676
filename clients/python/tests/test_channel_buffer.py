"""The channel's outcome buffer (rota._reports): batches, a bound that drops the oldest, and
failed Reports kept for the next try. Flushed by hand or woken by a full batch; no timing."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from rota._pb import rota_pb2 as pb
from rota._reports import Outcome, OutcomeBuffer


class Sink:
    """Stands in for rota's Report: records the batches it takes, refuses them while ``down``."""

    def __init__(self) -> None:
        self.batches: list[list[Outcome]] = []
        self.down = False
        self.sent = threading.Event()

    def __call__(self, batch: Sequence[Outcome]) -> bool:
        if self.down:
            return False
        self.batches.append(list(batch))
        self.sent.set()
        return True

    def tickets(self) -> list[int]:
        return [o.ticket for batch in self.batches for o in batch]


def outcome(ticket: int) -> Outcome:
    return Outcome("a", ticket, "round_robin", 10, pb.CALL_RESULT_OK)


def test_a_full_batch_is_sent_without_waiting_for_the_interval() -> None:
    sink = Sink()
    buffer = OutcomeBuffer(sink, "test", interval=3600, batch=100)
    try:
        for t in range(100):
            buffer.add(outcome(t))
        assert sink.sent.wait(10), "a full batch waits for the interval"
        assert sink.tickets() == list(range(100))
    finally:
        buffer.close(timeout=10)


def test_the_newest_outcomes_wait_while_rota_is_away() -> None:
    sink = Sink()
    sink.down = True
    buffer = OutcomeBuffer(sink, "test", batch=100, capacity=1000, start=False)
    for t in range(1250):
        buffer.add(outcome(t))
    assert (buffer.dropped, len(buffer)) == (250, 1000)
    buffer.flush()
    assert (buffer.dropped, len(buffer)) == (250, 1000), "a failed Report keeps its batch in front"
    buffer.add(outcome(1250))
    assert buffer.dropped == 251
    sink.down = False
    buffer.flush()
    assert sink.tickets() == list(range(251, 1251)), "oldest dropped, order kept"
    assert all(len(batch) <= 100 for batch in sink.batches)
    assert len(buffer) == 0


def test_close_sends_what_is_left() -> None:
    sink = Sink()
    buffer = OutcomeBuffer(sink, "test", interval=3600)
    buffer.add(outcome(7))
    buffer.close(timeout=10)
    assert sink.tickets() == [7]
