"""rota's mapping of a ticket to an instance for the leasable rules, as docs/rules.md states it:
the test oracle the channel scenarios check rota's rotation against (the channels themselves
only index the positions rota sends), and the source of the fake lease answers the unit tests
feed the channels' rotation.

``round_robin``: ticket t goes to position ``t mod n``; ``repeat(n=N)``: ``(t / N) mod n``;
``weighted``: slot ``t mod Σw`` of the earliest-deadline-first schedule of the weights reduced
by their gcd (instance i's k-th slot due at ``(2k+1)/2wᵢ``, ties to the lower i; weight 0
never). Small weights only: the scaling rota applies past 2²⁰ slots is not reproduced.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from fractions import Fraction

MAX_SLOTS = 1 << 20


def weighted_schedule(weights: Sequence[int]) -> list[int]:
    """The positions in slot order."""
    divisor = math.gcd(*weights) if any(weights) else 1
    reduced = [w // divisor for w in weights]
    assert sum(reduced) <= MAX_SLOTS, "the oracle does not scale schedules down"
    due = [(Fraction(2 * k + 1, 2 * w), i) for i, w in enumerate(reduced) for k in range(w)]
    return [i for _, i in sorted(due)]


def run_length(rule: str) -> int:
    """The run of one instance: ``repeat(n=N)``'s N (``repeat`` alone: 3), else 1."""
    r = rule.replace(" ", "")
    if r == "repeat":
        return 3
    found = re.fullmatch(r"repeat\(n=(\d+)\)", r)
    return int(found.group(1)) if found else 1


def position(rule: str, weights: Sequence[int], ticket: int) -> int:
    """The position ``ticket`` goes to over a list with these weights (in id order)."""
    if rule.replace(" ", "") == "weighted":
        slots = weighted_schedule(weights)
        return slots[ticket % len(slots)]
    assert rule in ("", "round_robin") or rule.startswith("repeat"), f"the oracle has no rule {rule!r}"
    return (ticket // run_length(rule)) % len(weights)


def positions(rule: str, weights: Sequence[int], first: int, count: int) -> list[int]:
    """A lease answer's positions: tickets ``first .. first + count - 1``."""
    return [position(rule, weights, t) for t in range(first, first + count)]
