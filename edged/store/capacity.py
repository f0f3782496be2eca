"""How long the spool can hold results if the broker goes away now: the room it has (`max_bytes`, lowered to
what the disk holds) over the rate results come in (bytes a second, over the last minute).

A device finds out that its spool is small when an outage comes and results are dropped; this says so while it
is still online: `spool.capacity_s` in status (and the stats message, and `edged_spool_capacity_seconds`), and a
status reason while it is below `spool.min_capacity` (one hour by default). The rate is what the pipelines
append (results, events, gaps), measured once a minute's worth or MIN_SAMPLES results have come; until then, and
while nothing comes, the capacity is unknown (None), never a guess.
"""

from __future__ import annotations

import threading
import time
from collections import deque

WINDOW_S = 60.0
MIN_SAMPLES = 100  # results before a rate is trusted when the window is not full yet
MIN_SPAN_S = 5.0


class IntakeRate:
    """Bytes appended per second over the last WINDOW_S; thread-safe, O(1) per append (one-second buckets)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buckets: deque[list[float]] = deque()  # [second, bytes, results]
        self._since = time.monotonic()

    def note(self, size: int) -> None:
        """One result of `size` payload bytes was appended."""
        now = time.monotonic()
        second = float(int(now))
        with self._lock:
            if self._buckets and self._buckets[-1][0] == second:
                self._buckets[-1][1] += size
                self._buckets[-1][2] += 1
            else:
                self._buckets.append([second, float(size), 1.0])
            while self._buckets and self._buckets[0][0] < now - WINDOW_S:
                self._buckets.popleft()

    def bytes_per_s(self) -> float | None:
        """The rate, or None while it cannot be told (too little seen yet, or nothing for a whole window)."""
        now = time.monotonic()
        with self._lock:
            live = [b for b in self._buckets if b[0] >= now - WINDOW_S]
        span = min(WINDOW_S, now - self._since)
        results = sum(b[2] for b in live)
        if not live or span < MIN_SPAN_S or (span < WINDOW_S and results < MIN_SAMPLES):
            return None
        return sum(b[1] for b in live) / span


def capacity_s(room_bytes: int, rate: float | None) -> float | None:
    """Seconds of outage `room_bytes` holds at `rate` bytes a second (None: the rate is unknown)."""
    if rate is None or rate <= 0:
        return None
    return max(0.0, room_bytes / rate)


def describe(seconds: float | None) -> str:
    """`3 d 4 h`, `2 h 5 min`, `12 min`, `40 s`; `unknown` for None."""
    if seconds is None:
        return "unknown"
    s = int(seconds)
    days, hours, minutes = s // 86400, s % 86400 // 3600, s % 3600 // 60
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min" if minutes else f"{s} s"
