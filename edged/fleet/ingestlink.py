"""The ingest's MQTT side: one paho client with a persistent session, the subscriptions (shared among the
ingests of one `--group`), every message put on the writer's bounded queue, and the PUBACKs sent only once
the writer has committed (fleet/ingest.py)."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from edged.core.errors import IngestError
from edged.core.secrets import read_secret
from edged.fleet.ingestoptions import IngestCounters, IngestOptions
from edged.fleet.ingestparse import wildcard_levels
from edged.uplink.mqttclient import BrokerAccess, make_client

log = logging.getLogger(__name__)

REQUIRED_FILTERS = 4  # results, events, stats, gaps: a broker that refuses one of them gets no ingest at all
DISCONNECT_WAIT_S = 5.0  # at a stop, the queued PUBACKs and the DISCONNECT are written within this


@dataclass
class Received:
    """One message as it came, for the writer thread."""

    generation: int  # the connection it came on: a PUBACK only goes back on that one
    mid: int
    qos: int
    topic: str
    payload: bytes


class IngestLink:
    """The broker connection of one ingest process."""

    def __init__(  # noqa: PLR0917  (the parts of the ingest it reports to)
        self,
        opts: IngestOptions,
        inbox: queue.Queue[Received | None],
        counters: IngestCounters,
        lock: threading.Lock,
        stopping: threading.Event,
        note_error: Callable[[str], None],
    ) -> None:
        self.opts = opts
        self._inbox = inbox
        self._counters = counters
        self._lock = lock  # guards `counters` and the connection's generation
        self._stopping = stopping
        self._note_error = note_error
        self._generation = 0
        self.connected = threading.Event()  # connected and subscribed: nothing published is missed from now on
        self._closed = threading.Event()  # paho closed the connection (after writing what was queued)
        self.answers = opts.replay_topic.replace("{device_id}", "+") + "/answer" if opts.replay_topic else ""
        # the filters past REQUIRED_FILTERS, in the order subscribed: (filter, what is lost when refused)
        self._optional = [(opts.clock_topic, "times a device stamped while its clock was not synchronized stay as "
                           "stamped; let the ingest read it (docs/security.md)")]  # fmt: skip
        if self.answers:
            self._optional.append((self.answers, "replay answers are not read: missing seqs are asked for again "
                                   "and again; let the ingest read them (docs/security.md)"))  # fmt: skip
        self.client = self._new_client()

    def _new_client(self) -> paho.Client:
        opts = self.opts
        filters = {"--results-topic": (opts.results_topic, 2), "--events-topic": (opts.events_topic, 2),
                   "--gaps-topic": (opts.gaps_topic, 2), "--stats-topic": (opts.stats_topic, 1),
                   "--clock-topic": (opts.clock_topic, 1)}  # fmt: skip
        for name, (topic_filter, levels) in filters.items():
            if wildcard_levels(topic_filter) < levels:
                what = "the device and the pipeline" if levels == 2 else "the device"
                raise IngestError(f"{name} {topic_filter}: name {what} with + levels (identity comes from the "
                                  "topic the broker's ACLs guard, see docs/security.md)")  # fmt: skip
        mqtt5 = opts.protocol == "5"
        if not mqtt5 and opts.group:
            raise IngestError(
                f"shared subscriptions (--group {opts.group}) need MQTT 5; with --protocol 3.1.1 give --group '' "
                "(one ingest per broker)"
            )
        password = read_secret(opts.password_file, "MQTT password file") if opts.password_file else None
        access = BrokerAccess(opts.username, password, bool(opts.ca_file or opts.cert_file), opts.ca_file,
                              opts.cert_file, opts.key_file, opts.insecure)  # fmt: skip
        client = make_client(
            opts.client_id,
            access,
            protocol=opts.protocol,
            clean_session=None if mqtt5 else False,  # 3.1.1: the broker keeps the session while we are away
            manual_ack=True,
        )
        client.reconnect_delay_set(1, 30)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_subscribe = self._on_subscribe
        return client

    def _connect_properties(self) -> Properties:
        props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        props.SessionExpiryInterval = self.opts.session_expiry_s
        props.ReceiveMaximum = self.opts.receive_max
        return props

    def _on_connect(self, client: paho.Client, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        if getattr(reason, "is_failure", False):
            self._note_error(f"the broker refused the ingest: {reason}")
            return
        with self._lock:
            self._generation += 1
            self._counters.connects += 1
        shared = f"$share/{self.opts.group}/" if self.opts.group else ""
        qos: Any = SubscribeOptions(qos=1) if self.opts.protocol == "5" else 1  # paho: options for 5, a number for 3
        results = (shared + self.opts.results_topic, qos)
        events = (shared + self.opts.events_topic, qos)
        # retained stats are not sent to shared subscriptions: every ingest reads them (upserts are idempotent)
        stats = (self.opts.stats_topic, qos)
        gaps = (shared + self.opts.gaps_topic, qos)
        clock = (self.opts.clock_topic, qos)  # retained, like the stats: every ingest reads them (idempotent)
        wanted = [results, events, stats, gaps, clock]  # the first REQUIRED_FILTERS are needed, the rest optional
        if self.answers:  # every ingest reads every answer (not shared): each takes those to its own requests
            wanted.append((self.answers, SubscribeOptions(qos=0) if self.opts.protocol == "5" else 0))
        client.subscribe(wanted)
        log.info("ingest: connected to %s:%d as %s", self.opts.host, self.opts.port, self.opts.client_id)

    def _on_subscribe(self, _c: paho.Client, _u: Any, _mid: int, reasons: list[Any], _p: Any) -> None:
        failed = [i for i, r in enumerate(reasons) if getattr(r, "is_failure", False)]
        for i in (i for i in failed if i >= REQUIRED_FILTERS):  # the ingest does its job without them: it says so
            log.warning("ingest: the broker refused %s (%s): %s", self._optional[i - REQUIRED_FILTERS][0], reasons[i],
                        self._optional[i - REQUIRED_FILTERS][1])  # fmt: skip
        refused = [str(reasons[i]) for i in failed if i < REQUIRED_FILTERS]
        if refused:
            self._note_error(f"the broker refused the subscriptions: {', '.join(refused)}")
            return
        self.connected.set()  # subscribed: from now on nothing published is missed

    def _on_disconnect(self, _c: paho.Client, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        self.connected.clear()
        self._closed.set()
        if not self._stopping.is_set():
            self._note_error(f"disconnected from {self.opts.host}:{self.opts.port}: {reason}")

    def _on_message(self, _c: paho.Client, _u: Any, msg: paho.MQTTMessage) -> None:
        try:
            topic = msg.topic
        except UnicodeDecodeError:  # not one of our topics; acknowledged so it does not hold the window
            with self._lock:
                self._counters.malformed += 1
            log.warning("ingest: a message on a topic that is not UTF-8 was dropped")
            self.client.ack(msg.mid, msg.qos)
            return
        # blocks paho's thread when the writer is behind: the broker's Receive Maximum bounds what waits
        self._inbox.put(Received(self._generation, msg.mid, msg.qos, topic, bytes(msg.payload)))

    def connect(self, timeout: float) -> None:
        """Connect (resuming the session the broker kept) and wait until subscribed; raises IngestError."""
        opts = self.opts
        try:
            if opts.protocol == "5":
                self.client.connect(
                    opts.host,
                    opts.port,
                    clean_start=False,  # resume the session: what arrived while we were away is delivered now
                    properties=self._connect_properties(),
                )
            else:
                self.client.connect(opts.host, opts.port)
        except (OSError, ValueError) as exc:
            raise IngestError(f"cannot connect to {opts.host}:{opts.port}: {exc}") from exc
        self.client.loop_start()
        if not self.connected.wait(timeout):
            raise IngestError(f"no answer from {opts.host}:{opts.port} within {timeout:.0f} s")

    def ask(self, topic: str, payload: bytes) -> None:
        """Publish a replay request (the replayer's thread; paho's publish is thread-safe)."""
        self.client.publish(topic, payload, qos=1)

    def ack(self, items: Sequence[Received]) -> None:
        """PUBACK what the writer committed, on the connection it came on."""
        with self._lock:
            generation = self._generation
        for item in items:
            if item.qos and item.generation == generation:  # an older connection's mid means nothing now
                self.client.ack(item.mid, item.qos)  # disconnected meanwhile: an error code, a redelivery

    def close(self) -> None:
        """Disconnect, after the PUBACKs already queued (the session stays on the broker)."""
        # the PUBACKs of the last batch are queued in paho before the DISCONNECT: wait until it went (paho writes
        # in order, then calls on_disconnect), or stopping paho's loop first drops them and the broker sends the
        # whole batch again to the next ingest of this session
        self._closed.clear()
        if self.client.disconnect() == paho.MQTT_ERR_SUCCESS:
            self._closed.wait(DISCONNECT_WAIT_S)
        self.client.loop_stop()
