"""Exponential backoff with full jitter, for reconnecting registration and watch streams."""

from __future__ import annotations

import math
import random


class Backoff:
    """Delays before successive retries: uniform in ``[0, ceiling]``, the ceiling doubling.

    The ceiling of the n-th delay (counting from 0) is ``min(cap, initial * multiplier**n)``;
    each delay is drawn uniformly below its ceiling ("full jitter"), so providers that lost
    rota at the same moment do not all come back at the same moment. :meth:`reset` after a
    success starts over from ``initial``.
    """

    def __init__(
        self,
        initial: float = 0.1,
        cap: float = 10.0,
        multiplier: float = 2.0,
        rng: random.Random | None = None,
    ) -> None:
        if initial <= 0 or cap < initial or multiplier < 1:
            raise ValueError("backoff needs 0 < initial <= cap and multiplier >= 1")
        self.initial = initial
        self.cap = cap
        self.multiplier = multiplier
        self._rng = rng or random.Random()
        self._attempt = 0
        # Past this many doublings the ceiling is the cap; stop counting so the power never overflows.
        self._last_growing = 0 if multiplier == 1 else math.ceil(math.log(cap / initial, multiplier))

    @property
    def attempt(self) -> int:
        """Delays handed out since the last reset."""
        return self._attempt

    def ceiling(self) -> float:
        """The upper bound of the next delay."""
        exponent = min(self._attempt, self._last_growing)
        return min(self.cap, self.initial * self.multiplier**exponent)

    def next_delay(self) -> float:
        """The next delay in seconds, in ``[0, ceiling()]``."""
        delay = self._rng.uniform(0.0, self.ceiling())
        self._attempt += 1
        return delay

    def reset(self) -> None:
        self._attempt = 0
