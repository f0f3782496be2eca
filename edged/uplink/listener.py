"""A connection of its own that only listens: remote commands on one, replay requests on another.

On one MQTT connection the broker sends everything down one TCP stream, and paho reads it in order on one
thread: a flood on any topic the device subscribed to queues up in front of the PUBACKs of its results, and
once the flood outruns what the device can read (here about 15,000 messages a second, far less on a Pi)
delivery stops, whatever the device does with the messages it reads. So the publisher's connection subscribes
to nothing; what edged listens to comes on connections of their own (client ids `<client_id>-cmd` and
`<client_id>-replay`), each reading only its topics, each topic within its budget (inbound.py). A flood on the
replay topic then costs neither a result nor a command; a flood on a command topic costs the other commands
only once it outruns the reading. What is answered goes out on the publisher's connection (command replies,
replay answers and the results sent again), within the broker's limits as before.

Each listener is its own thread (`edged-listen-<name>`): connect with the publisher's MQTT version and access,
subscribe, and wait until the connection goes, then again after a backoff with jitter. No last will, a clean
session, nothing published.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as paho

from edged.core.backoff import Backoff
from edged.core.osthread import name_os_thread
from edged.core.threads import Restart, Supervised
from edged.uplink.hooks import Granted, Incoming
from edged.uplink.inbound import Inbound
from edged.uplink.mqttclient import BrokerAccess, connect_properties, make_client
from edged.uplink.settings import MqttConfig

log = logging.getLogger(__name__)

CONNECT_WAIT_S = 10.0


@dataclass
class _Subscription:
    filters: list[str]
    granted: Granted
    on_message: Callable[[Incoming], None]
    budget: bool


class Listener:
    """One listening connection and its subscriptions (added any time; subscribed again on every connection),
    on its own supervised thread (`thread`; restarted after a death: its state is this object's)."""

    def __init__(  # noqa: PLR0917  (the connection's parts)
        self, name: str, cfg: MqttConfig, client_id: str, access: BrokerAccess, inbound: Inbound,
        protocol: Callable[[], str],
    ) -> None:  # fmt: skip
        """`protocol()`: the MQTT version the publisher speaks now (it found what the broker accepts)."""
        self.name = f"edged-listen-{name}"
        self.thread = Supervised(self.name, target=self._run, restart=Restart())
        self.cfg = cfg
        self.client_id = client_id
        self.access = access
        self.inbound = inbound
        self.protocol = protocol
        self.connected = False
        self.connects = 0
        self.last_error: str | None = None
        self._subs: list[_Subscription] = []
        self._lock = threading.Lock()
        self._ending = threading.Event()
        self._changed = threading.Event()  # connected, disconnected, or a subscription added
        self._client: paho.Client | None = None
        self._asked: dict[int, list[_Subscription]] = {}
        self._early: dict[int, bool] = {}  # a SUBACK that beat subscribe()'s return (paho's thread is quick)

    def subscribe(
        self, filters: list[str], granted: Granted, on_message: Callable[[Incoming], None], *, budget: bool = True
    ) -> None:
        """Listen to `filters` from now on (again after every reconnect); messages go to `on_message` (paho's
        thread: queue, nothing else). A filter already listened to is not added twice."""
        with self._lock:
            known = {f for s in self._subs for f in s.filters}
            new = [f for f in filters if f not in known]
            if not new:
                return
            sub = _Subscription(new, granted, on_message, budget)
            self._subs.append(sub)
            client = self._client if self.connected else None
        self.inbound.route(new, lambda m: on_message(Incoming.of(m)), budget=budget)
        if client is not None:
            self._send_subscribe(client, [sub])

    def unsubscribe(self, filters: list[str]) -> None:
        """Stop listening to `filters`."""
        with self._lock:
            self._subs = [s for s in self._subs if not set(s.filters) & set(filters)]
            client = self._client if self.connected else None
        self.inbound.unroute(filters)
        if client is not None:
            client.unsubscribe(filters)

    def start(self) -> None:
        """Start listening."""
        self.thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Disconnect and end the thread."""
        self._ending.set()
        self._changed.set()
        self.thread.end_restarts()
        if self.thread.is_alive():
            self.thread.join(timeout)

    def snapshot(self) -> dict[str, Any]:
        """For the status JSON (`mqtt.listeners`)."""
        with self._lock:
            return {"connected": self.connected, "connects": self.connects, "last_error": self.last_error,
                    "filters": [f for s in self._subs for f in s.filters]}  # fmt: skip

    # -- the thread --------------------------------------------------------------------------------------

    def _run(self) -> None:
        backoff = Backoff(self.cfg.reconnect_min_s, self.cfg.reconnect_max_s)
        while not self._ending.is_set():
            up = self._connection()
            if self._ending.is_set():
                return
            if up:
                backoff.reset()
            self._ending.wait(backoff.next_delay())

    def _connection(self) -> bool:
        """One connection, until it goes or the listener stops; whether it was up."""
        protocol = self.protocol()
        client = make_client(self.client_id, self.access, protocol=protocol, reconnect_on_failure=False)
        client.on_connect = lambda _c, _u, _f, rc, _p: self._on_connect(rc)
        client.on_disconnect = lambda _c, _u, _f, rc, _p: self._on_disconnect(rc)
        client.on_subscribe = lambda _c, _u, mid, reasons, _p: self._on_subscribe(mid, reasons)
        client.on_message = lambda _c, _u, msg: self._on_message(msg)
        with self._lock:
            self._client = client
        try:
            client.connect(self.cfg.host, self.cfg.port, keepalive=self.cfg.keepalive_s,
                           properties=connect_properties(protocol))  # fmt: skip
        except (OSError, ValueError) as exc:
            self._note(f"cannot connect to {self.cfg.host}:{self.cfg.port}: {exc}")
            return False
        client.loop_start()
        thread = getattr(client, "_thread", None)
        if isinstance(thread, threading.Thread):
            name_os_thread(thread)
        was_up = False
        deadline = time.monotonic() + CONNECT_WAIT_S
        while not self._ending.is_set():
            self._changed.wait(max(0.1, deadline - time.monotonic()) if not was_up else None)
            self._changed.clear()
            was_up = was_up or self.connected
            if not self.connected and (was_up or time.monotonic() >= deadline):
                break
        client.on_connect = client.on_disconnect = client.on_subscribe = client.on_message = None
        client.disconnect()
        try:
            client.loop_stop()
        except AttributeError:  # paho's thread ended by itself meanwhile (publisher.py: the same race)
            log.debug("mqtt: a listener's network thread ended while being stopped")
        self._gone()
        return was_up

    def _send_subscribe(self, client: paho.Client, subs: list[_Subscription]) -> None:
        filters = [(f, 1) for s in subs for f in s.filters]
        if not filters:
            return
        _, mid = client.subscribe(filters)
        if mid is None:
            return
        with self._lock:
            early = self._early.pop(mid, None)
            if early is None:
                self._asked[mid] = subs
        if early is not None:
            for sub in subs:
                sub.granted(early)

    # -- paho's thread: record and wake ------------------------------------------------------------------

    def _on_connect(self, reason: Any) -> None:
        if getattr(reason, "is_failure", False):
            self._note(f"{self.cfg.host}:{self.cfg.port} refused the listening connection: {reason}")
            self._changed.set()
            return
        with self._lock:
            self.connected = True
            self.connects += 1
            self.last_error = None
            subs, client = list(self._subs), self._client
        if client is not None:
            self._send_subscribe(client, subs)
        self._changed.set()

    def _on_subscribe(self, mid: int, reasons: list[Any]) -> None:
        ok = not any(getattr(r, "is_failure", False) for r in reasons)
        with self._lock:
            subs = self._asked.pop(mid, None)
            if subs is None:
                self._early[mid] = ok
                subs = []
        if not ok:
            log.error("mqtt: the broker refused a subscription of %s: %s", self.name, reasons)
        for sub in subs:
            sub.granted(ok)

    def _on_message(self, msg: paho.MQTTMessage) -> None:
        try:  # no message, however made, may end paho's thread
            self.inbound.deliver(msg)
        except Exception:
            log.exception("mqtt: a handler failed on an incoming message; the message is dropped")

    def _on_disconnect(self, reason: Any) -> None:
        if self.connected and not self._ending.is_set():
            self._note(f"the listening connection to {self.cfg.host}:{self.cfg.port} went: {reason}")
        self._gone()
        self._changed.set()

    def _gone(self) -> None:
        with self._lock:
            was, self.connected = self.connected, False
            subs = list(self._subs)
            self._asked.clear()
            self._early.clear()
        if was:
            for sub in subs:
                sub.granted(None)

    def _note(self, message: str) -> None:
        with self._lock:
            repeated = self.last_error == message
            self.last_error = message
        log.log(logging.DEBUG if repeated else logging.WARNING, "mqtt: %s", message)
