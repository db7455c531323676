"""Backoff: bounds, growth, cap and jitter, with a seeded random source."""

from __future__ import annotations

import random

import pytest

from rota import Backoff


def test_ceiling_doubles_from_initial_up_to_the_cap() -> None:
    backoff = Backoff(initial=0.1, cap=10.0, rng=random.Random(1))
    ceilings = []
    for _ in range(10):
        ceilings.append(backoff.ceiling())
        backoff.next_delay()
    assert ceilings == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0, 10.0, 10.0])


def test_cap_holds_after_very_many_attempts() -> None:
    backoff = Backoff(initial=0.1, cap=10.0, rng=random.Random(2))
    for _ in range(5000):
        assert 0.0 <= backoff.next_delay() <= 10.0
    assert backoff.attempt == 5000
    assert backoff.ceiling() == 10.0


def test_delays_are_drawn_uniformly_below_each_ceiling_from_the_given_random_source() -> None:
    backoff = Backoff(initial=0.1, cap=10.0, rng=random.Random(42))
    reference = random.Random(42)
    expected = [reference.uniform(0.0, c) for c in [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0, 10.0]]
    assert [backoff.next_delay() for _ in range(9)] == expected


def test_full_jitter_spreads_over_the_whole_range() -> None:
    backoff = Backoff(initial=1.0, cap=1.0, rng=random.Random(7))
    delays = [backoff.next_delay() for _ in range(500)]
    assert all(0.0 <= d <= 1.0 for d in delays)
    assert min(delays) < 0.05
    assert max(delays) > 0.95
    assert len(set(delays)) == 500


def test_reset_starts_over_from_initial() -> None:
    backoff = Backoff(initial=0.5, cap=4.0, rng=random.Random(3))
    for _ in range(6):
        backoff.next_delay()
    assert backoff.ceiling() == 4.0
    backoff.reset()
    assert backoff.attempt == 0
    assert backoff.ceiling() == 0.5
    assert backoff.next_delay() <= 0.5


def test_multiplier_other_than_two() -> None:
    backoff = Backoff(initial=1.0, cap=100.0, multiplier=3.0, rng=random.Random(4))
    ceilings = []
    for _ in range(6):
        ceilings.append(backoff.ceiling())
        backoff.next_delay()
    assert ceilings == pytest.approx([1.0, 3.0, 9.0, 27.0, 81.0, 100.0])


@pytest.mark.parametrize(("initial", "cap", "multiplier"), [(0.0, 1.0, 2.0), (2.0, 1.0, 2.0), (0.1, 1.0, 0.5)])
def test_nonsense_settings_are_refused(initial: float, cap: float, multiplier: float) -> None:
    with pytest.raises(ValueError, match="0 < initial <= cap"):
        Backoff(initial=initial, cap=cap, multiplier=multiplier)
