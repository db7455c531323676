"""Leased tickets mapped to instances, the arithmetic rota runs for a pick (docs/rules.md).

``round_robin`` maps ticket t to position ``t mod n``; ``repeat(n=k)`` to ``(t // k) mod n``;
``weighted`` to slot ``t mod Σw`` of an earliest-deadline-first schedule of the weights reduced
by their gcd. Excluded positions are skipped as rota skips a pick's ``exclude``: the rotating
rules rotate over the accepted positions, ``weighted`` walks its schedule to the next accepted
instance. A :class:`Rotation` holds the leased blocks of one (rule, version) and decides, per
call, between a leased ticket, a wait for the first lease, a local rotation while rota is
unreachable, and rota's refusal.
"""

from __future__ import annotations

import heapq
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

MAX_CYCLE = 1 << 20
#: Least and most tickets one lease reserves; between them the block follows the call rate.
MIN_BLOCK = 16
MAX_BLOCK = 8192
#: The interval between leases the block size aims at, at a steady call rate.
TARGET_LEASE_INTERVAL = 0.075
#: How often a rotation asks rota again after a failed lease.
RETRY_INTERVAL = 1.0


@dataclass(frozen=True)
class Member:
    """One instance as the channel routes to it."""

    id: str
    host: str
    port: int
    version: str = ""
    weight: int = 100

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def weighted_schedule(weights: Sequence[int]) -> list[int]:
    """Positions in slot order: instance i's j-th slot is due at (2j+1)/2wᵢ, ties to the lower i."""
    divisor = 0
    for w in weights:
        if w > 0:
            divisor = math.gcd(divisor, w)
    divisor = max(divisor, 1)
    reduced = [w // divisor for w in weights]
    total = sum(reduced)
    if total > MAX_CYCLE:
        nonzero = sum(1 for w in reduced if w > 0)
        budget = max(MAX_CYCLE - nonzero, 1)
        reduced = [1 + w * budget // total if w > 0 else 0 for w in reduced]
    heap = [(_Deadline(1, w), i, w) for i, w in enumerate(reduced) if w > 0]
    heapq.heapify(heap)
    slots: list[int] = []
    while heap:
        deadline, index, weight = heapq.heappop(heap)
        slots.append(index)
        numerator = deadline.numerator + 2
        if numerator < 2 * weight:
            heapq.heappush(heap, (_Deadline(numerator, weight), index, weight))
    return slots


class _Deadline:
    """numerator / weight, compared exactly."""

    __slots__ = ("numerator", "weight")

    def __init__(self, numerator: int, weight: int) -> None:
        self.numerator = numerator
        self.weight = weight

    def __lt__(self, other: _Deadline) -> bool:
        return self.numerator * other.weight < other.numerator * self.weight

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Deadline) and self.numerator * other.weight == other.numerator * self.weight

    __hash__ = None  # type: ignore[assignment]


class TicketMapping:
    """The mapping of one leasable rule over an eligible list with these weights."""

    def __init__(self, rule: str, weights: Sequence[int]) -> None:
        r = rule.replace(" ", "")
        self.repeat = 1
        if r in ("", "round_robin"):
            self.kind = "round_robin"
        elif r == "weighted":
            self.kind = "weighted"
        elif r == "repeat":
            self.kind, self.repeat = "repeat", 3
        elif r.startswith("repeat(n=") and r.endswith(")"):
            self.kind, self.repeat = "repeat", max(1, int(r[len("repeat(n=") : -1]))
        else:
            raise ValueError(f"rule {rule!r} cannot be leased; leasable rules: round_robin, repeat, weighted")
        self.weights = list(weights)
        self._slots: list[int] | None = None

    def map(self, ticket: int, excluded: Sequence[bool] | None = None) -> int:
        """The position ``ticket`` maps to, or -1 when no position is accepted."""
        n = len(self.weights)
        accepted = n - (sum(1 for e in excluded if e) if excluded else 0)
        if accepted <= 0:
            return -1
        if self.kind == "weighted":
            if self._slots is None:
                self._slots = weighted_schedule(self.weights)
            slots = self._slots
            if not slots:
                return -1
            start = ticket % len(slots)
            for step in range(len(slots)):
                index = slots[(start + step) % len(slots)]
                if not excluded or not excluded[index]:
                    return index
            return -1
        turn = ticket // self.repeat if self.kind == "repeat" else ticket
        nth = turn % accepted
        if not excluded:
            return nth
        seen = -1
        for i, e in enumerate(excluded):
            if not e:
                seen += 1
                if seen == nth:
                    return i
        return -1


def leasable(rule: str) -> bool:
    try:
        TicketMapping(rule, [])
    except ValueError:
        return False
    return True


class Eligible:
    """An eligible list ordered by id, with its rule's mapping."""

    def __init__(self, members: Sequence[Member], rule: str) -> None:
        self.members = list(members)
        self.rule = rule
        self.mapping = TicketMapping(rule, [m.weight for m in self.members])

    @classmethod
    def isolate(cls, members: Sequence[Member], version: str, rule: str) -> Eligible:
        """rota's version isolation with the default fallback: the version's instances, else unversioned."""
        chosen = [m for m in members if m.version == version]
        if not chosen and version:
            chosen = [m for m in members if not m.version]
        return cls(sorted(chosen, key=lambda m: m.id), rule)

    def excluded(self, usable: Callable[[str], bool]) -> list[bool] | None:
        flags = [not usable(m.id) for m in self.members]
        return flags if any(flags) else None

    def map(self, ticket: int, excluded: Sequence[bool] | None = None) -> Member | None:
        index = self.mapping.map(ticket, excluded)
        return None if index < 0 else self.members[index]


@dataclass(frozen=True)
class Draw:
    """What one call is routed by: the instance, its ticket, the rule, and whether rota leased it."""

    member: Member
    ticket: int
    rule: str
    local: bool


class Refused(Exception):
    """rota refused the lease for a rotation that never had an eligible list."""

    def __init__(self, code: object, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


#: draw() results other than a Draw.
WAIT = "wait"
NONE_USABLE = "none-usable"


class Rotation:
    """Leased blocks of one (rule, version), refilled at half, with a local rotation during outages.

    Thread-safe; :meth:`draw` never blocks. When it returns a lease count, the caller asks rota
    for that many tickets and hands the answer to :meth:`leased` or :meth:`failed`.
    """

    def __init__(self, rule: str, version: str, resolved: Callable[[], list[Member]]) -> None:
        self.rule = rule
        self.version = version
        self._resolved = resolved
        self._lock = threading.Lock()
        self._blocks: deque[list[int]] = deque()
        self._eligible: Eligible | None = None
        self._leasing = False
        self._refresh_wanted = False
        self._outage = False
        self._refusal: Refused | None = None
        self._retry_at = 0.0
        self._local_turn = 0
        self._block_size = MIN_BLOCK
        self._last_lease_at = time.monotonic()
        self._drawn = 0
        self.leases = 0
        self.leased_tickets = 0

    @property
    def outage(self) -> bool:
        return self._outage

    def draw(self, usable: Callable[[str], bool]) -> tuple[Draw | str | Refused, int | None]:
        """The next ticket's instance among the usable ones, and a lease to start (a count) or None."""
        with self._lock:
            now = time.monotonic()
            may_lease = not self._leasing and (not (self._outage or self._refusal) or now >= self._retry_at)
            lease: int | None = None
            if self._eligible is None and self._refusal is not None:
                return self._refusal, self._start(now) if may_lease else None
            if not self._blocks:
                if may_lease:
                    lease = self._start(now)
                if self._outage:
                    return self._local(usable), lease
                return WAIT, lease
            ticket = self._next_ticket()
            if may_lease and self._remaining() * 2 <= self._block_size:
                lease = self._start(now)
            assert self._eligible is not None
            member = self._eligible.map(ticket)
            if member is not None and usable(member.id):
                return Draw(member, ticket, self._eligible.rule, False), lease
            # Skipped the way rota skips `exclude`: the next ticket, over the usable instances.
            excluded = self._eligible.excluded(usable)
            if self._blocks:
                ticket = self._next_ticket()
            member = self._eligible.map(ticket, excluded)
            if member is None:
                return NONE_USABLE, lease
            return Draw(member, ticket, self._eligible.rule, False), lease

    def refresh(self) -> int | None:
        """After the instance list changed: 0 (a lease of no tickets, for the current list) or None."""
        with self._lock:
            if self._eligible is None or self._outage:
                return None
            if self._leasing:
                self._refresh_wanted = True
                return None
            self._leasing = True
            return 0

    def leased(self, first_ticket: int, count: int, members: list[Member], rule: str) -> tuple[int | None, bool]:
        """A lease answered; returns (a follow-up refresh lease or None, whether the outage ended)."""
        with self._lock:
            self._leasing = False
            self.leases += 1
            self.leased_tickets += count
            if count > 0:
                self._blocks.append([first_ticket, first_ticket + count])
            self._eligible = Eligible(members, rule)
            self._refusal = None
            recovered = self._outage
            self._outage = False
            follow_up = None
            if self._refresh_wanted:
                self._refresh_wanted = False
                self._leasing = True
                follow_up = 0
            return follow_up, recovered

    def failed(self, error: Refused, answered_by_rota: bool, refresh: bool = False) -> bool:
        """A lease failed; returns True when this starts an outage (log it once).

        A failed refresh (a lease of no tickets) changes nothing: the held tickets stay good and
        the next refill asks again.
        """
        with self._lock:
            self._leasing = False
            if refresh:
                return False
            self._retry_at = time.monotonic() + RETRY_INTERVAL
            if self._outage:
                return False
            if answered_by_rota and self._eligible is None:
                self._refusal = error
                return False
            if self._eligible is not None or self._resolved():
                # Tickets of a rota that may have restarted (a new counter): the local rotation
                # takes over until a lease succeeds.
                self._outage = True
                self._blocks.clear()
                return True
            self._refusal = error
            return False

    def lost(self) -> bool:
        """rota's watch broke: local rotation from now, a lease tried at once; True if this starts an outage."""
        with self._lock:
            if self._outage or (self._eligible is None and not self._resolved()):
                return False
            self._outage = True
            self._blocks.clear()
            self._retry_at = time.monotonic()
            return True

    def _local(self, usable: Callable[[str], bool]) -> Draw | str:
        eligible = self._eligible or Eligible.isolate(self._resolved(), self.version, self.rule)
        turn = self._local_turn
        self._local_turn += 1
        member = eligible.map(turn, eligible.excluded(usable))
        return NONE_USABLE if member is None else Draw(member, turn, eligible.rule, True)

    def _next_ticket(self) -> int:
        block = self._blocks[0]
        ticket = block[0]
        block[0] += 1
        self._drawn += 1
        if block[0] == block[1]:
            self._blocks.popleft()
        return ticket

    def _remaining(self) -> int:
        return sum(end - start for start, end in self._blocks)

    def _start(self, now: float) -> int:
        elapsed = max(now - self._last_lease_at, 0.001)
        adapted = round(self._drawn * TARGET_LEASE_INTERVAL / elapsed)
        self._block_size = max(MIN_BLOCK, min(MAX_BLOCK, adapted))
        self._last_lease_at = now
        self._drawn = 0
        self._leasing = True
        return self._block_size
