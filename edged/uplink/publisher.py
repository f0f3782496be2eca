"""The publisher: sends spooled results to an MQTT broker, oldest first; rows leave the spool on PUBACK only.

Two threads per connection, the way paho is made to be used: paho's own network thread (`loop_start`)
does the socket I/O and runs the callbacks (link.py), which only record events on the connection's
`Link` and in the in-flight window (`inflight.InFlight`) and wake the `edged-mqtt` thread; that thread
makes every call into paho (connect, publish, disconnect) and hands acknowledgements to the spool. It
sleeps until something happens: a new result (the spool wakes it), an ack, a disconnect, or a timer it
set itself (a retry, the stats message): an idle daemon does not poll.

A result is published as soon as it leaves the model, from memory, while its commit is still due (see
spool.py): capture to broker takes milliseconds. Each connection uses a fresh paho client, so paho's
in-memory queue never acts as a buffer: after a reconnect everything not yet acknowledged is sent again
from the spool (same `seq`; subscribers drop duplicates).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Literal

import paho.mqtt.client as paho

from edged.core.osthread import name_os_thread
from edged.core.secrets import check_private
from edged.core.threads import DeathHook, Supervised
from edged.store.outlet import Outlet
from edged.uplink.hooks import Hook, Session
from edged.uplink.link import Link, Listeners, note_error
from edged.uplink.listener import Listener
from edged.uplink.mqttclient import (
    CONNECT_TIMEOUT_S,
    BrokerAccess,
    PackedProperties,
    connect_properties,
    load_password,
    new_client,
    topic_for,
)
from edged.uplink.mqttstats import MqttStats
from edged.uplink.pump import Correct, ResultPump
from edged.uplink.reconnect import Reconnect, next_protocol
from edged.uplink.settings import MqttConfig

log = logging.getLogger(__name__)

__all__ = ["PackedProperties", "Publisher", "topic_for"]

StatsSource = Callable[[], dict[str, Any]]


def stop_network_thread(client: paho.Client, thread: threading.Thread | None, timeout: float = 10.0) -> None:
    """`loop_stop()`, and join paho's thread. paho 2.x races here: when its thread ends by itself (the
    broker closed the connection) it clears `client._thread` between loop_stop's check and its join, and
    loop_stop raises AttributeError; that killed the edged-mqtt thread once in benchmarks/fleet.py."""
    try:
        client.loop_stop()
    except AttributeError:
        log.debug("mqtt: paho's network thread ended while being stopped")
    if thread is not None and thread is not threading.current_thread():
        thread.join(timeout)


class Publisher(Supervised):
    """Publishes spooled rows with a bounded number in flight; reconnects with backoff and jitter."""

    def __init__(
        self,
        cfg: MqttConfig,
        device_id: str,
        spool: Outlet,
        stats: MqttStats,
        *,
        on_death: DeathHook | None = None,
        correct: Correct | None = None,
    ) -> None:
        super().__init__("edged-mqtt", on_death=on_death)
        self.cfg = cfg
        self.device_id = device_id
        self.spool = spool
        self.stats = stats
        self.client_id = cfg.client_id or f"edged-{device_id}"
        self.availability_topic = topic_for(cfg.availability_topic, device_id)
        self._password = load_password(cfg)  # at start-up: a bad secret file stops edged early
        if cfg.tls is not None and cfg.tls.key_file is not None:
            check_private(cfg.tls.key_file, "TLS key file")
        if cfg.tls is not None and cfg.tls.insecure:
            log.warning("mqtt: tls.insecure is set: the broker's host name is NOT checked")
        self._halt = threading.Event()
        self._wake = threading.Event()  # set by paho's thread (acks, connect, disconnect) and the spool
        self._drain_deadline: float | None = None
        self.pump = ResultPump(cfg, spool, stats, self._wake.set, correct)  # the result path
        self._no_retain = False  # the broker refused a retained will (0x9A): connect without retain from now on
        self._will_qos = 1  # 0 once the broker refused a QoS 1 will (0x9B), or granted QoS 0 at most
        self.protocol = (
            cfg.protocol
        )  # the MQTT version spoken: 3.1.1 once a broker refused 5 or left it unanswered (reconnect.next_protocol)
        self.reconnect = Reconnect(cfg)
        self._accepted: Literal["3.1.1", "5"] | None = None  # the version this broker accepted: kept until a restart
        self._sure = False  # the last fallback to 3.1.1 followed a plain refusal of 5 (0x84, or no CONNACK at all)
        self.hooks: list[Hook] = []  # what rides on the connection (hooks.py); added before start
        self.listeners: dict[str, Listener] = {}  # connections of their own for what edged listens to (listener.py)
        self._running = False  # body() began: a listener asked for later starts at once
        self._ears = Listeners(self._wake.set, stats, self.client_id, f"{cfg.host}:{cfg.port}", cfg.max_inflight,
                               self.pump.window, self._halt.is_set, self.hooks)  # fmt: skip
        spool.on_change(self._wake.set)
        with stats.lock:
            stats.broker = f"{cfg.host}:{cfg.port}"

    def listener(self, name: str) -> Listener:
        """The listening connection `name` (cmd, replay), made (and started, once the publisher is) when first
        asked for: what edged subscribes to never rides on the results' connection."""
        with self.stats.lock:
            found = self.listeners.get(name)
            if found is None:
                access = BrokerAccess.of(self.cfg, self._password)
                found = Listener(name, self.cfg, f"{self.client_id}-{name}", access, self.stats.inbound,
                                 lambda: self.protocol)  # fmt: skip
                self.listeners[name] = found
                self.stats.listeners[name] = found.snapshot
                if self._running:
                    found.start()
        return found

    def listener_threads(self) -> list[Supervised]:
        """The listeners' threads (health watches them)."""
        with self.stats.lock:
            return [listener.thread for listener in self.listeners.values()]

    def add_hook(self, hook: Hook) -> None:
        """Something that rides on every connection (the stats message, discovery, remote control, its side
        channel): before start. Each turn runs the hooks in the order added, then the results."""
        hook.bind(self._wake.set)
        self.hooks.append(hook)

    def request_stop(self, grace_s: float) -> None:
        """Stop after publishing what can go within `grace_s` seconds, then say `offline`."""
        self._drain_deadline = time.monotonic() + grace_s
        self._halt.set()
        self._wake.set()

    # -- the thread ------------------------------------------------------------------------------------

    def body(self) -> None:
        """Connect, publish, reconnect; until asked to stop (the listeners with it)."""
        with self.stats.lock:
            self._running = True
            waiting = [listener for listener in self.listeners.values() if not listener.thread.is_alive()]
        for listener in waiting:
            if not listener.thread.ident:
                listener.start()
        try:
            self._publish_loop()
        finally:
            with self.stats.lock:
                listeners = list(self.listeners.values())
            for listener in listeners:
                listener.stop()

    def _publish_loop(self) -> None:
        failures = 0
        while not self._halt.is_set():
            speaking = self.protocol
            conn = self._connect()
            if conn is None or not conn.connected:
                failures += 1
                if conn is not None:
                    self._close(conn, offline=False)
                if self.protocol not in (speaking, self.cfg.protocol):
                    continue  # the version was the problem (refused, or no CONNACK): the other one at once
                self._halt.wait(self.reconnect.retry_delay())
                continue
            if failures:
                log.info("mqtt: connected to %s:%d after %d failed attempts", self.cfg.host, self.cfg.port, failures)
            failures = 0
            self.reconnect.connected()
            self._serve(conn)
            self._close(conn, offline=self._halt.is_set())
            if not self._halt.is_set():
                up_s = time.monotonic() - conn.since
                carried = self.pump.window.carried
                self._halt.wait(self.reconnect.after_connection(carried=carried, up_s=up_s, blamed=bool(conn.blamed)))
            # the version the broker accepted is kept for the next connects (until a restart or a config change):
            # a broker that does not speak 5 is not asked again at every reconnect (next_protocol goes back to the
            # configured version if the remembered one fails); a fallback that proved nothing is not kept
            if self._accepted is None:
                self._use_protocol(self.cfg.protocol)

    def _connect(self) -> Link | None:
        cfg = (
            self.cfg if self.protocol == self.cfg.protocol else self.cfg.model_copy(update={"protocol": self.protocol})
        )
        client = new_client(cfg, self.client_id, self.availability_topic, self._password, retain=not self._no_retain,
                            will_qos=self._will_qos)  # fmt: skip
        conn = Link(client, self._ears)
        conn.attach()
        try:
            client.connect(
                self.cfg.host,
                self.cfg.port,
                keepalive=self.cfg.keepalive_s,
                properties=connect_properties(self.protocol),
            )
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError: no plaintext fallback, ever
            note_error(self.stats, f"cannot connect to {self.cfg.host}:{self.cfg.port}: {exc}")
            return None
        client.loop_start()
        conn.looping = True
        paho_thread = getattr(client, "_thread", None)  # paho names it paho-mqtt-client-<id>; the OS does not
        if isinstance(paho_thread, threading.Thread):
            conn.thread = paho_thread
            name_os_thread(paho_thread)
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while not conn.connected and not conn.closed and not self._halt.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._wake.wait(left)
            self._wake.clear()
        self._note_failure(conn)
        if not self._halt.is_set():
            where = f"{self.cfg.host}:{self.cfg.port}"
            after = next_protocol(self.protocol, self.cfg.protocol, connected=conn.connected, refused=conn.refused,
                                  where=where, accepted=self._accepted)  # fmt: skip
            if not conn.connected and after != self.protocol:
                # 0x84 or a CONNECT left unanswered say "not this version"; a connection closed before its CONNACK
                # may be that (RabbitMQ 3.10) or a broker still starting (Mosquitto mid-restart): not remembered
                self._sure = conn.refused is not None or not conn.closed
            if conn.connected and (after == self.cfg.protocol or self._sure):
                self._accepted = after
            self._use_protocol(after)
        return conn

    def _note_failure(self, conn: Link) -> None:
        """Why an attempt did not connect, for status (and the retain setting a broker refused)."""
        if conn.refused:
            note_error(self.stats, f"broker {self.cfg.host}:{self.cfg.port} refused the connection: {conn.refused}")
            if "0x9A" in conn.refused and not self._no_retain:  # Retain not supported: the will was retained
                log.warning("mqtt: the broker keeps no retained messages; connecting again without them")
                self._no_retain = True
            if "0x9B" in conn.refused and self._will_qos:  # QoS not supported: the will was QoS 1
                log.warning("mqtt: the broker does not take QoS 1; connecting again with a QoS 0 last will")
                self._will_qos = 0
        elif not conn.connected and conn.closed:
            note_error(self.stats, f"broker {self.cfg.host}:{self.cfg.port} closed the connection before its CONNACK")
        elif not conn.connected:
            fallback = " (trying MQTT 3.1.1 now)" if self.protocol == "5" else ""
            note_error(
                self.stats,
                f"no CONNACK from {self.cfg.host}:{self.cfg.port} within {CONNECT_TIMEOUT_S:.0f} s to an MQTT "
                f"{self.protocol} CONNECT{fallback}",
            )

    def _use_protocol(self, protocol: Literal["3.1.1", "5"]) -> None:
        if protocol == self.protocol:
            return
        self.protocol = protocol
        self.pump.speak(self.cfg.model_copy(update={"protocol": protocol}))

    def _serve(self, conn: Link) -> None:
        """Publish while connected; return on disconnect or once drained after a stop request."""
        conn.since = time.monotonic()
        self.pump.begin(conn.limits if not self._no_retain else replace(conn.limits, retain=False), self.protocol)
        session = conn.session = Session(conn.client, self.pump.limits, mqtt5=self.protocol == "5",
                                         listen=self.listener)  # fmt: skip
        self._will_qos = min(self._will_qos, conn.limits.max_qos)  # the next connection's will (this one's stands)
        session.publish(self.availability_topic, b"online", qos=1, retain=True)
        for hook in self.hooks:
            hook.connected(session)
        while conn.connected:
            self._wake.clear()  # before the work: a wake-up during it is not lost
            if self._halt.is_set() and self.pump.drained(self._drain_deadline or 0.0):
                return
            self.pump.flush_acks()
            timers = [t for t in (hook.turn(session) for hook in self.hooks) if t is not None]
            if conn.limits.max_qos >= self.cfg.qos:  # else nothing could be acknowledged: results stay spooled
                self.pump.pump(conn.client)
            self._wake.wait(self._sleep_s(timers))

    def _sleep_s(self, timers: list[float]) -> float | None:
        """Until the next timer of this thread (the hooks' `timers`, the pump's, a stop's drain); None: until
        woken (a result, an ack, a disconnect)."""
        now = time.monotonic()
        timers += [t for t in (self.pump.timer_s(),) if t is not None]
        if self._halt.is_set() and self._drain_deadline is not None:
            timers.append(min(self._drain_deadline - now, 0.05))  # draining before a stop: look often
        return max(0.0, min(timers)) if timers else None

    def _close(self, conn: Link, *, offline: bool) -> None:
        client = conn.client
        if conn.connected and offline:
            info = client.publish(self.availability_topic, "offline", qos=min(1, conn.limits.max_qos),
                                  retain=conn.limits.retain and not self._no_retain)  # fmt: skip
            deadline = time.monotonic() + 1.0
            while conn.connected and not info.is_published() and (left := deadline - time.monotonic()) > 0:
                self._wake.wait(min(left, 0.05))
        client.disconnect()  # also ends a half-open attempt (no CONNACK)
        if conn.looping:
            stop_network_thread(client, conn.thread)
        sock = client.socket()
        if sock is not None:
            sock.close()
        conn.detach()
        with self.stats.lock:
            self.stats.connected = False
        if conn.blamed:
            self.pump.refuse(conn.blamed, conn.blamed_for)
        self.pump.end()  # acks that came in before the connection closed still count
