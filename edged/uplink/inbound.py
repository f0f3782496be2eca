"""What comes in on the publisher's connection: each message to the handler of the subscription it matches,
within a budget per topic, so that no neighbour on the broker can stall the device by flooding one topic.

paho reads every incoming message on its network thread, the same thread that reads the PUBACKs of the
results: whatever a message costs there, a flood multiplies. So a message costs here only its topic (matched
once per topic name, then cached), a token from its topic's bucket, and its handler's queueing; one past the
budget is dropped and counted before anything else is read of it. Each topic has its own bucket (a command
topic `cmd/<name>` each), so a flood on one topic does not cost a signed command on another its place. A
message on a topic nothing subscribed to (a broker that sends what was not asked for) is counted and dropped.

The budget, per topic: PER_TOPIC_PER_S messages a second, bursts of PER_TOPIC_BURST; a topic name new to it
starts with NEW_TOPIC_TOKENS, and a subscription takes on at most NEW_TOPICS_PER_S new names a second, so a
flood of made-up names is a flood too. An `edged ingest` asks each device at most one request per stream per
30 s, and an operator's commands come one at a time: both stay far inside it. Status says when a flood was
dropped (`N message(s) on <filter> dropped in the last 60 s: a flood (more than 20 a second on one topic)`, a
reason while it lasts), and `mqtt.inbound` counts per subscription.

This reads what a listening connection (listener.py) brings; nothing is subscribed on the results' own.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as paho

PER_TOPIC_PER_S = 20.0  # messages a second on one topic, at most ...
PER_TOPIC_BURST = 64.0  # ... in bursts of this many
TOPICS_KEPT = 256  # topic names with a bucket of their own; beyond, the least recently seen are forgotten
NEW_TOPICS_PER_S = 10.0  # topic names a subscription takes on per second (a flood of made-up names is a flood) ...
NEW_TOPIC_TOKENS = 8.0  # ... each with this many messages at once (then it refills like any other)
FLOOD_WINDOW_S = 60.0  # status names a flood for this long after its last dropped message

Handler = Callable[[paho.MQTTMessage], None]


@dataclass
class _Topic:
    """One topic name: where it goes, and its bucket."""

    route: str  # the subscription's filter it matched
    handler: Handler
    budget: bool = True  # False: a subscription that bounds itself (a rollout's model chunks)
    tokens: float = NEW_TOPIC_TOKENS  # a new name starts with a few, not a whole burst: made-up names add up less
    stamp: float = field(default_factory=time.monotonic)

    def admit(self, now: float) -> bool:
        if not self.budget:
            return True
        self.tokens = min(PER_TOPIC_BURST, self.tokens + max(0.0, now - self.stamp) * PER_TOPIC_PER_S)
        self.stamp = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


@dataclass
class _Counts:
    received: int = 0
    dropped: int = 0
    drops: deque[tuple[int, int]] = field(default_factory=deque)  # (monotonic second, dropped in it)
    names: float = NEW_TOPICS_PER_S  # new topic names it may still take on now (a bucket)
    names_stamp: float = field(default_factory=time.monotonic)

    def new_name(self, now: float) -> bool:
        self.names = min(NEW_TOPICS_PER_S, self.names + max(0.0, now - self.names_stamp) * NEW_TOPICS_PER_S)
        self.names_stamp = now
        if self.names < 1.0:
            return False
        self.names -= 1.0
        return True

    def drop(self, now: float) -> None:
        self.dropped += 1
        second = int(now)
        if self.drops and self.drops[-1][0] == second:
            self.drops[-1] = (second, self.drops[-1][1] + 1)
        else:
            self.drops.append((second, 1))


class Inbound:
    """The routes of the current connection and the budgets of every topic (thread-safe: paho's thread
    delivers, the edged-mqtt thread routes, status reads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._routes: list[tuple[str, Handler, bool]] = []
        self._topics: OrderedDict[str, _Topic] = OrderedDict()
        self._counts: dict[str, _Counts] = {}
        self.unrouted = 0  # messages on topics nothing subscribed to

    def route(self, filters: list[str], handler: Handler, *, budget: bool = True) -> None:
        """Messages on topics matching `filters` go to `handler` (paho's thread; it must only queue), within
        the per-topic budget unless `budget` is False. The first route a topic matches takes it."""
        with self._lock:
            known = {f for f, _, _ in self._routes}
            self._routes += [(f, handler, budget) for f in filters if f not in known]
            self._topics.clear()  # matched again against the new routes
            for f in filters:
                self._counts.setdefault(f, _Counts())

    def unroute(self, filters: list[str]) -> None:
        """No more messages on these filters."""
        with self._lock:
            self._routes = [r for r in self._routes if r[0] not in filters]
            self._topics.clear()

    def clear(self) -> None:
        """A new connection: its hooks route again."""
        with self._lock:
            self._routes = []
            self._topics.clear()

    def deliver(self, message: paho.MQTTMessage) -> None:
        """One message from paho's network thread: to its handler, within its topic's budget, or dropped."""
        try:
            name = message.topic
        except UnicodeDecodeError:  # a broker that lets a topic which is not UTF-8 through: no topic of ours
            name = None
        now = time.monotonic()
        with self._lock:
            topic = self._topic(name, now) if name is not None else None
            if topic is None:
                return
            counts = self._counts[topic.route]
            counts.received += 1
            if not topic.admit(now):
                counts.drop(now)
                return
            handler = topic.handler
        handler(message)

    def _topic(self, name: str, now: float) -> _Topic | None:
        """The topic's entry (with the lock held): found, or matched against the routes once; None when it is
        dropped (nothing subscribed to it, or its subscription took on too many new names lately)."""
        topic = self._topics.get(name)
        if topic is not None:
            self._topics.move_to_end(name)
            return topic
        route = next((r for r in self._routes if paho.topic_matches_sub(r[0], name)), None)
        if route is None:
            self.unrouted += 1
            return None
        counts = self._counts[route[0]]
        if route[2] and not counts.new_name(now):
            counts.received += 1
            counts.drop(now)
            return None
        topic = self._topics[name] = _Topic(route[0], route[1], route[2], stamp=now)
        if len(self._topics) > TOPICS_KEPT:
            self._topics.popitem(last=False)
        return topic

    def floods(self) -> list[tuple[str, int]]:
        """(subscription, messages dropped in the last FLOOD_WINDOW_S) for each that dropped some."""
        cutoff = int(time.monotonic() - FLOOD_WINDOW_S)
        out = []
        with self._lock:
            for name, counts in self._counts.items():
                while counts.drops and counts.drops[0][0] < cutoff:
                    counts.drops.popleft()
                n = sum(d for _, d in counts.drops)
                if n:
                    out.append((name, n))
        return out

    def snapshot(self) -> dict[str, Any]:
        """The `mqtt.inbound` entry of the status JSON."""
        with self._lock:
            subs = {name: {"received": c.received, "dropped": c.dropped} for name, c in self._counts.items()}
            return {"per_topic_per_s": PER_TOPIC_PER_S, "subscriptions": subs, "unrouted": self.unrouted}
