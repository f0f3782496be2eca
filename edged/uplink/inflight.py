"""The in-flight window of one broker connection: messages handed to paho and not yet acknowledged.

Both of the publisher's threads touch it: paho's network thread reports PUBACKs (`acked`), the
`edged-mqtt` thread registers what it handed to paho and collects the acknowledged row ids. One lock,
never held while calling paho. It also keeps "careful mode": after a connection dropped with messages in
flight, one message is sent alone, and each acknowledgement doubles the window (1, 2, 4, ... as TCP's slow
start) until it is back to `max_inflight`. A message that makes the broker hang up every time is then
found alone in flight and refused (after `dead_letter_after` refusals, set aside), at a cost of a few
connections (a culprit caught in a wider window costs one more drop and starts over at 1 past the rows
acknowledged meanwhile), while a drop that was nobody's fault (a broker restart) costs only a few
round trips, also on a slow link.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

# MQTT 5 DISCONNECT reasons that a message can cause (malformed, protocol error, implementation specific,
# not authorized, topic name invalid, packet too large, quota exceeded, payload format invalid)
MESSAGE_FAULTS = {0x81, 0x82, 0x83, 0x87, 0x90, 0x95, 0x97, 0x99}
BLAME_WINDOW_S = 2.0  # MQTT 3.1.1 has no reason: a drop this soon after the lone message blames it


@dataclass
class Acked:
    """What the broker acknowledged since the last `collect`."""

    ids: list[int] = field(default_factory=list)
    e2e: list[tuple[str, float]] = field(default_factory=list)  # (pipeline, capture to PUBACK in ms) per result
    refused: list[tuple[list[int], str]] = field(default_factory=list)  # (row ids, reason)


@dataclass
class Message:
    """One message in flight: its rows' ids, pipelines and capture times."""

    ids: list[int]
    stamps: list[tuple[str, float]]


class InFlight:
    """mid -> rows of every unacknowledged message, acks collected for the edged-mqtt thread."""

    def __init__(self, protocol: str, wake_below: int) -> None:
        self.protocol = protocol
        self.wake_below = wake_below  # wake the edged-mqtt thread when fewer than this are in flight
        self.lock = threading.Lock()
        self.messages: dict[int, Message] = {}
        self._early: dict[int, tuple[Any, float]] = {}  # acks (reason, arrival) before their message was registered
        self._acked = Acked()
        self.careful = False
        self.careful_window = 1  # messages in flight at most while careful
        self.sent_at = 0.0
        self.carried = False  # a result was acknowledged on this connection

    def __len__(self) -> int:
        with self.lock:
            return len(self.messages)

    def reset(self) -> None:
        """A new connection: nothing is in flight (what was is sent again from the spool)."""
        with self.lock:
            self.messages.clear()
            self._early.clear()
            self.carried = False

    def reset_keep_carried(self) -> None:
        """The connection closed: forget what was in flight (it is sent again), remember whether it carried."""
        with self.lock:
            self.messages.clear()
            self._early.clear()

    def register(self, sent: list[tuple[int, Message]]) -> bool:
        """Messages just handed to paho (one lock for the whole burst). True when some were acknowledged
        already (on loopback a PUBACK can beat this call): the caller collects them now, not at its next
        wake-up."""
        early: list[tuple[int, tuple[Any, float]]] = []
        with self.lock:
            self.sent_at = time.monotonic()
            for mid, message in sent:
                self.messages[mid] = message
            if self._early:
                early = [(mid, self._early.pop(mid)) for mid, _ in sent if mid in self._early]
                # what is left are acks of the availability and stats messages: dropped now, so that a
                # stale entry can never be taken for a later message that reuses its mid
                self._early.clear()
        for mid, (reason, at) in early:
            self.acked(mid, reason, at)
        return bool(early)

    def acked(self, mid: int, reason: Any, at: float | None = None) -> bool:
        """A PUBACK (paho's thread; `at`: when it arrived, default now). True when the edged-mqtt thread
        should wake up."""
        failed = bool(getattr(reason, "is_failure", False))
        at = time.time() if at is None else at
        with self.lock:
            message = self.messages.pop(mid, None)
            if message is None:
                self._early[mid] = (reason, at)
                return False
            if failed:
                self._acked.refused.append((message.ids, f"broker refused the message: {reason}"))
                return True
            if self.careful:
                self.careful_window *= 2
                self.careful = self.careful_window < self.wake_below
            self.carried = True
            self._acked.ids.extend(message.ids)
            self._acked.e2e.extend((pipeline, max(0.0, (at - ts) * 1e3)) for pipeline, ts in message.stamps)
            return len(self.messages) < self.wake_below  # room for another burst (not on every ack)

    def collect(self) -> Acked:
        """Everything acknowledged or refused since the last call."""
        with self.lock:
            out, self._acked = self._acked, Acked()
        return out

    def dropped(self, reason: Any, stopping: bool) -> list[int]:
        """The connection dropped; the row ids blamed for it (careful mode, one message alone in flight)."""
        with self.lock:
            if not self.messages or stopping:
                return []
            alone = self.careful and len(self.messages) == 1
            blamed = [i for m in self.messages.values() for i in m.ids] if alone and self._blames(reason) else []
            self.careful = True
            self.careful_window = 1
            return blamed

    def _blames(self, reason: Any) -> bool:
        value = getattr(reason, "value", None)
        if self.protocol == "5" and value is not None:
            return int(value) in MESSAGE_FAULTS
        return time.monotonic() - self.sent_at < BLAME_WINDOW_S
