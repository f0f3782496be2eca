"""The clock message: what a consumer needs to correct the times a device stamped while its wall clock was not
trusted (core/clock.py), on `mqtt.clock_topic`, retained, QoS 1: on every connection and at every change.

`{"v": 1, "device", "ts", "state": "synchronized" | "unsynchronized", "boot", "corrections": [{"boot", "mono",
"offset"}, ...]}`: a result whose `clock` says `{"synced": false, "boot": B, "mono": M}` happened at
`M + offset` of the first correction of boot B whose `mono` is at least M (docs/mqtt.md, "Time").
Retained and sent again on every connection, so a consumer that was away, or a broker that lost it, gets it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from edged.core.clock import ClockWatch
from edged.uplink.hooks import Hook, Session

REPUBLISH_S = 600.0  # sent again this often while connected: a retained message someone cleared comes back


class ClockMessage(Hook):
    """Publishes the clock's state and corrections when they change, on each connection, and every REPUBLISH_S
    (a client that cleared the retained message, or a broker that lost it, is corrected within minutes)."""

    def __init__(self, topic: str, device_id: str, clock: ClockWatch) -> None:
        self.topic = topic
        self.device_id = device_id
        self.clock = clock
        self._sent = -1  # the clock's version last published on this connection
        self._due = 0.0  # monotonic: when it goes again regardless

    def bind(self, wake: Callable[[], None]) -> None:
        """A change of the clock asks for a turn."""
        self.clock.on_change(wake)

    def connected(self, session: Session) -> None:  # noqa: ARG002  (the first turn sends it)
        """Send it again on the first turn of every connection."""
        self._sent = -1

    def turn(self, session: Session) -> float | None:
        """Send when the clock changed since the last one."""
        version, now = self.clock.version, time.monotonic()
        if version != self._sent or now >= self._due:
            self._sent, self._due = version, now + REPUBLISH_S
            body = {"v": 1, "device": self.device_id, "ts": round(time.time(), 3), **self.clock.message()}
            session.publish(self.topic, json.dumps(body, separators=(",", ":")).encode(), qos=1, retain=True)
        return self._due - now
