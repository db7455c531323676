"""Leased tickets mapped to instances, the arithmetic rota runs for a pick (docs/rules.md).

``round_robin`` maps ticket t to position ``t mod n``; ``repeat(n=k)`` to ``(t // k) mod n``;
``weighted`` to slot ``t mod Σw`` of an earliest-deadline-first schedule of the weights reduced
by their gcd. Excluded positions are skipped as rota skips a pick's ``exclude``: the rotating
rules rotate over the accepted positions, ``weighted`` walks its schedule to the next accepted
instance. A :class:`Rotation` holds the leased blocks of one (rule, version) and decides, per
call, between a leased ticket, a wait for the first lease, a local rotation while rota is
unreachable, and rota's refusal.

A lease comes back in one of two shapes, and a rotation takes either without knowing which to
expect: a range of tickets (a :class:`TicketBlock`, mapped here over the eligible list), or,
for a lease without a version of a service under gray release, the picks rota mapped itself
(a :class:`PickBlock`: per pick an instance and the ticket to report, used in order).
"""

from __future__ import annotations

import heapq
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

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


@dataclass(frozen=True)
class Lease:
    """One answer to ``Balancer.Lease``: a ticket range, or (``picks`` not empty) rota's own picks.

    ``picks`` are (ticket, instance) in the order calls use them; ``first_ticket`` and ``count``
    then say nothing (rota sends 0 and the number of picks).
    """

    first_ticket: int
    count: int
    members: list[Member]
    rule: str
    picks: list[tuple[int, Member]] = field(default_factory=list)


class TicketBlock:
    """Leased tickets ``next .. end - 1``, mapped over the rotation's eligible list."""

    __slots__ = ("end", "next")

    def __init__(self, first: int, end: int) -> None:
        self.next = first
        self.end = end

    def remaining(self) -> int:
        return self.end - self.next


class PickBlock:
    """Picks rota mapped itself (gray release without a version), each used once, in order.

    A pick whose instance cannot take the call is passed over: its ticket is a gap in its
    version's rotation, as a leased ticket never used is.
    """

    __slots__ = ("ids", "next", "picks", "rule")

    def __init__(self, picks: list[tuple[int, Member]], rule: str) -> None:
        self.picks = picks
        self.rule = rule
        self.next = 0
        self.ids = sorted({m.id for _, m in picks})

    def remaining(self) -> int:
        return len(self.picks) - self.next


class Rotation:
    """Leased blocks of one (rule, version), refilled at half, with a local rotation during outages.

    Thread-safe; :meth:`draw` never blocks. When it returns a lease count, the caller asks rota
    for that many tickets and hands the answer to :meth:`leased` or :meth:`failed`.

    Blocks of both shapes are used in the order they were leased. When the instance list
    changes (:meth:`refresh`), held picks are dropped, since rota chose them over the old list,
    and a new block is leased at once; held tickets stay and map over the list a lease of no
    tickets returns. While rota is unreachable, a rotation last answered with picks replays
    them (the versions keep rota's last split); one answered with tickets maps a local counter
    over the last list.
    """

    def __init__(self, rule: str, version: str, resolved: Callable[[], list[Member]]) -> None:
        self.rule = rule
        self.version = version
        self._resolved = resolved
        self._lock = threading.Lock()
        self._blocks: deque[TicketBlock | PickBlock] = deque()
        # The list leased tickets map over (the last answer without picks).
        self._eligible: Eligible | None = None
        # The last list any lease returned: the local rotation's list during an outage.
        self._listed: Eligible | None = None
        # The last answer that leased anything came as picks: refreshes lease a new block, and
        # the local rotation replays the last picks.
        self._picks = False
        self._last_picks: list[tuple[int, Member]] = []
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
        #: Picks passed over because their instance could not take the call, or dropped unused.
        self.skipped_picks = 0

    @property
    def outage(self) -> bool:
        return self._outage

    def draw(self, usable: Callable[[str], bool]) -> tuple[Draw | str | Refused, int | None]:
        """The next call's instance among the usable ones, and a lease to start (a count) or None."""
        with self._lock:
            now = time.monotonic()
            may_lease = not self._leasing and (not (self._outage or self._refusal) or now >= self._retry_at)
            if self._listed is None and self._refusal is not None:
                return self._refusal, self._start(now) if may_lease else None
            if not self._blocks:
                lease = self._start(now) if may_lease else None
                if self._outage:
                    return self._local(usable), lease
                return WAIT, lease
            decision = self._take(usable)
            lease = None
            if may_lease and self._remaining() * 2 <= self._block_size:
                lease = self._start(now)
            return decision, lease

    def refresh(self) -> int | None:
        """After the instance list changed: a lease to start (0: no tickets, just the list) or None."""
        with self._lock:
            if self._listed is None or self._outage:
                return None
            self._drop_picks()
            if self._leasing:
                self._refresh_wanted = True
                return None
            return self._refresh_lease()

    def leased(self, lease: Lease) -> tuple[int | None, bool]:
        """A lease answered; returns (a follow-up lease or None, whether the outage ended)."""
        with self._lock:
            self._leasing = False
            self.leases += 1
            listed = Eligible(lease.members, lease.rule)
            self._listed = listed
            stale = self._refresh_wanted
            self._refresh_wanted = False
            if lease.picks:
                self._picks = True
                self._last_picks = lease.picks
                self.leased_tickets += len(lease.picks)
                if stale:
                    # Chosen over the list from before the change: unused, like dropped picks.
                    self.skipped_picks += len(lease.picks)
                else:
                    self._blocks.append(PickBlock(lease.picks, lease.rule))
            else:
                self._eligible = listed
                self.leased_tickets += lease.count
                if lease.count > 0:
                    self._picks = False
                    self._blocks.append(TicketBlock(lease.first_ticket, lease.first_ticket + lease.count))
            self._refusal = None
            recovered = self._outage
            self._outage = False
            follow_up = self._refresh_lease() if stale else None
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
            if answered_by_rota and self._listed is None:
                self._refusal = error
                return False
            if self._listed is not None or self._resolved():
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
            if self._outage or (self._listed is None and not self._resolved()):
                return False
            self._outage = True
            self._blocks.clear()
            self._retry_at = time.monotonic()
            return True

    def _take(self, usable: Callable[[str], bool]) -> Draw | str:
        """The next call's decision from the held blocks (there is at least one)."""
        while self._blocks:
            block = self._blocks[0]
            if isinstance(block, TicketBlock):
                return self._from_tickets(usable)
            decision = self._from_picks(block, usable)
            if decision is not None:
                return decision
        return WAIT

    def _from_tickets(self, usable: Callable[[str], bool]) -> Draw | str:
        ticket = self._next_ticket()
        eligible = self._eligible
        assert eligible is not None  # every TicketBlock came with a list
        member = eligible.map(ticket)
        if member is not None and usable(member.id):
            return Draw(member, ticket, eligible.rule, False)
        # Skipped the way rota skips `exclude`: the next ticket, over the usable instances.
        excluded = eligible.excluded(usable)
        if self._blocks and isinstance(self._blocks[0], TicketBlock):
            ticket = self._next_ticket()
        member = eligible.map(ticket, excluded)
        if member is None:
            return NONE_USABLE
        return Draw(member, ticket, eligible.rule, False)

    def _from_picks(self, block: PickBlock, usable: Callable[[str], bool]) -> Draw | str | None:
        """The block's next pick whose instance is usable (those before it are gaps); None once
        the block is spent without one; NONE_USABLE, using up nothing, if none of its instances is."""
        checked = False
        while block.next < len(block.picks):
            ticket, member = block.picks[block.next]
            if not usable(member.id):
                if not checked:
                    if not any(usable(i) for i in block.ids):
                        return NONE_USABLE
                    checked = True
                self.skipped_picks += 1
                self._advance(block)
                continue
            self._advance(block)
            return Draw(member, ticket, block.rule, False)
        return None

    def _advance(self, block: PickBlock) -> None:
        block.next += 1
        self._drawn += 1
        if block.next == len(block.picks):
            self._blocks.popleft()

    def _drop_picks(self) -> None:
        if any(isinstance(b, PickBlock) for b in self._blocks):
            kept: deque[TicketBlock | PickBlock] = deque()
            for b in self._blocks:
                if isinstance(b, PickBlock):
                    self.skipped_picks += b.remaining()
                else:
                    kept.append(b)
            self._blocks = kept

    def _refresh_lease(self) -> int:
        """The lease that follows a change of the instance list: new picks, or the list for the held tickets."""
        if self._picks:
            return self._start(time.monotonic())
        self._leasing = True
        return 0

    def _local(self, usable: Callable[[str], bool]) -> Draw | str:
        if self._picks and self._last_picks:
            return self._local_pick(usable)
        eligible = self._listed or Eligible.isolate(self._resolved(), self.version, self.rule)
        turn = self._local_turn
        self._local_turn += 1
        member = eligible.map(turn, eligible.excluded(usable))
        return NONE_USABLE if member is None else Draw(member, turn, eligible.rule, True)

    def _local_pick(self, usable: Callable[[str], bool]) -> Draw | str:
        """The last picks rota sent, over again in order (usable instances only), so that the
        split between versions stays the one rota last chose."""
        picks = self._last_picks
        rule = self._listed.rule if self._listed is not None else self.rule
        for _ in picks:
            turn = self._local_turn
            self._local_turn += 1
            member = picks[turn % len(picks)][1]
            if usable(member.id):
                return Draw(member, turn, rule, True)
        return NONE_USABLE

    def _next_ticket(self) -> int:
        block = self._blocks[0]
        assert isinstance(block, TicketBlock)
        ticket = block.next
        block.next += 1
        self._drawn += 1
        if block.next == block.end:
            self._blocks.popleft()
        return ticket

    def _remaining(self) -> int:
        return sum(b.remaining() for b in self._blocks)

    def _start(self, now: float) -> int:
        elapsed = max(now - self._last_lease_at, 0.001)
        adapted = round(self._drawn * TARGET_LEASE_INTERVAL / elapsed)
        self._block_size = max(MIN_BLOCK, min(MAX_BLOCK, adapted))
        self._last_lease_at = now
        self._drawn = 0
        self._leasing = True
        return self._block_size
