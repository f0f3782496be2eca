"""One broker connection (one paho client) and what paho's network thread tells it.

paho runs these callbacks on its own thread; they only record what happened on the `Link` (connected,
refused, closed, the broker's limits, acknowledgements in the in-flight window) and wake the edged-mqtt
thread, which makes every call into paho and every change to the spool (publisher.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as paho

from edged.uplink.brokerlimits import BrokerLimits, describe_disconnect, describe_reason
from edged.uplink.hooks import Hook, Session
from edged.uplink.inflight import InFlight
from edged.uplink.mqttstats import MqttStats
from edged.uplink.reconnect import TAKEOVER_COUNT, TAKEOVER_WINDOW_S, Takeover

log = logging.getLogger(__name__)


def note_error(stats: MqttStats, message: str) -> None:
    """The connection's last error (status shows it); the first occurrence is a warning, repeats (a broker that
    stays away) go to debug."""
    with stats.lock:
        repeated = stats.last_error == message
        stats.last_error = message
    log.log(logging.DEBUG if repeated else logging.WARNING, "mqtt: %s", message)


@dataclass
class Listeners:
    """What the callbacks of every connection report to: one set per publisher, shared by its links."""

    wake: Callable[[], None]
    stats: MqttStats
    client_id: str
    where: str  # host:port, for the messages
    max_inflight: int  # mqtt.max_inflight, before the broker's Receive Maximum
    window: InFlight  # the result pump's in-flight window
    stopping: Callable[[], bool]
    hooks: list[Hook]
    takeover: Takeover = field(default_factory=Takeover)


@dataclass
class Link:
    """State of one broker connection, written by paho's callbacks and read by the edged-mqtt thread."""

    client: paho.Client
    ears: Listeners
    connected: bool = False
    closed: bool = False
    refused: str | None = None
    looping: bool = False  # paho's network thread was started
    thread: threading.Thread | None = None  # that thread
    since: float = 0.0
    blamed: list[int] = field(default_factory=list)  # rows it dropped over (refused, counted): reconnect at once
    blamed_for: str = ""
    limits: BrokerLimits = field(default_factory=BrokerLimits)  # what the broker's CONNACK allows
    session: Session | None = None  # while connected: what hooks publish and subscribe through

    def attach(self) -> None:
        """Route paho's callbacks here."""
        client = self.client
        client.on_connect = lambda _c, _u, _f, rc, props: self._on_connect(rc, props)
        client.on_disconnect = lambda _c, _u, _f, rc, _p: self._on_disconnect(rc)
        client.on_publish = lambda _c, _u, mid, rc, _p: self._on_publish(mid, rc)
        client.on_message = lambda _c, _u, msg: self._on_message(msg)

    def detach(self) -> None:
        """The callbacks close over the link, which holds the client: a cycle that keeps paho's socket pair
        (two descriptors per connection) open until the cyclic collector runs. paho polls with select(),
        which fails for descriptors past 1023, so a process with many connections that reconnects often
        must not let them pile up: break the cycle and the client goes (and closes them) at once."""
        client = self.client
        client.on_connect = client.on_disconnect = client.on_publish = client.on_message = None
        self.session = None  # it holds the client too

    # -- paho's network thread: record and wake, nothing else -------------------------------------------

    def _on_connect(self, reason: Any, props: Any) -> None:
        ears = self.ears
        if getattr(reason, "is_failure", False):
            self.refused = describe_reason(reason, ears.client_id)
            ears.wake()
            return
        self.limits = BrokerLimits.from_properties(props)
        # paho's own window, before anything is published on this connection: at most Receive Maximum QoS 1
        # messages unacknowledged (results, availability, discovery alike). paho's setter refuses an open
        # connection (its doubt is about switching between 0, "unlimited", and a limit; this stays above 0).
        self.client._max_inflight_messages = self.limits.inflight(ears.max_inflight)  # noqa: SLF001
        self.connected = True
        with ears.stats.lock:
            ears.stats.connected = True
            ears.stats.connects += 1
            ears.stats.last_error = None
            ears.stats.connected_mono = time.monotonic()
        ears.wake()

    def _on_disconnect(self, reason: Any) -> None:
        ears = self.ears
        was = self.connected
        self.connected = False
        self.closed = True
        ears.wake()
        blamed = ears.window.dropped(reason, ears.stopping()) if was else []
        if blamed:  # refused on the edged-mqtt thread when it closes the connection (the spool is not paho's)
            self.blamed = blamed
            self.blamed_for = f"the broker closed the connection over this message: {reason}"
        with ears.stats.lock:
            ears.stats.connected = False
        if was and not ears.stopping():
            why = describe_disconnect(reason, ears.client_id)
            if ears.takeover.dropped(reason, time.monotonic() - self.since):
                suspicion = (
                    f"the broker closed the connection {TAKEOVER_COUNT} times within {TAKEOVER_WINDOW_S:.0f} s, each "
                    f"soon after accepting it: another client with client id {ears.client_id!r} may be taking the "
                    "session (two devices with one device_id?)"
                )
                why += f"; {suspicion}"
                with ears.stats.lock:
                    ears.stats.suspicion = (time.monotonic(), suspicion)
            note_error(ears.stats, f"disconnected from {ears.where}: {why}")

    def _on_message(self, msg: paho.MQTTMessage) -> None:
        """Nothing is subscribed on the results' connection (listener.py): a message here is counted, not read."""
        del msg
        with self.ears.stats.lock:
            self.ears.stats.inbound.unrouted += 1

    def _on_publish(self, mid: int, reason: Any) -> None:
        if self.ears.window.acked(mid, reason):
            self.ears.wake()
