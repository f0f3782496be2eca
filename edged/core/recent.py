"""How much a running total grew in the last few seconds: for status reasons such as "12 result(s) dropped in
the last 60 s", read from any thread without changing anything."""

from __future__ import annotations

import threading
import time
from collections import deque

SAMPLES = 4096  # changes kept at most within a window (beyond, the oldest go: the growth is then undercounted)


class Recent:
    """Samples (when, total) noted where the total changes; `growth()` is a pure read."""

    def __init__(self, window_s: float, total: int = 0) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, int]] = deque([(time.monotonic(), total)], maxlen=SAMPLES)
        self._lock = threading.Lock()

    def note(self, total: int) -> None:
        """The total now (ignored when unchanged); samples older than the window go, but for the newest of
        them, the base the growth is measured from."""
        now = time.monotonic()
        with self._lock:
            if total == self._samples[-1][1]:
                return
            self._samples.append((now, total))
            while len(self._samples) > 1 and self._samples[1][0] <= now - self.window_s:
                self._samples.popleft()

    def growth(self) -> int:
        """How much the total grew within the last `window_s` seconds."""
        cutoff = time.monotonic() - self.window_s
        with self._lock:
            base = self._samples[0][1]
            for when, total in self._samples:
                if when > cutoff:
                    break
                base = total
            return self._samples[-1][1] - base
