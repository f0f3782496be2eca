"""The publisher: drains the spool to an MQTT broker, oldest first; rows leave the spool on PUBACK only.

Two threads per connection, the way paho is made to be used: paho's own network thread (`loop_start`)
does the socket I/O and runs the callbacks; the `edged-mqtt` thread makes every call into paho
(connect, publish, disconnect) and nothing else does. The state both touch (messages in flight,
refusals) is guarded by one lock that is never held while calling paho. Reading PUBACKs in parallel
with publishing is what lets a backlog drain at close to paho's own speed. Each connection uses a
fresh paho client, so paho's in-memory queue never acts as a buffer: after a reconnect everything not
yet acknowledged is sent again from the spool (same `seq`; subscribers drop duplicates).
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edged.backoff import Backoff
from edged.config import MqttConfig
from edged.secrets import check_private, read_credential, read_secret
from edged.spool import Row, Spool
from edged.stats import MqttStats

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10.0
# results handed to paho at a time (all still in the spool until acknowledged): with the default window of
# 32, paho holds 16 windows' worth queued, so its network thread keeps the broker busy on its own; draining a
# backlog with 128 at a time ran at 0.6x a bare paho loop, with 512 at 0.85x (benchmarks/store_forward.py)
HANDOFF_RESULTS = 512
# MQTT 5 DISCONNECT reasons that a message can cause (malformed, protocol error, implementation specific,
# not authorized, topic name invalid, packet too large, quota exceeded, payload format invalid)
MESSAGE_FAULTS = {0x81, 0x82, 0x83, 0x87, 0x90, 0x95, 0x97, 0x99}
BLAME_WINDOW_S = 2.0  # MQTT 3.1.1 has no reason: a drop this soon after the lone message blames it
LOOP_TIMEOUT_S = 0.05
StatsSource = Callable[[], dict[str, Any]]


def topic_for(template: str, device_id: str, pipeline: str = "") -> str:
    """Fill a topic template's `{device_id}` and `{pipeline}`."""
    return template.replace("{device_id}", device_id).replace("{pipeline}", pipeline)


@dataclass
class _Conn:
    """State of one broker connection (one paho client)."""

    client: paho.Client
    connected: bool = False
    closed: bool = False
    refused: str | None = None
    looping: bool = False  # paho's network thread was started


class _RateLimit:
    """Token bucket: at most `rate` messages per second (0 = unlimited), bursts of one second's worth."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.tokens = max(1.0, rate)
        self.stamp = time.monotonic()

    def allow(self) -> int:
        """How many messages may go now."""
        if not self.rate:
            return 1 << 30
        now = time.monotonic()
        self.tokens = min(max(1.0, self.rate), self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        return int(self.tokens)

    def take(self, n: int) -> None:
        """Spend `n` messages."""
        if self.rate:
            self.tokens -= n


class PackedProperties(Properties):
    """MQTT 5 PUBLISH properties (content type, message expiry) packed once, not for every message.

    paho packs a message's properties each time it sends it; for a backlog that shares one object, that
    packing was about a tenth of the drain's time. The object must not change after it is built.
    """

    def __init__(self, *, content_type: str, expiry: int) -> None:
        super().__init__(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        self.ContentType = content_type
        if expiry:
            self.MessageExpiryInterval = expiry
        # Properties.__setattr__ accepts only MQTT property names
        object.__setattr__(self, "_packed", super().pack())  # type: ignore[no-untyped-call]

    def pack(self) -> bytes:
        """The packed form, as paho puts it in the PUBLISH packet."""
        packed: bytes = self.__dict__["_packed"]
        return packed


class Publisher(threading.Thread):
    """Publishes spooled rows with a bounded number in flight; reconnects with backoff and jitter."""

    def __init__(
        self, cfg: MqttConfig, device_id: str, spool: Spool, stats: MqttStats, stats_source: StatsSource | None = None
    ) -> None:
        super().__init__(name="edged-mqtt", daemon=True)
        self.cfg = cfg
        self.device_id = device_id
        self.spool = spool
        self.stats = stats
        self.stats_source = stats_source
        self.client_id = cfg.client_id or f"edged-{device_id}"
        self.availability_topic = topic_for(cfg.availability_topic, device_id)
        self.stats_topic = topic_for(cfg.stats_topic, device_id)
        self._password = self._load_password()  # at start-up: a bad secret file stops edged early
        if cfg.tls is not None and cfg.tls.key_file is not None:
            check_private(cfg.tls.key_file, "TLS key file")
        if cfg.tls is not None and cfg.tls.insecure:
            log.warning("mqtt: tls.insecure is set: the broker's host name is NOT checked")
        self._halt = threading.Event()
        self._wake = threading.Event()  # set by paho's thread: acks, connect, disconnect
        self._lock = threading.Lock()  # guards what both threads touch; never held while calling paho
        self._drain_deadline: float | None = None
        self._inflight: dict[int, list[int]] = {}  # paho mid -> spool row ids
        self._early: dict[int, Any] = {}  # acks that arrived before their message was registered
        self._cursor = 0
        self._seen_commits = -1
        self._failed_rows = False
        self._retry_at = 0.0  # refused rows are sent again from then on
        self._next_stats = 0.0
        self._props_cache: dict[int, Properties] = {}
        self._acked_ids: list[int] = []  # acknowledged by the broker, not yet handed to the spool
        # after a connection dropped with messages in flight, send one at a time until one is
        # acknowledged, so a message that makes the broker hang up every time can be found and set aside
        self._careful = False
        self._sent_at = 0.0
        self._rate = _RateLimit(cfg.max_rate)
        self._backoff = Backoff(cfg.reconnect_min_s, cfg.reconnect_max_s)
        self._refused_backoff = Backoff(cfg.reconnect_min_s, cfg.reconnect_max_s)
        with stats.lock:
            stats.broker = f"{cfg.host}:{cfg.port}"

    def _load_password(self) -> str | None:
        if self.cfg.password_file is not None:
            return read_secret(self.cfg.password_file, "MQTT password file")
        if self.cfg.password_credential is not None:
            return read_credential(self.cfg.password_credential, "MQTT password")
        return None

    def request_stop(self, grace_s: float) -> None:
        """Stop after publishing what can go within `grace_s` seconds, then say `offline`."""
        self._drain_deadline = time.monotonic() + grace_s
        self._halt.set()
        self._wake.set()

    # -- the thread ------------------------------------------------------------------------------------

    def run(self) -> None:
        """Connect, publish, reconnect; until asked to stop."""
        failures = 0
        while not self._halt.is_set():
            conn = self._connect()
            if conn is None or not conn.connected:
                failures += 1
                if conn is not None:
                    self._close(conn, offline=False)
                self._halt.wait(self._backoff.next_delay())
                continue
            if failures:
                log.info("mqtt: connected to %s:%d after %d failed attempts", self.cfg.host, self.cfg.port, failures)
            failures = 0
            self._backoff.reset()
            self._serve(conn)
            self._close(conn, offline=self._halt.is_set())

    def _new_client(self) -> paho.Client:
        protocol = paho.MQTTv5 if self.cfg.protocol == "5" else paho.MQTTv311
        client = paho.Client(
            callback_api_version=CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            protocol=protocol,
            reconnect_on_failure=False,
        )
        client.connect_timeout = CONNECT_TIMEOUT_S
        client.max_inflight_messages_set(self.cfg.max_inflight)
        client.will_set(self.availability_topic, "offline", qos=1, retain=True)
        if self.cfg.username:
            client.username_pw_set(self.cfg.username, self._password)
        tls = self.cfg.tls
        if tls is not None:
            client.tls_set(
                ca_certs=str(tls.ca_file) if tls.ca_file else None,
                certfile=str(tls.cert_file) if tls.cert_file else None,
                keyfile=str(tls.key_file) if tls.key_file else None,
                cert_reqs=ssl.CERT_REQUIRED,
            )
            client.tls_insecure_set(tls.insecure)
        return client

    def _connect(self) -> _Conn | None:
        client = self._new_client()
        conn = _Conn(client)
        client.on_connect = lambda _c, _u, _f, rc, _p: self._on_connect(conn, rc)
        client.on_disconnect = lambda _c, _u, _f, rc, _p: self._on_disconnect(conn, rc)
        client.on_publish = lambda _c, _u, mid, rc, _p: self._on_publish(mid, rc)
        try:
            client.connect(self.cfg.host, self.cfg.port, keepalive=self.cfg.keepalive_s)
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError: no plaintext fallback, ever
            self._note_error(f"cannot connect to {self.cfg.host}:{self.cfg.port}: {exc}")
            return None
        client.loop_start()
        conn.looping = True
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while not conn.connected and not conn.closed and time.monotonic() < deadline and not self._halt.is_set():
            self._wake.wait(LOOP_TIMEOUT_S)
            self._wake.clear()
        if conn.refused:
            self._note_error(f"broker {self.cfg.host}:{self.cfg.port} refused the connection: {conn.refused}")
        elif not conn.connected:
            self._note_error(f"no CONNACK from {self.cfg.host}:{self.cfg.port} within {CONNECT_TIMEOUT_S:.0f} s")
        return conn

    def _serve(self, conn: _Conn) -> None:
        """Publish while connected; return on disconnect or once drained after a stop request."""
        with self._lock:
            self._inflight.clear()
        self._cursor = 0  # everything unacknowledged goes again
        self._seen_commits = -1
        self._next_stats = 0.0
        conn.client.publish(self.availability_topic, "online", qos=1, retain=True)
        while conn.connected:
            if self._halt.is_set() and self._drained():
                return
            self._flush_acks()
            self._pump(conn.client)
            self._maybe_stats(conn.client)
            self._wake.wait(LOOP_TIMEOUT_S)  # an ack (room in the window), a disconnect, or new rows soon
            self._wake.clear()

    def _drained(self) -> bool:
        deadline = self._drain_deadline or 0.0
        if time.monotonic() >= deadline:
            left = self.spool.depth
            if left:
                log.warning("mqtt: stop grace period over; %d results stay in the spool for next time", left)
            return True
        self._flush_acks()
        with self._lock:
            idle = not self._inflight
        return idle and self.spool.depth == 0

    def _pump(self, client: paho.Client) -> None:
        with self._lock:
            careful = self._careful
            # paho sends at most max_inflight unacknowledged; the rest of a burst waits in its queue, and its
            # network thread sends the next one on each PUBACK without waiting for this thread (whose turns
            # at the GIL would slow it down: few, large bursts are cheaper than many small ones). With
            # batching the bound counts results: big messages need no long queue, and each one costs memory.
            window = 1 if careful else max(self.cfg.max_inflight + 1, HANDOFF_RESULTS // self.cfg.batch)
            room = min(window - len(self._inflight), self._rate.allow())
            if room <= 0:
                return
            retry = self._failed_rows and not self._inflight and time.monotonic() >= self._retry_at
            if retry:
                self._failed_rows = False  # rows the broker refused: send them again from the oldest
        if retry:
            self._cursor = 0
            self._seen_commits = -1
        commits = self.spool.wait_for_commit(self._seen_commits, 0)
        if commits == self._seen_commits:
            return  # nothing new since the last empty fetch
        rows = self.spool.fetch(self._cursor, room if careful else room * self.cfg.batch)
        if not rows:
            self._seen_commits = commits
            return
        sent: list[tuple[int, list[int]]] = []
        try:
            self._publish_rows(client, self._groups(rows, careful), sent)
        finally:
            self._register(sent)

    def _publish_rows(self, client: paho.Client, groups: list[list[Row]], sent: list[tuple[int, list[int]]]) -> None:
        """Hand the groups to paho, one message each, recording (mid, row ids) in `sent`."""
        qos, ttl_offset, publish = self.cfg.qos, self.spool.ttl_offset(), client.publish
        for group in groups:
            first = group[0]
            props = self._props(first.clock + ttl_offset)  # the oldest row of a group expires first
            info = publish(first.topic, self._payload(group), qos=qos, properties=props)
            if info.rc != paho.MQTT_ERR_SUCCESS:
                log.debug("mqtt: publish returned %s; will resend after reconnect", info.rc)
                return
            self._cursor = group[-1].id
            sent.append((info.mid, [r.id for r in group]))

    def _register(self, sent: list[tuple[int, list[int]]]) -> None:
        """Note the messages just handed to paho as in flight (one lock for the whole burst)."""
        if not sent:
            return
        self._rate.take(len(sent))
        early: list[tuple[int, Any]] = []
        with self._lock:
            self._sent_at = time.monotonic()
            for mid, ids in sent:
                self._inflight[mid] = ids
            if self._early:  # acks that came in before their message was registered here
                early = [(mid, self._early.pop(mid)) for mid, _ in sent if mid in self._early]
                # what is left are acks of the availability and stats messages: dropped now, so that a
                # stale entry can never be taken for a later message that reuses its mid
                self._early.clear()
        for mid, reason in early:
            self._on_publish(mid, reason)

    def _groups(self, rows: list[Row], careful: bool) -> list[list[Row]]:
        """Consecutive rows with the same topic, up to `batch` per message."""
        if careful:
            return [[rows[0]]]
        if self.cfg.batch == 1:
            return [[row] for row in rows]
        groups: list[list[Row]] = []
        for row in rows:
            if groups and groups[-1][0].topic == row.topic and len(groups[-1]) < self.cfg.batch:
                groups[-1].append(row)
            else:
                groups.append([row])
        return groups

    def _payload(self, group: list[Row]) -> bytes:
        if self.cfg.batch == 1:
            return group[0].payload
        return b"[" + b",".join(r.payload for r in group) + b"]"

    def _props(self, ttl: float) -> Properties | None:
        """MQTT 5: content type and expiry (`ttl`: seconds the message has left to live). Built and packed
        once per distinct expiry (to the minute): paho's Properties are dear to build and to pack, and the
        payload already carries pipeline and seq."""
        if self.cfg.protocol != "5":
            return None
        expiry = 0
        if self.cfg.message_expiry:
            # the message is worth no more than its row: it expires when the spool's TTL would drop it
            # (rounded down to the minute, so one Properties object serves a whole backlog)
            remaining = max(0, int(ttl))
            expiry = max(1, remaining - remaining % 60) if remaining >= 60 else max(1, remaining)
        props = self._props_cache.get(expiry)
        if props is None:
            props = PackedProperties(content_type="application/json", expiry=expiry)
            self._props_cache = {expiry: props}  # one entry: the expiry only counts down
        return props

    def _maybe_stats(self, client: paho.Client) -> None:
        if not self.cfg.stats_interval_s or self.stats_source is None or time.monotonic() < self._next_stats:
            return
        self._next_stats = time.monotonic() + self.cfg.stats_interval_s
        body = json.dumps({"v": 1, "device": self.device_id, "ts": round(time.time(), 3), **self.stats_source()})
        client.publish(self.stats_topic, body, qos=0, retain=self.cfg.stats_retain)

    # -- paho callbacks (run on this thread, inside client.loop/publish) -------------------------------

    def _on_connect(self, conn: _Conn, reason: Any) -> None:
        if getattr(reason, "is_failure", False):
            conn.refused = str(reason)
            return
        conn.connected = True
        with self.stats.lock:
            self.stats.connected = True
            self.stats.connects += 1
            self.stats.last_error = None
        self._wake.set()

    def _on_disconnect(self, conn: _Conn, reason: Any) -> None:
        was = conn.connected
        conn.connected = False
        conn.closed = True
        self._wake.set()
        blamed: list[int] = []
        with self._lock:
            if was and self._inflight and not self._halt.is_set():
                if self._careful and self._blames(reason):
                    blamed = [i for ids in self._inflight.values() for i in ids]
                self._careful = True
        if blamed:
            self._refuse_rows(blamed, f"the broker closed the connection over this message: {reason}")
        with self.stats.lock:
            self.stats.connected = False
        if was and not self._halt.is_set():
            self._note_error(f"disconnected from {self.cfg.host}:{self.cfg.port}: {reason}")

    def _blames(self, reason: Any) -> bool:
        """Whether a dropped connection is the fault of the one message in flight (lock held)."""
        value = getattr(reason, "value", None)
        if self.cfg.protocol == "5" and value is not None:
            return int(value) in MESSAGE_FAULTS
        return time.monotonic() - self._sent_at < BLAME_WINDOW_S

    def _refuse_rows(self, row_ids: list[int], why: str) -> None:
        for row_id in row_ids:
            self.spool.refuse(row_id, why)
        with self.stats.lock:
            self.stats.failed += len(row_ids)
            self.stats.last_error = why
        log.warning("mqtt: %s (%d result(s); set aside as dead letters if it keeps happening)", why, len(row_ids))

    def _on_publish(self, mid: int, reason: Any) -> None:
        failed = bool(getattr(reason, "is_failure", False))
        with self._lock:
            row_ids = self._inflight.pop(mid, None)
            if row_ids is None:
                self._early[mid] = reason
                return
            if failed:
                if not self._failed_rows:
                    self._retry_at = time.monotonic() + self._refused_backoff.next_delay()
                self._failed_rows = True
            else:
                self._careful = False
                self._refused_backoff.reset()
                # handed to the spool (and counted) by the edged-mqtt thread in batches: the paho thread
                # only does the network work
                self._acked_ids.extend(row_ids)
        if failed or len(self._inflight) < self.cfg.max_inflight:
            self._wake.set()  # room for another burst (not on every ack: fewer thread switches)
        if failed:
            for row_id in row_ids:
                self.spool.refuse(row_id, str(reason))
            with self.stats.lock:
                self.stats.failed += len(row_ids)
                self.stats.last_error = f"broker refused a message: {reason}"
            log.warning("mqtt: broker refused %d result(s) (%s); they stay in the spool", len(row_ids), reason)
            return

    def _flush_acks(self) -> None:
        """Hand the acknowledged rows to the spool (deleted in its next commit) and count them."""
        with self._lock:
            acked, self._acked_ids = self._acked_ids, []
        if acked:
            self.spool.ack(acked)
            self.stats.count_published(len(acked))

    # -- helpers ---------------------------------------------------------------------------------------

    def _close(self, conn: _Conn, *, offline: bool) -> None:
        client = conn.client
        if conn.connected and offline:
            info = client.publish(self.availability_topic, "offline", qos=1, retain=True)
            deadline = time.monotonic() + 1.0
            while conn.connected and not info.is_published() and time.monotonic() < deadline:
                self._wake.wait(LOOP_TIMEOUT_S)
        client.disconnect()  # also ends a half-open attempt (no CONNACK)
        if conn.looping:
            client.loop_stop()  # joins paho's network thread
        sock = client.socket()
        if sock is not None:
            sock.close()
        with self.stats.lock:
            self.stats.connected = False
        self._flush_acks()  # acks that came in before the connection closed still count
        with self._lock:
            self._inflight.clear()
            self._early.clear()

    def _note_error(self, message: str) -> None:
        with self.stats.lock:
            repeated = self.stats.last_error == message
            self.stats.last_error = message
        # the first occurrence is a warning; repeats (a broker that stays away) go to debug
        log.log(logging.DEBUG if repeated else logging.WARNING, "mqtt: %s", message)
