"""Thread-safe counters and latency windows that status, sd_notify and logs read."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edged.core.histogram import Histogram
from edged.core.recent import Recent

WINDOW = 512  # latency samples kept per stage
REFUSED_WINDOW_S = 60.0  # a pipeline is degraded while its decoder refused a result within this many seconds


def percentiles(values: deque[float]) -> dict[str, float]:
    """p50/p95/p99 of a window, rounded to 0.01 ms; zeros when empty."""
    if not values:
        return {"p50": 0.0, "p95": 0.0, "p99": 0.0}
    p50, p95, p99 = np.percentile(np.fromiter(values, dtype=np.float64), [50, 95, 99])
    return {"p50": round(float(p50), 2), "p95": round(float(p95), 2), "p99": round(float(p99), 2)}


@dataclass
class PipelineStats:
    """What one pipeline has done so far. Mutated by its threads under `lock`."""

    name: str
    source_uri: str
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    state: str = "starting"  # starting | building_engine | running | waiting (no data) | reconnecting | ended | failed
    error: str | None = None
    provider: str | None = None
    model_name: str | None = None
    model_sha256: str | None = None
    model_int8: bool | None = None
    frames_captured: int = 0
    frames: int = 0  # frames that produced a result (published or not)
    suppressed: int = 0  # results the `publish` filter held back (not stored, no seq)
    motion_skipped: int = 0  # frames the motion gate kept from the model (no motion): not drops
    tracks: int | None = None  # confirmed tracks right now (None: the pipeline does not track)
    events: int = 0  # track and zone events stored
    dropped_frames: int = 0
    reconnects: int = 0
    malformed: int = 0  # input lines/records a sensor source could not read and skipped
    refused: int = 0  # results the decoder refused: outputs that do not fit its reading (never published)
    refused_why: str | None = None  # the last refusal's reason
    _refused_recent: Recent = field(default_factory=lambda: Recent(REFUSED_WINDOW_S), repr=False)
    # last sign of life: a result, a state change, a reconnect attempt (a live reconnect loop is progress)
    progress_mono: float = field(default_factory=time.monotonic)
    _stamps: deque[float] = field(default_factory=lambda: deque(maxlen=64), repr=False)
    _event_stamps: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=4096), repr=False)
    _hist: dict[str, Histogram] = field(default_factory=dict, repr=False)  # per stage, seconds (for /metrics)
    _lat: dict[str, deque[float]] = field(
        default_factory=lambda: {k: deque(maxlen=WINDOW) for k in ("pre", "infer", "post", "total")},
        repr=False,
    )

    def set_state(self, state: str | None = None, error: str | None = None) -> None:
        """Record the source/pipeline state and the last error (None: unchanged; "" clears it). "failed" is
        final: a state change after it is ignored, its error kept; `set_state(error=...)` alone (a model swap
        that failed, the pipeline still running) shows an error whatever the state."""
        with self.lock:
            if state is None:
                if error is not None:
                    self.error = error or None
                return
            if self.state == "failed":
                return
            if state != self.state:  # a change is a sign of life; a looping file saying "running" again is not
                self.progress_mono = time.monotonic()
            self.state = state
            if error is not None:
                self.error = error or None

    def count_capture(self, dropped: int) -> None:
        """A frame was captured; `dropped` frames were overwritten unseen before it."""
        with self.lock:
            self.frames_captured += 1
            self.dropped_frames += dropped

    def count_reconnect(self) -> None:
        """The source is being reopened."""
        with self.lock:
            self.reconnects += 1
            self.progress_mono = time.monotonic()

    def count_malformed(self, count: int) -> None:
        """`count` malformed input lines/records were skipped."""
        with self.lock:
            self.malformed += count

    def count_refused(self, why: str) -> None:
        """A frame's result was refused by its decoder (not published); a sign of life all the same."""
        with self.lock:
            self.refused += 1
            self.refused_why = why
            self.progress_mono = time.monotonic()
            total = self.refused
        self._refused_recent.note(total)

    def refused_recently(self) -> tuple[int, str | None]:
        """(results refused within the last REFUSED_WINDOW_S seconds, the last reason)."""
        with self.lock:
            why = self.refused_why
        return self._refused_recent.growth(), why

    def record_result(self, pre_ms: float, infer_ms: float, post_ms: float, secondary_ms: float | None = None) -> None:
        """One frame went through the model (and the second models on its crops, when it has any)."""
        now = time.monotonic()
        with self.lock:
            self.frames += 1
            self.progress_mono = now
            self._stamps.append(now)
            stages = [("pre", pre_ms), ("infer", infer_ms), ("post", post_ms)]
            stages += [("secondary", secondary_ms)] if secondary_ms is not None else []
            for key, value in stages:
                self._lat.setdefault(key, deque(maxlen=WINDOW)).append(value)
                self._hist.setdefault(key, Histogram()).observe(value / 1e3)
            self._lat["total"].append(pre_ms + infer_ms + post_ms + (secondary_ms or 0.0))

    def histograms(self) -> dict[str, Histogram]:
        """Copies of the stage latency histograms (seconds)."""
        with self.lock:
            return {k: h.copy() for k, h in self._hist.items()}

    def touch(self) -> None:
        """Record progress that is not a result (the model finished loading, a reload)."""
        with self.lock:
            self.progress_mono = time.monotonic()

    def stalled(self, stall_s: float) -> bool:
        """True when nothing happened for `stall_s` although the pipeline should be working.

        An ended or failed pipeline is not stalled (status shows it); a running one that produced no
        result, or a source that neither delivered nor retried, for `stall_s` is: a hung model run or a
        wedged thread.
        """
        with self.lock:
            if self.state in ("ended", "failed"):
                return False
            return time.monotonic() - self.progress_mono > stall_s

    def count_motion_skip(self) -> None:
        """A frame showed no motion and did not go to the model: counted, and a sign of life (a still
        scene is not a stalled pipeline)."""
        with self.lock:
            self.frames_captured += 1
            self.motion_skipped += 1
            self.progress_mono = time.monotonic()

    def count_events(self, count: int, tracks: int) -> None:
        """A tracked frame: `count` events were stored, `tracks` tracks are active."""
        with self.lock:
            self.tracks = tracks
            if count:
                self.events += count
                self._event_stamps.append((time.monotonic(), count))

    def count_suppressed(self) -> None:
        """A result was held back by the pipeline's `publish` filter."""
        with self.lock:
            self.suppressed += 1

    def fps(self) -> float:
        """Results per second over the recent window (0 when idle for > 5 s)."""
        with self.lock:
            stamps = list(self._stamps)
        if len(stamps) < 2 or time.monotonic() - stamps[-1] > 5.0:
            return 0.0
        return round((len(stamps) - 1) / max(stamps[-1] - stamps[0], 1e-9), 2)

    def snapshot(self) -> dict[str, Any]:
        """The `pipelines[]` entry of the status JSON."""
        fps = self.fps()
        since = time.monotonic() - 60.0
        with self.lock:
            per_min = float(sum(n for t, n in self._event_stamps if t >= since))  # events stored in the last minute
            lat = {k: percentiles(v) for k, v in self._lat.items()}
            total = lat.pop("total")
            return {
                "name": self.name,
                "source": self.source_uri,
                "state": self.state,
                "error": self.error,
                "fps": fps,
                "frames": self.frames,
                "suppressed": self.suppressed,
                "motion_skipped": self.motion_skipped,
                "tracks": self.tracks,
                "events": self.events,
                "events_per_min": per_min,
                "frames_captured": self.frames_captured,
                "dropped_frames": self.dropped_frames,
                "reconnects": self.reconnects,
                "malformed": self.malformed,
                "refused": self.refused,
                "provider": self.provider,
                "model": {"name": self.model_name, "sha256": self.model_sha256, "int8": self.model_int8},
                "latency_ms": {**total, "stages": lat},
            }
