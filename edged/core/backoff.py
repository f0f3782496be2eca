"""Capped exponential backoff with full jitter, shared by sources and the publisher."""

from __future__ import annotations

import random


class Backoff:
    """Delays min, 2*min, 4*min ... capped at max; each drawn uniformly from [delay/2, delay]."""

    def __init__(self, minimum: float, maximum: float, rng: random.Random | None = None) -> None:
        if minimum <= 0 or maximum < minimum:
            raise ValueError("backoff needs 0 < minimum <= maximum")
        self.minimum = minimum
        self.maximum = maximum
        self.attempts = 0
        self._rng = rng or random.Random()  # noqa: S311  (jitter, not cryptography)

    def next_delay(self) -> float:
        """The delay before the next attempt; grows until reset()."""
        ceiling = min(self.maximum, self.minimum * (2 ** min(self.attempts, 30)))
        self.attempts += 1
        return self._rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        """Call after a success: the next failure starts from the minimum again."""
        self.attempts = 0
