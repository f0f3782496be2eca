"""What rides on the publisher's connection besides the results: each is a `Hook` that the daemon adds, and
the publisher knows none of them by name (the stats and clock messages, Home Assistant discovery through
`Announce`, replay requests, and remote control through `SideChannel`).

On each connection the publisher hands every hook a `Session`: publish within the broker's limits (a message
larger than its Maximum Packet Size is left out with a warning; retain only where the broker keeps retained
messages), subscribe with a callback for the SUBACK's verdict. `connected` and `turn` run on the `edged-mqtt`
thread; `message` and `disconnected` run on paho's network thread and only record and wake.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import paho.mqtt.client as paho
from paho.mqtt.properties import Properties

from edged.uplink.brokerlimits import BrokerLimits, publish_size

log = logging.getLogger(__name__)

Granted = Callable[[bool | None], None]  # True: granted; False: refused; None: the connection went


class Listening(Protocol):
    """A listening connection as a session hands subscriptions to it (listener.py)."""

    def subscribe(
        self, filters: list[str], granted: Granted, on_message: Callable[[Incoming], None], *, budget: bool = True
    ) -> None: ...

    def unsubscribe(self, filters: list[str]) -> None: ...


class Session:
    """One connection as a hook sees it."""

    def __init__(
        self, client: paho.Client, limits: BrokerLimits, *, mqtt5: bool, listen: Callable[[str], Listening]
    ) -> None:
        """`listen(name)`: the listening connection `name` (listener.py); subscriptions go there."""
        self.client = client
        self.limits = limits
        self.mqtt5 = mqtt5
        self.listen = listen

    def publish(
        self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False, properties: Properties | None = None
    ) -> bool:
        """Publish when the broker accepts the size (False, with a warning, when not); retain only when the
        broker keeps retained messages; at most the QoS the broker grants (its CONNACK's Maximum QoS: a broker
        closes the connection over a publish above it)."""
        qos = min(qos, self.limits.max_qos)
        size = publish_size(topic, payload, qos, properties, mqtt5=self.mqtt5)
        if not self.limits.fits(size):
            log.warning("mqtt: not sending %s: %d bytes, the broker accepts %s at most", topic, size,
                        self.limits.max_packet)  # fmt: skip
            return False
        self.client.publish(topic, payload, qos=qos, retain=retain and self.limits.retain, properties=properties)
        return True

    def subscribe(
        self,
        filters: list[str],
        granted: Granted,
        on_message: Callable[[Incoming], None],
        *,
        on: str,
        budget: bool = True,
    ) -> None:
        """Listen to `filters` on the listening connection `on` (listener.py: never on the results'
        connection, so no flood on them can hold up a PUBACK); messages on these filters, and only those, go
        to `on_message` (paho's thread: queue, nothing else), each topic within its budget (inbound.py) unless
        `budget` is False (a download that bounds itself). `granted(True)` once the broker grants every filter,
        `granted(False)` when it refuses one, `granted(None)` when that connection goes (paho's thread:
        record, nothing else). Idempotent: a hook subscribes again on every connection of the publisher."""
        if filters:
            self.listen(on).subscribe(filters, granted, on_message, budget=budget)

    def unsubscribe(self, filters: list[str], *, on: str) -> None:
        """No more messages on these filters."""
        self.listen(on).unsubscribe(filters)


@dataclass(frozen=True)
class Incoming:
    """A message from the broker as hooks see it (edged's own type: paho's stays in the uplink)."""

    topic: str | None  # None: the topic is not UTF-8 (a broker let it through), so no topic of ours
    payload: bytes
    response_topic: str | None = None  # MQTT 5: where the sender wants an answer, when it named one
    correlation: bytes | None = None  # MQTT 5: what the sender wants echoed with the answer

    @classmethod
    def of(cls, message: paho.MQTTMessage) -> Incoming:
        """From paho's message (paho's thread)."""
        try:
            topic: str | None = message.topic
        except UnicodeDecodeError:
            topic = None
        props = getattr(message, "properties", None)
        response = getattr(props, "ResponseTopic", None) if props is not None else None
        correlation = getattr(props, "CorrelationData", None) if props is not None else None
        return cls(
            topic,
            bytes(message.payload),
            response if isinstance(response, str) else None,
            bytes(correlation) if isinstance(correlation, (bytes, bytearray)) else None,
        )


class Hook:
    """Something that rides on the connection; every method is optional (the defaults do nothing)."""

    def bind(self, wake: Callable[[], None]) -> None:
        """Added to a connection: `wake()` (any thread, cheap) asks it for a turn soon, e.g. with something to
        send."""

    def connected(self, session: Session) -> None:
        """A connection is up (edged-mqtt thread): publish what goes on every connection, subscribe."""

    def turn(self, session: Session) -> float | None:  # noqa: ARG002  (a hook may not need it)
        """Each turn of the publisher's loop (edged-mqtt thread); seconds until this hook wants the next turn,
        None when only woken (a result, an ack, a message)."""
        return None

    def message(self, message: Incoming) -> None:
        """A message on a topic this hook subscribed to, within its budget (paho's thread: queue it, nothing
        else); what `Session.subscribe` routes to by default."""


class Announce(Hook):
    """Retained messages published on every connection (Home Assistant discovery: its configs, and empty
    ones for entities that are gone)."""

    def __init__(self, messages: Callable[[], list[tuple[str, bytes]]]) -> None:
        self._messages = messages

    def connected(self, session: Session) -> None:
        """Publish them all."""
        for topic, payload in self._messages():
            session.publish(topic, payload, qos=1, retain=True)
