"""Cumulative latency histograms (Prometheus-style buckets, in seconds) kept beside the percentile
windows: the windows answer `edged status`, the histograms `/metrics` (edged/ops/metrics.py), where
rates and quantiles over any period come from the counts."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

# from 0.5 ms (a tiny model's stage) to 10 s (capture to PUBACK over a slow link)
BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass
class Histogram:
    """Counts per bucket and the sum; not thread-safe (its owner's lock guards it)."""

    bounds: tuple[float, ...] = BUCKETS_S
    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS_S) + 1))  # the last: above all bounds
    total: float = 0.0

    def observe(self, seconds: float) -> None:
        """Count one value."""
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.total += seconds

    def cumulative(self) -> list[tuple[str, float]]:
        """`(upper bound, values <= it)` for each bucket, ending with `+Inf` (the count of all)."""
        out, running = [], 0
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts, strict=True):
            running += count
            out.append((bound, float(running)))
        return out

    def copy(self) -> Histogram:
        """A copy to read outside the lock."""
        return Histogram(self.bounds, list(self.counts), self.total)
