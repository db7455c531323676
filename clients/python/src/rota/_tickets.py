"""Leased tickets mapped to instances, the arithmetic rota runs for a pick (docs/rules.md).

``round_robin`` maps ticket t to position ``t mod n``; ``repeat(n=k)`` to ``(t // k) mod n``;
``weighted`` to slot ``t mod Σw`` of an earliest-deadline-first schedule of the weights reduced
by their gcd. Excluded positions are skipped as rota skips a pick's ``exclude``: the rotating
rules rotate over the accepted positions, ``weighted`` walks its schedule to the next accepted
instance. A ticket whose instance the channel cannot use keeps its ticket and goes to a usable
instance so that the usable ones keep the rule's shares among themselves
(:meth:`TicketMapping.around`, docs/channels.md "Instances the channel cannot use"); which
instances are held out, after a refused connection or timeouts in a row, is :class:`Holds`.
A :class:`Rotation` holds the leased blocks of one (rule, version) and decides, per call,
between a leased ticket, a wait for the first lease, a local rotation while rota is
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
from bisect import bisect_left
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
#: How long an instance that refused a connection is skipped before it is tried again.
CONNECT_HOLD = 1.0
#: Calls in a row ended DEADLINE_EXCEEDED after which an instance is held out, for the first
#: hold; each further such run doubles the hold, up to the longest.
TIMEOUTS_TO_HOLD = 3
FIRST_HOLD = 10.0
LONGEST_HOLD = 60.0


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
        self._split_cache: tuple[tuple[bool, ...], list[int], list[int]] | None = None

    def map(self, ticket: int, excluded: Sequence[bool] | None = None) -> int:
        """The position ``ticket`` maps to, or -1 when no position is accepted."""
        n = len(self.weights)
        accepted = n - (sum(1 for e in excluded if e) if excluded else 0)
        if accepted <= 0:
            return -1
        if self.kind == "weighted":
            slots = self._schedule()
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

    def around(self, ticket: int, unusable: Sequence[bool]) -> int:
        """The position ``ticket`` goes to when the positions flagged ``unusable`` cannot take a call.

        Its own position when that one is usable. Otherwise, over the rule's cycle of slots ``S``
        (the positions; ``weighted``: the slots of its schedule) and the ticket's unit ``u``
        (``repeat(n=r)``: ``t // r``, so a run stays on one instance), the slot
        ``A[(j·|D| + i) mod |A|]`` with ``j = u // |S|``, ``D`` the unusable slots in order,
        ``i`` the rank of slot ``u mod |S|`` among them and ``A`` the usable slots: over ``|A|``
        cycles each usable slot takes ``|D|`` of the unusable slots' tickets, so the usable
        instances keep their shares. -1 when no slot is usable.
        """
        slots = self._schedule() if self.kind == "weighted" else None
        size = len(slots) if slots is not None else len(self.weights)
        if size == 0:
            return -1
        unit = ticket // self.repeat
        slot = unit % size
        position = slots[slot] if slots is not None else slot
        if not unusable[position]:
            return position
        down, up = self._split(unusable, slots)
        if not up:
            return -1
        chosen = up[((unit // size) * len(down) + bisect_left(down, slot)) % len(up)]
        return slots[chosen] if slots is not None else chosen

    def _schedule(self) -> list[int]:
        if self._slots is None:
            self._slots = weighted_schedule(self.weights)
        return self._slots

    def _split(self, unusable: Sequence[bool], slots: list[int] | None) -> tuple[list[int], list[int]]:
        """The unusable and the usable slots of the cycle, in order; the last answer is kept, as
        the same instances stay unusable over many calls."""
        key = tuple(unusable)
        cached = self._split_cache
        if cached is not None and cached[0] == key:
            return cached[1], cached[2]
        names = slots if slots is not None else range(len(self.weights))
        down = [s for s, p in enumerate(names) if unusable[p]]
        up = [s for s, p in enumerate(names) if not unusable[p]]
        self._split_cache = (key, down, up)
        return down, up


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

    def around(self, ticket: int, usable: Callable[[str], bool]) -> Member | None:
        """The usable instance ``ticket`` goes to (:meth:`TicketMapping.around`), None if none is usable."""
        index = self.mapping.around(ticket, [not usable(m.id) for m in self.members])
        return None if index < 0 else self.members[index]

    def usable_member(self, ticket: int, usable: Callable[[str], bool]) -> Member | None:
        """The ticket's own instance when it is usable (the common case, no work over the list),
        else :meth:`around`."""
        member = self.map(ticket)
        if member is not None and usable(member.id):
            return member
        return self.around(ticket, usable)


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
        # An unusable instance's ticket goes, itself, to a usable instance (not the next ticket,
        # which would hand the whole share to the instance after it).
        member = eligible.usable_member(ticket, usable)
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
        member = eligible.usable_member(turn, usable)
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


#: How a finished call counts toward holding its instance out (:meth:`Holds.finished`).
ANSWERED = "answered"
TIMED_OUT = "timed-out"
#: A call that says nothing of the instance's health: cancelled by the caller, or never connected.
NEUTRAL = "neutral"


class _Streak:
    __slots__ = ("holds", "since", "timeouts")

    def __init__(self) -> None:
        self.timeouts = 0
        # Holds in a row so far (the next one lasts FIRST_HOLD * 2**holds).
        self.holds = 0
        # Calls started before this (the start of the last hold) were on their way before it:
        # their timeouts do not count again.
        self.since = -math.inf


class Holds:
    """Instances a channel sends nothing for a while, by instance id; thread-safe, no I/O.

    An instance whose connection was refused is skipped for :data:`CONNECT_HOLD` (or until its
    channel is READY again, :meth:`connected`). After :data:`TIMEOUTS_TO_HOLD` calls in a row to
    an instance ended ``DEADLINE_EXCEEDED``, it is held out for :data:`FIRST_HOLD`; once that has
    passed, the next call its ticket maps to tries it again, and each further run of timeouts
    doubles the hold, up to :data:`LONGEST_HOLD`. Any answer from it ends the run and the
    doubling; a cancelled call or one that never connected changes nothing. Calls started before
    a hold began do not count toward the next one. ``clock`` gives seconds (``time.monotonic``).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._refused: dict[str, float] = {}
        self._held: dict[str, float] = {}
        self._streaks: dict[str, _Streak] = {}

    def usable(self, instance_id: str) -> bool:
        """Whether the instance may take a call now; two dictionary reads when it is not held."""
        refused = self._refused.get(instance_id)
        held = self._held.get(instance_id)
        if refused is None and held is None:
            return True
        now = self.clock()
        return (refused is None or now >= refused) and (held is None or now >= held)

    def held_until(self, instance_id: str) -> float | None:
        """When the instance's hold for timeouts ends (clock seconds), None if it has none."""
        return self._held.get(instance_id)

    def refused(self, instance_id: str) -> None:
        """A call to the instance could not connect."""
        self._refused[instance_id] = self.clock() + CONNECT_HOLD

    def connected(self, instance_id: str) -> None:
        """The instance's channel is READY: a refused connection no longer holds it out."""
        self._refused.pop(instance_id, None)

    def finished(self, instance_id: str, outcome: str, started: float) -> float | None:
        """A call to the instance that started at ``started`` (clock seconds) ended so (ANSWERED,
        TIMED_OUT or NEUTRAL); returns the length of the hold this starts, else None."""
        if outcome == ANSWERED:
            if instance_id in self._streaks:
                with self._lock:
                    self._streaks.pop(instance_id, None)
                    until = self._held.get(instance_id)
                    if until is not None and self.clock() >= until:
                        del self._held[instance_id]
            return None
        if outcome != TIMED_OUT:
            return None
        with self._lock:
            streak = self._streaks.get(instance_id)
            if streak is None:
                streak = self._streaks[instance_id] = _Streak()
            if started < streak.since:
                return None
            streak.timeouts += 1
            if streak.timeouts < TIMEOUTS_TO_HOLD:
                return None
            now = self.clock()
            hold = min(FIRST_HOLD * (1 << min(streak.holds, 16)), LONGEST_HOLD)
            streak.holds += 1
            streak.timeouts = 0
            streak.since = now
            self._held[instance_id] = now + hold
            return hold

    def forget(self, keep: Callable[[str], bool]) -> None:
        """Drops what is known of the instances ``keep`` refuses (they left the list)."""
        with self._lock:
            for table in (self._refused, self._held, self._streaks):
                for instance_id in list(table):
                    if not keep(instance_id):
                        table.pop(instance_id, None)
