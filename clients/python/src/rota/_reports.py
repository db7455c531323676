"""Call outcomes of a rota channel, batched into ``Report`` calls off the call path.

A call only appends its outcome under a short lock. A background thread sends what is pending
every :data:`REPORT_INTERVAL` seconds, or as soon as a full batch of :data:`REPORT_BATCH` waits,
in batches of at most :data:`REPORT_BATCH` (rota's limit per ``Report``). While rota is away at
most :data:`REPORT_BACKLOG` outcomes wait: past that the oldest are dropped and counted, and a
batch whose ``Report`` failed goes back in front of the newer ones.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import NamedTuple

from ._pb import rota_pb2 as pb

log = logging.getLogger("rota.channel")

REPORT_INTERVAL = 0.1
REPORT_BATCH = 1000
REPORT_BACKLOG = 20_000


class Outcome(NamedTuple):
    """One call's outcome, kept small until it is sent (the protobuf is built by the sender)."""

    instance_id: str
    ticket: int
    rule: str
    latency_us: int
    result: pb.CallResult


class OutcomeBuffer:
    """Bounded queue of outcomes and the thread that sends them with ``send``.

    ``send(batch)`` makes one ``Report`` and returns whether rota took it.
    """

    def __init__(
        self,
        send: Callable[[Sequence[Outcome]], bool],
        name: str,
        *,
        interval: float = REPORT_INTERVAL,
        batch: int = REPORT_BATCH,
        capacity: int = REPORT_BACKLOG,
        start: bool = True,
    ) -> None:
        self._send = send
        self._name = name
        self._interval = interval
        self._batch = batch
        self._capacity = capacity
        self._lock = threading.Lock()
        self._pending: deque[Outcome] = deque()
        self._dropped = 0
        self._dropping = False
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        if start:
            self._thread.start()

    @property
    def dropped(self) -> int:
        """Outcomes dropped for lack of room since the buffer was made."""
        with self._lock:
            return self._dropped

    def __len__(self) -> int:
        with self._lock:
            return len(self._pending)

    def add(self, outcome: Outcome) -> None:
        with self._lock:
            if len(self._pending) >= self._capacity:
                self._pending.popleft()
                self._drop(1)
            self._pending.append(outcome)
            # Exactly at a full batch: while rota is away the buffer stays above it, and waking
            # the sender on every call would retry a failing Report in a loop.
            full = len(self._pending) == self._batch
        if full:
            self._wake.set()

    def _drop(self, count: int) -> None:
        """Counts dropped outcomes and warns once per outage; the lock is held."""
        self._dropped += count
        if not self._dropping:
            self._dropping = True
            log.warning(
                "%s: call outcomes not reported in time; dropping the oldest beyond %d", self._name, self._capacity
            )

    def flush(self) -> None:
        """Sends what is pending, a batch at a time, until it is all sent or a ``Report`` fails."""
        while True:
            with self._lock:
                count = min(len(self._pending), self._batch)
                batch = [self._pending.popleft() for _ in range(count)]
            if not batch:
                return
            sent = self._send(batch)
            with self._lock:
                if not sent:
                    self._pending.extendleft(reversed(batch))
                    excess = len(self._pending) - self._capacity
                    for _ in range(max(excess, 0)):
                        self._pending.popleft()
                    if excess > 0:
                        self._drop(excess)
                    return
                self._dropping = False

    def _run(self) -> None:
        while not self._closed.is_set():
            self._wake.wait(self._interval)
            self._wake.clear()
            self.flush()
        self.flush()

    def close(self, timeout: float) -> None:
        """Stops the thread after a last flush (bounded by ``timeout``)."""
        self._closed.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout)
        else:
            self.flush()
