"""Leased tickets and the instances they go to: the rotation state both rota channels share (no I/O).

A lease comes back in one of two shapes, and a :class:`Rotation` takes either without knowing
which to expect:

- a ticket range (a :class:`TicketBlock`): tickets ``first .. first + count - 1``, ticket
  ``first + i`` going to ``instances[positions[i]]``, as rota's rule mapped it. The channel only
  indexes; it holds no copy of the rules, so any rule rota leases is taken.
- for a lease without a version of a service under gray release, the picks rota mapped itself
  (a :class:`PickBlock`: per pick an instance and the ticket to report, used in order).

Either way, a call whose ticket (or pick) names an instance the channel cannot use takes the
next one of the stream whose instance is usable; the ones passed over are consumed, gaps in the
shared rotation like tickets another consumer drew. As the next tickets follow rota's own
sequence, the usable instances keep the rule's shares among themselves, and a ``repeat(n=N)``
run of an unusable instance is skipped whole. Every lease names the unusable instances in its
``exclude`` (:func:`excluded_ids`), so rota maps the next block over the usable ones only (a
lease rota refuses for its ``exclude`` is asked again at once without it).
Which instances are held out, after a refused connection or timeouts in a row, is
:class:`Holds`. A :class:`Rotation` holds the leased blocks of one (rule, version) and decides,
per call, between a leased ticket, a wait for a lease, a local rotation while rota is
unreachable, and rota's refusal.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

#: Least and most tickets one lease reserves; between them the block follows the call rate.
MIN_BLOCK = 16
MAX_BLOCK = 8192
#: The interval between leases the block size aims at, at a steady call rate.
TARGET_LEASE_INTERVAL = 0.075
#: How often a rotation asks rota again after a failed lease.
RETRY_INTERVAL = 1.0
#: The most instance ids one lease names in ``exclude`` (rota's limit).
MAX_EXCLUDE = 1000
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


def isolate(members: Iterable[Member], version: str) -> list[Member]:
    """rota's version isolation with the default fallback, ordered by id: the version's
    instances, else the unversioned ones."""
    members = list(members)
    chosen = [m for m in members if m.version == version]
    if not chosen and version:
        chosen = [m for m in members if not m.version]
    return sorted(chosen, key=lambda m: m.id)


def excluded_ids(ids: Iterable[str], usable: Callable[[str], bool]) -> list[str]:
    """What a lease names in ``exclude``: the ids among ``ids`` that are not usable, in id
    order, the first :data:`MAX_EXCLUDE` of them."""
    return sorted(i for i in ids if not usable(i))[:MAX_EXCLUDE]


@dataclass(frozen=True)
class Draw:
    """What one call is routed by: the instance, its ticket, the rule, and whether rota leased it."""

    member: Member
    ticket: int
    rule: str
    local: bool


class Refused(Exception):
    """rota refused the lease (or answered one the channel cannot use)."""

    def __init__(self, code: object, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


#: draw() results other than a Draw.
WAIT = "wait"
NONE_USABLE = "none-usable"


class UnusableLease(ValueError):
    """A lease answer the channel cannot route by (positions that do not fit its tickets)."""


@dataclass(frozen=True)
class Lease:
    """One answer to ``Balancer.Lease``: a ticket range, or (``picks`` not empty) rota's own picks.

    A ticket range's ticket ``first_ticket + i`` goes to ``members[positions[i]]``. ``picks`` are
    (ticket, instance) in the order calls use them; ``first_ticket``, ``count`` and
    ``positions`` then say nothing (rota sends 0, the number of picks and no positions).
    """

    first_ticket: int
    count: int
    members: list[Member]
    rule: str
    positions: list[int] = field(default_factory=list)
    picks: list[tuple[int, Member]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.picks:
            return
        if len(self.positions) != self.count:
            raise UnusableLease(
                f"rota's lease answer has {len(self.positions)} positions for {self.count} tickets "
                f"(from ticket {self.first_ticket}); the channel cannot route by it"
            )
        for i, position in enumerate(self.positions):
            if position >= len(self.members):
                raise UnusableLease(
                    f"rota's lease answer sends ticket {self.first_ticket + i} to position {position}, "
                    f"past its {len(self.members)} instances; the channel cannot route by it"
                )


class TicketBlock:
    """Leased tickets ``next .. end - 1`` of one lease, each with its instance's position."""

    __slots__ = ("end", "first", "members", "next", "positions", "rule")

    def __init__(self, lease: Lease) -> None:
        self.first = self.next = lease.first_ticket
        self.end = lease.first_ticket + lease.count
        self.members = lease.members
        self.positions = lease.positions
        self.rule = lease.rule

    def remaining(self) -> int:
        return self.end - self.next


class PickBlock:
    """Picks rota mapped itself (gray release without a version), each used once, in order."""

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

    Blocks of both shapes are used in the order they were leased; a call passes over the tickets
    (or picks) whose instance it cannot use and takes the next one, and waits for the next lease
    when the blocks held have none left. When the instance list changes (:meth:`refresh`), the
    held blocks are dropped, since rota positioned them over the old list, and a new block is
    leased at once. While rota is unreachable, a rotation last answered with picks replays them
    (the versions keep rota's last split); one answered with tickets rotates a local counter
    over the usable instances of the last list, one call each in id order.
    """

    def __init__(self, rule: str, version: str, resolved: Callable[[], list[Member]]) -> None:
        self.rule = rule
        self.version = version
        self._resolved = resolved
        self._lock = threading.Lock()
        self._blocks: deque[TicketBlock | PickBlock] = deque()
        # The last list any lease returned, and its rule: the local rotation's during an outage.
        self._listed: list[Member] | None = None
        self._listed_rule = rule
        # The last answer that leased anything came as picks: the local rotation replays them.
        self._picks = False
        self._last_picks: list[tuple[int, Member]] = []
        self._leasing = False
        self._refresh_wanted = False
        self._outage = False
        self._refusal: Refused | None = None
        # The exclude of a lease rota refused: not sent again (see exclusion()).
        self._refused_exclude: tuple[str, ...] = ()
        self._retry_at = 0.0
        self._local_turn = 0
        self._block_size = MIN_BLOCK
        self._last_lease_at = time.monotonic()
        self._drawn = 0
        self.leases = 0
        self.leased_tickets = 0
        #: Tickets passed over because their instance could not take the call, or dropped unused.
        self.skipped_tickets = 0
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
            decision: Draw | str | Refused = self._take(usable) if self._blocks else WAIT
            if decision == WAIT:
                # Nothing held, or nothing held that a usable instance takes.
                lease = self._start(now) if may_lease else None
                if self._refusal is not None and self._listed is None:
                    return self._refusal, lease
                if self._outage:
                    return self._local(usable), lease
                return WAIT, lease
            lease = None
            if may_lease and self._remaining() * 2 <= self._block_size:
                lease = self._start(now)
            return decision, lease

    def refresh(self) -> int | None:
        """After the instance list changed: the held blocks are dropped; a lease to start or None."""
        with self._lock:
            if self._listed is None or self._outage:
                return None
            self._drop()
            if self._leasing:
                self._refresh_wanted = True
                return None
            return self._start(time.monotonic())

    def leased(self, lease: Lease) -> tuple[int | None, bool]:
        """A lease answered; returns (a follow-up lease or None, whether the outage ended)."""
        with self._lock:
            self._leasing = False
            self.leases += 1
            self._listed = lease.members
            self._listed_rule = lease.rule
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
                self.leased_tickets += lease.count
                if lease.count > 0:
                    self._picks = False
                    if stale:
                        self.skipped_tickets += lease.count
                    else:
                        self._blocks.append(TicketBlock(lease))
            self._refusal = None
            recovered = self._outage
            self._outage = False
            follow_up = self._start(time.monotonic()) if stale else None
            return follow_up, recovered

    def failed(self, error: Refused, answered_by_rota: bool) -> bool:
        """A lease failed; returns True when this starts an outage (log it once).

        rota's own answer fails the calls with it while the rotation has no list yet; any other
        failure after a list was seen starts the local rotation.
        """
        with self._lock:
            self._leasing = False
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

    def exclusion(self, unusable: list[str]) -> list[str]:
        """What a lease names in ``exclude``, given the ids the channel cannot use now: those,
        unless rota refused a lease naming exactly those (then nothing)."""
        with self._lock:
            return [] if tuple(unusable) == self._refused_exclude else unusable

    def refused_excluding(self, exclude: list[str]) -> int:
        """rota refused a lease that named ``exclude`` (it refuses one excluding every eligible
        instance, of a gray release's versions too; no ticket was taken): the lease to start at
        once, which names nothing, and no later lease names this set again."""
        with self._lock:
            self._refused_exclude = tuple(exclude)
            self._leasing = True
            return self._block_size

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
        """The next call's decision from the held blocks: a Draw, NONE_USABLE, or WAIT once the
        held blocks are spent without a usable ticket (bounded by the tickets held)."""
        while self._blocks:
            block = self._blocks[0]
            if isinstance(block, TicketBlock):
                decision = self._from_tickets(block, usable)
            else:
                decision = self._from_picks(block, usable)
            if decision is not None:
                return decision
        return WAIT

    def _from_tickets(self, block: TicketBlock, usable: Callable[[str], bool]) -> Draw | str | None:
        """The block's next ticket whose instance is usable (those before it are gaps); None once
        the block is spent without one; NONE_USABLE, using up nothing, if none of its instances is."""
        offset = block.next - block.first
        positions = block.positions
        member = block.members[positions[offset]]
        if not usable(member.id):
            # Only now is the list looked at: which of its instances may take a call.
            fit = [usable(m.id) for m in block.members]
            if not any(fit):
                if not self._usable_elsewhere(block, usable):
                    return NONE_USABLE
                # The list left out instances usable now (the lease excluded them): the block's
                # tickets are gaps, and the next lease positions tickets over those instances.
                self.skipped_tickets += block.remaining()
                self._drawn += block.remaining()
                self._blocks.popleft()
                return None
            end = block.end - block.first
            start = offset
            while offset < end and not fit[positions[offset]]:
                offset += 1
            self.skipped_tickets += offset - start
            self._drawn += offset - start
            block.next = block.first + offset
            if offset == end:
                self._blocks.popleft()
                return None
            member = block.members[positions[offset]]
        ticket = block.next
        self._advance(block)
        return Draw(member, ticket, block.rule, False)

    def _usable_elsewhere(self, block: TicketBlock, usable: Callable[[str], bool]) -> bool:
        """Whether an instance of the rotation's version that the block's list left out is usable."""
        listed = {m.id for m in block.members}
        return any(usable(m.id) for m in isolate(self._resolved(), self.version) if m.id not in listed)

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

    def _advance(self, block: TicketBlock | PickBlock) -> None:
        block.next += 1
        self._drawn += 1
        if block.remaining() == 0:
            self._blocks.popleft()

    def _drop(self) -> None:
        """Drops every held block: their tickets and picks are gaps."""
        for b in self._blocks:
            if isinstance(b, PickBlock):
                self.skipped_picks += b.remaining()
            else:
                self.skipped_tickets += b.remaining()
        self._blocks.clear()

    def _local(self, usable: Callable[[str], bool]) -> Draw | str:
        if self._picks and self._last_picks:
            return self._local_pick(usable)
        if self._listed is not None:
            members, rule = self._listed, self._listed_rule
        else:
            members, rule = isolate(self._resolved(), self.version), self.rule
        up = [m for m in members if usable(m.id)]
        if not up:
            return NONE_USABLE
        turn = self._local_turn
        self._local_turn += 1
        return Draw(up[turn % len(up)], turn, rule, True)

    def _local_pick(self, usable: Callable[[str], bool]) -> Draw | str:
        """The last picks rota sent, over again in order (usable instances only), so that the
        split between versions stays the one rota last chose."""
        picks = self._last_picks
        for _ in picks:
            turn = self._local_turn
            self._local_turn += 1
            member = picks[turn % len(picks)][1]
            if usable(member.id):
                return Draw(member, turn, self._listed_rule, True)
        return NONE_USABLE

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
    passed, the next call whose ticket names it tries it again, and each further run of timeouts
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
