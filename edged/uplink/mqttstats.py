"""The uplink's counters (the `mqtt` entry of the status JSON): connection, acknowledgements, refusals by the
broker, end-to-end latency. Mutated by the uplink's threads; status, metrics and health read a snapshot."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edged.core.histogram import Histogram
from edged.core.stats import WINDOW, percentiles
from edged.uplink.inbound import Inbound

RATE_WINDOW_S = 10.0  # `published_per_s` is over the last this many seconds (or since the connection came up)


@dataclass
class MqttStats:
    """Publisher counters; mutated by the publisher thread."""

    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    enabled: bool = True
    broker: str = ""
    connected: bool = False
    published: int = 0  # acknowledged by the broker
    failed: int = 0  # PUBACK with a failure reason code
    last_publish_ts: float | None = None
    last_error: str | None = None
    connects: int = 0
    connected_mono: float | None = None  # when the current connection came up
    last_ack_mono: float | None = None  # when the broker last acknowledged a result
    broker_limits: dict[str, Any] = field(default_factory=dict)  # what the last CONNACK allowed (MQTT 5)
    broker_problems: list[str] = field(default_factory=list)  # what that broker cannot do that edged needs
    protocol: str = ""  # the MQTT version of the last connection (3.1.1 when a broker refused 5)
    suspicion: tuple[float, str] | None = None  # (monotonic, what): a pattern of drops, e.g. a session takeover
    inbound: Inbound = field(default_factory=Inbound, repr=False)  # what comes in: routes and budgets (inbound.py)
    listeners: dict[str, Callable[[], dict[str, Any]]] = field(default_factory=dict, repr=False)  # their snapshots
    _acks: deque[tuple[float, int]] = field(default_factory=deque, repr=False)  # (when, n) of the last RATE_WINDOW_S
    _e2e: dict[str, deque[float]] = field(default_factory=dict, repr=False)  # capture -> PUBACK, ms
    _e2e_hist: dict[str, Histogram] = field(default_factory=dict, repr=False)  # the same, seconds (for /metrics)

    def count_published(self, n: int, e2e: list[tuple[str, float]] | None = None) -> None:
        """`n` results were acknowledged by the broker; `e2e`: (pipeline, capture to PUBACK in ms) of each."""
        now = time.monotonic()
        wall = time.time()
        with self.lock:
            self.published += n
            self.last_publish_ts = wall
            self.last_ack_mono = now
            self._acks.append((now, n))
            while self._acks[0][0] < now - RATE_WINDOW_S:  # bounded by time, not count: any rate is counted whole
                self._acks.popleft()
            for pipeline, ms in e2e or ():
                window = self._e2e.get(pipeline)
                if window is None:
                    window = self._e2e[pipeline] = deque(maxlen=WINDOW)
                window.append(ms)
                self._e2e_hist.setdefault(pipeline, Histogram()).observe(ms / 1e3)

    def e2e(self, pipeline: str) -> dict[str, float]:
        """Capture-to-PUBACK latency of a pipeline's recent results: p50/p95/p99 in ms."""
        with self.lock:
            return percentiles(self._e2e.get(pipeline, deque()))

    def e2e_histograms(self) -> dict[str, Histogram]:
        """Copies of the capture-to-PUBACK histograms per pipeline (seconds)."""
        with self.lock:
            return {k: h.copy() for k, h in self._e2e_hist.items()}

    def ack_stalled_s(self) -> float:
        """Seconds the current connection has gone without an acknowledgement (0 when not connected)."""
        with self.lock:
            if not self.connected or self.connected_mono is None:
                return 0.0
            since = max(self.connected_mono, self.last_ack_mono or 0.0)
            return time.monotonic() - since

    def rate(self) -> float:
        """Acknowledged results per second over the last RATE_WINDOW_S, or over the time since the connection
        came up when that is shorter (at least 1 s): 6 s into a connection at 5/s it says 5/s, not 3/s
        (call with the lock held)."""
        now = time.monotonic()
        up = now - self.connected_mono if self.connected and self.connected_mono is not None else RATE_WINDOW_S
        span = min(RATE_WINDOW_S, max(1.0, up))
        return round(sum(n for t, n in self._acks if t >= now - span) / span, 2)

    def snapshot(self) -> dict[str, Any]:
        """The `mqtt` entry of the status JSON."""
        with self.lock:
            return {
                "enabled": self.enabled,
                "broker": self.broker,
                "connected": self.connected,
                "published": self.published,
                "published_per_s": self.rate(),
                "failed": self.failed,
                "last_publish_ts": self.last_publish_ts,
                "last_error": self.last_error,
                "connects": self.connects,
                "broker_limits": dict(self.broker_limits),
                "broker_problems": list(self.broker_problems),
                "protocol": self.protocol,
                "suspicion": self.suspicion[1] if self.suspicion else None,
                "latency_ms": percentiles(deque(v for w in self._e2e.values() for v in w)),
                "inbound": self.inbound.snapshot(),
                "listeners": {name: snap() for name, snap in self.listeners.items()},
            }
