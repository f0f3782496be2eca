"""Messages beside the results: command replies, events and the retained state.

They are not spooled (a reply to a command nobody waits for any more is worth nothing after a restart);
they wait in a small bounded queue for the next connection and go before the next results. The side channel
is a hook on the publisher's connection (hooks.py), added by the daemon with remote control.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edged.uplink.hooks import Hook, Incoming, Session

log = logging.getLogger(__name__)

SIDE_MAX = 256  # messages waiting for a connection at most (the oldest is dropped beyond, with a warning)


@dataclass(frozen=True)
class SideMessage:
    """One message beside the results."""

    topic: str
    payload: bytes
    retain: bool = False
    qos: int = 1
    correlation: bytes | None = None  # MQTT 5 correlation data of the command this answers
    op: Literal["publish", "subscribe", "unsubscribe"] = "publish"  # or (un)subscribe `topic` as a filter
    on_message: Callable[[Incoming], None] | None = None  # subscribe: where its messages go (no per-topic budget)


class SideChannel(Hook):
    """The bounded queue of side messages; any thread sends, the edged-mqtt thread drains on each turn."""

    def __init__(self) -> None:
        self._wake: Callable[[], None] = lambda: None  # until added to a connection (bind)
        self._queue: deque[SideMessage] = deque(maxlen=SIDE_MAX)
        self._lock = threading.Lock()

    def bind(self, wake: Callable[[], None]) -> None:
        """The connection's wake-up: each message sent asks for a turn."""
        self._wake = wake

    def turn(self, session: Session) -> float | None:
        """Hand every queued message to paho; then the results of this turn go."""
        self.drain(session)
        return None

    def send(self, message: SideMessage) -> None:
        """Queue a message and wake the publisher."""
        with self._lock:
            if len(self._queue) == SIDE_MAX:
                log.warning("mqtt: %d side messages wait for the broker; dropping %s", SIDE_MAX, self._queue[0].topic)
            self._queue.append(message)
        self._wake()

    def drain(self, session: Session) -> None:
        """Hand every queued message to paho (edged-mqtt thread), within the broker's limits."""
        while True:
            with self._lock:
                if not self._queue:
                    return
                message = self._queue.popleft()
            if message.op != "publish":
                _subscription(session, message)
                continue
            props = None
            if message.correlation is not None and session.mqtt5:
                props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
                props.CorrelationData = message.correlation
            try:
                session.publish(message.topic, message.payload, qos=message.qos, retain=message.retain,
                                properties=props)  # fmt: skip
            except ValueError as exc:  # a reply topic paho will not send to (the requester's choice)
                log.warning("mqtt: cannot publish to %r: %s", message.topic, exc)


def _subscription(session: Session, message: SideMessage) -> None:
    """A temporary subscription (a rollout's model chunks) on the publisher's connection."""
    if message.op == "subscribe" and message.on_message is not None:
        session.subscribe([message.topic], lambda _ok: None, message.on_message, on="cmd", budget=False)
    elif message.op == "unsubscribe":
        session.unsubscribe([message.topic], on="cmd")
