"""`edged ingest`: the consumer side. Results from every device land in a database exactly once.

    broker ──(MQTT 5 shared subscription, persistent session)──▶ paho's thread ──(bounded queue)──▶
    edged-ingest-db thread: batch ─▶ one transaction (duplicates ignored by key) ─▶ COMMIT ─▶ PUBACKs

Delivery from the devices is at-least-once; the primary key (device, pipeline, seq) makes the rows
exactly-once. Acknowledgements are manual (paho's `manual_ack`) and go out only after the transaction
committed, so a crash of the ingest or of the database between receipt and commit costs a redelivery
from the broker's session, never a row. Several ingest processes with one `--group` split the load
(`$share/<group>/...`): the broker hands each message to one of them.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from edged.core.backoff import Backoff
from edged.core.errors import IngestDataError, IngestError, InputError
from edged.core.safejson import loads
from edged.core.secrets import read_secret
from edged.core.threads import Supervised
from edged.fleet.ingestdb import (
    QUARANTINE_KEEP_BYTES,
    CorrectionRow,
    Database,
    GapRow,
    IngestBatch,
    QuarantineRow,
    ReplayRow,
    ResultRow,
    StatsRow,
)
from edged.fleet.ingestparse import (
    RefusedError,
    parse_clock,
    parse_gap,
    parse_results,
    parse_stats,
    topic_identity,
    wildcard_levels,
)
from edged.fleet.replayer import Replayer
from edged.uplink.mqttclient import BrokerAccess, make_client

log = logging.getLogger(__name__)

LOG_EVERY_S = 10.0
REQUIRED_FILTERS = 4  # results, events, stats, gaps: a broker that refuses one of them gets no ingest at all
DISCONNECT_WAIT_S = 5.0  # at a stop, the queued PUBACKs and the DISCONNECT are written within this


@dataclass
class IngestOptions:
    """Where to read from and how (the `edged ingest` flags)."""

    host: str = "localhost"
    port: int = 1883
    protocol: str = "5"  # "3.1.1" for a broker without MQTT 5: a persistent session, no shared subscriptions
    group: str = "edged-ingest"  # shared-subscription group; "" subscribes plainly (one ingest only)
    client_id: str = "edged-ingest"  # stable: the broker keeps this session while the ingest is away
    results_topic: str = "edged/+/+/results"
    events_topic: str = "edged/+/+/events"  # a tracking pipeline's events: rows keyed "<pipeline>/events"
    stats_topic: str = "edged/+/stats"
    gaps_topic: str = "edged/+/+/gaps"  # seq ranges a device declared uncertain after an unclean stop
    clock_topic: str = "edged/+/clock"  # corrections of times stamped while a device's clock was not synchronized
    replay_topic: str = "edged/{device_id}/replay"  # ask devices for missing seqs (replayer.py); "" never asks
    replay_after_s: float = 5.0  # a seq missing this long is asked for
    batch: int = 1000  # results per transaction at most
    flush_s: float = 0.25  # a partial batch waits at most this long for more (a database likes big ones)
    receive_max: int = 4000  # unacknowledged messages the broker may send (MQTT 5 Receive Maximum)
    session_expiry_s: int = 86_400  # how long the broker keeps the session (and queues) while we are away
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    insecure: bool = False
    username: str | None = None
    password_file: Path | None = None


@dataclass
class IngestCounters:
    """What the ingest did (logged every few seconds, returned by `Ingest.counters()`)."""

    messages: int = 0
    results: int = 0
    inserted: int = 0
    duplicates: int = 0
    malformed: int = 0  # quarantined, all reasons
    quarantined: dict[str, int] = field(default_factory=dict)  # by reason
    stats: int = 0
    db_errors: int = 0
    connects: int = 0
    last_error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Parsed:
    """What one message became: rows, stats, a gap, or a refusal (reason, detail) for the quarantine."""

    item: _Item
    device: str | None  # as its topic names it
    rows: list[ResultRow] = field(default_factory=list)
    stats: list[StatsRow] = field(default_factory=list)
    gaps: list[GapRow] = field(default_factory=list)
    corrections: list[CorrectionRow] = field(default_factory=list)
    refused: tuple[str, str] | None = None
    answer: dict[str, Any] | None = None  # a device's answer to a replay request (nothing to write)


def _batch(parsed: list[_Parsed], now: float, replays: list[ReplayRow] | None = None) -> IngestBatch:
    """The database write of some messages: their rows (one per key), stats, gaps, clock corrections and
    quarantined ones (and the replay records of this turn)."""
    rows: dict[tuple[str, str, int], ResultRow] = {}
    stats: list[StatsRow] = []
    gaps: list[GapRow] = []
    quarantine: list[QuarantineRow] = []
    for p in parsed:
        if p.refused is not None:
            payload = p.item.payload
            detail = p.refused[1][:500].replace("\x00", "\\0")  # text columns: no NUL (PostgreSQL refuses it)
            quarantine.append(QuarantineRow(now, p.item.topic, p.device, p.refused[0], detail, len(payload),
                                            payload[:QUARANTINE_KEEP_BYTES]))  # fmt: skip
            continue
        for row in p.rows:
            rows[(row.device, row.pipeline, row.seq)] = row  # the same result twice in one batch: once
        stats += p.stats
        gaps += p.gaps
    corrections = [c for p in parsed if p.refused is None for c in p.corrections]
    return IngestBatch(list(rows.values()), stats, gaps, quarantine, replays or [], corrections)


@dataclass
class _Item:
    generation: int  # the connection it came on: a PUBACK only goes back on that one
    mid: int
    qos: int
    topic: str
    payload: bytes


class Ingest:
    """One ingest process: a paho client and the database writer thread."""

    def __init__(self, opts: IngestOptions, db: Database, *, on_death: Callable[[], object] | None = None) -> None:
        """`on_death()`: the writer died (`edged ingest` then stops, exit 1)."""
        self.opts = opts
        self._on_writer_death = on_death
        self.db = db
        self.counters = IngestCounters()
        self._lock = threading.Lock()
        self._queue: queue.Queue[_Item | None] = queue.Queue(maxsize=opts.receive_max + 16)
        self._generation = 0
        self._connected = threading.Event()
        self._closed = threading.Event()  # paho closed the connection (after writing what was queued)
        self._stopping = threading.Event()
        self._password = read_secret(opts.password_file, "MQTT password file") if opts.password_file else None
        self.client = self._new_client()
        # not restarted in-process: a death (a bug; every message's failure is caught in _parse) stops the ingest
        # with exit 1, so that its supervisor restarts it and the broker sends again what was not acknowledged
        self.writer = Supervised("edged-ingest-db", target=self._write_loop, on_death=self._on_death)
        self.replayer = (
            Replayer(opts.client_id, opts.replay_topic, self._ask, opts.replay_after_s) if opts.replay_topic else None
        )
        self._answers = opts.replay_topic.replace("{device_id}", "+") + "/answer" if opts.replay_topic else ""
        # the filters past REQUIRED_FILTERS, in the order subscribed: (filter, what is lost when refused)
        self._optional = [(opts.clock_topic, "times a device stamped while its clock was not synchronized stay as "
                           "stamped; let the ingest read it (docs/security.md)")]  # fmt: skip
        if self._answers:
            self._optional.append((self._answers, "replay answers are not read: missing seqs are asked for again "
                                   "and again; let the ingest read them (docs/security.md)"))  # fmt: skip

    # -- the MQTT side ----------------------------------------------------------------------------------

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
        access = BrokerAccess(opts.username, self._password, bool(opts.ca_file or opts.cert_file), opts.ca_file,
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
            self.counters.connects += 1
        shared = f"$share/{self.opts.group}/" if self.opts.group else ""
        qos: Any = SubscribeOptions(qos=1) if self.opts.protocol == "5" else 1  # paho: options for 5, a number for 3
        results = (shared + self.opts.results_topic, qos)
        events = (shared + self.opts.events_topic, qos)
        # retained stats are not sent to shared subscriptions: every ingest reads them (upserts are idempotent)
        stats = (self.opts.stats_topic, qos)
        gaps = (shared + self.opts.gaps_topic, qos)
        clock = (self.opts.clock_topic, qos)  # retained, like the stats: every ingest reads them (idempotent)
        wanted = [results, events, stats, gaps, clock]  # the first REQUIRED_FILTERS are needed, the rest optional
        if self._answers:  # every ingest reads every answer (not shared): each takes those to its own requests
            wanted.append((self._answers, SubscribeOptions(qos=0) if self.opts.protocol == "5" else 0))
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
        self._connected.set()  # subscribed: from now on nothing published is missed

    def _on_disconnect(self, _c: paho.Client, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        self._connected.clear()
        self._closed.set()
        if not self._stopping.is_set():
            self._note_error(f"disconnected from {self.opts.host}:{self.opts.port}: {reason}")

    def _on_message(self, _c: paho.Client, _u: Any, msg: paho.MQTTMessage) -> None:
        try:
            topic = msg.topic
        except UnicodeDecodeError:  # not one of our topics; acknowledged so it does not hold the window
            with self._lock:
                self.counters.malformed += 1
            log.warning("ingest: a message on a topic that is not UTF-8 was dropped")
            self.client.ack(msg.mid, msg.qos)
            return
        # blocks paho's thread when the writer is behind: the broker's Receive Maximum bounds what waits
        self._queue.put(_Item(self._generation, msg.mid, msg.qos, topic, bytes(msg.payload)))

    # -- lifecycle --------------------------------------------------------------------------------------

    def _ask(self, topic: str, payload: bytes) -> None:
        """Publish a replay request (the replayer's thread; paho's publish is thread-safe)."""
        self.client.publish(topic, payload, qos=1)

    def start(self, timeout: float = 30.0) -> None:
        """Connect (resuming the session the broker kept) and start the writer."""
        if self.replayer is not None:
            try:
                self.replayer.seed(self.db.streams(), self.db.gaps())  # what this database already misses
            except IngestError as exc:
                log.warning("ingest: cannot read the gaps already in the database: %s", exc)
            self.replayer.start()
        self.writer.start()
        try:
            if self.opts.protocol == "5":
                self.client.connect(
                    self.opts.host,
                    self.opts.port,
                    clean_start=False,  # resume the session: what arrived while we were away is delivered now
                    properties=self._connect_properties(),
                )
            else:
                self.client.connect(self.opts.host, self.opts.port)
        except (OSError, ValueError) as exc:
            self.stop()
            raise IngestError(f"cannot connect to {self.opts.host}:{self.opts.port}: {exc}") from exc
        self.client.loop_start()
        if not self._connected.wait(timeout):
            self.stop()
            raise IngestError(f"no answer from {self.opts.host}:{self.opts.port} within {timeout:.0f} s")

    def stop(self, timeout: float = 20.0) -> None:
        """Write and acknowledge what arrived, then disconnect (the session stays on the broker)."""
        self._stopping.set()
        if self.replayer is not None:
            self.replayer.stop()
        if self.writer.is_alive():
            self._queue.put(None)
            self.writer.join(timeout)
        # the PUBACKs of the last batch are queued in paho before the DISCONNECT: wait until it went (paho writes
        # in order, then calls on_disconnect), or stopping paho's loop first drops them and the broker sends the
        # whole batch again to the next ingest of this session
        self._closed.clear()
        if self.client.disconnect() == paho.MQTT_ERR_SUCCESS:
            self._closed.wait(DISCONNECT_WAIT_S)
        self.client.loop_stop()
        log.info("ingest: stopped: %s", json.dumps(self.snapshot()))

    def wait_connected(self, timeout: float) -> bool:
        """True once connected and subscribed (after a broker restart paho reconnects by itself)."""
        return self._connected.wait(timeout)

    def snapshot(self) -> dict[str, Any]:
        """The counters as a dict."""
        with self._lock:
            c = self.counters
            return {
                "messages": c.messages,
                "results": c.results,
                "inserted": c.inserted,
                "duplicates": c.duplicates,
                "malformed": c.malformed,
                "quarantined": dict(c.quarantined),
                "stats": c.stats,
                "db_errors": c.db_errors,
                "connects": c.connects,
                "connected": self._connected.is_set(),
                "writer_alive": self.writer.is_alive(),
                "last_error": c.last_error,
                "replay": self.replayer.snapshot() if self.replayer is not None else None,
            }

    # -- the writer thread ------------------------------------------------------------------------------

    def _write_loop(self) -> None:
        backoff = Backoff(0.5, 10.0)
        last_log = time.monotonic()
        done = False
        while not done:
            items, done = self._collect()
            if items:
                self._write(items, backoff)
            if time.monotonic() - last_log >= LOG_EVERY_S:
                last_log = time.monotonic()
                log.info("ingest: %s", json.dumps(self.snapshot()))

    def _collect(self) -> tuple[list[_Item], bool]:
        """One batch: block for the first message, then take more until `batch` results or `flush_s`."""
        first = self._queue.get()  # asleep while idle
        if first is None:
            return self._drain_rest(), True
        items = [first]
        deadline = time.monotonic() + self.opts.flush_s
        while len(items) < self.opts.batch:
            left = deadline - time.monotonic()
            try:
                item = self._queue.get(timeout=left) if left > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                return items + self._drain_rest(), True
            items.append(item)
        return items, False

    def _drain_rest(self) -> list[_Item]:
        rest: list[_Item] = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return rest
            if item is not None:
                rest.append(item)

    def _parse(self, item: _Item, now: float) -> _Parsed:
        """One message as rows, stats or a gap; or refused, with why (never an exception: see ingestparse.py)."""
        o = self.opts
        if self._answers and paho.topic_matches_sub(self._answers, item.topic):
            return self._parse_answer(item)
        kinds = (
            ("stats", o.stats_topic),
            ("gaps", o.gaps_topic),
            ("clock", o.clock_topic),
            ("results", o.results_topic),
            ("results", o.events_topic),
        )
        kind, topic_filter = next(((k, f) for k, f in kinds if paho.topic_matches_sub(f, item.topic)), kinds[3])
        sender = topic_identity(topic_filter, item.topic)
        parsed = _Parsed(item, sender.device)
        try:
            if kind == "stats":
                parsed.stats = [parse_stats(item.payload, sender, now)]
            elif kind == "gaps":
                parsed.gaps = [parse_gap(item.payload, sender)]
            elif kind == "clock":
                parsed.corrections = parse_clock(item.payload, sender)
            else:
                parsed.rows = parse_results(item.payload, sender)
        except RefusedError as exc:
            return _Parsed(item, sender.device, refused=(exc.reason, str(exc)))
        except Exception as exc:  # a case the checks missed: refused all the same, never a dead writer
            log.exception("ingest: unexpected error reading a message on %s", item.topic)
            return _Parsed(item, sender.device, refused=("internal", f"{type(exc).__name__}: {exc}"))
        return parsed

    def _parse_answer(self, item: _Item) -> _Parsed:
        """A device's answer to a replay request: for the replayer, never written; refused if unreadable."""
        device = item.topic.split("/")[self._answers.split("/").index("+")]
        try:
            body = loads(item.payload, max_bytes=64 << 10, what="replay answer")
        except InputError as exc:
            return _Parsed(item, device, refused=(exc.reason, str(exc)))
        if not isinstance(body, dict):
            return _Parsed(item, device, refused=("malformed", "a replay answer is a JSON object"))
        return _Parsed(item, device, answer=body)

    def _write(self, items: list[_Item], backoff: Backoff) -> None:
        now = time.time()
        parsed = [self._parse(item, now) for item in items]
        replays = self.replayer.take_log() if self.replayer is not None else []
        done = self._commit(parsed, now, backoff, replays)
        if done is None:
            return  # stopping while the database is away: nothing acknowledged, the broker sends them again
        inserted, refused = done
        self._ack(items)
        if self.replayer is not None:
            self.replayer.note((r.device, r.pipeline, r.seq) for p in parsed if p.refused is None for r in p.rows)
            for p in parsed:
                if p.answer is not None and p.device:
                    self.replayer.answered(p.device, p.answer)
        results = sum(len(p.rows) for p in parsed if p.refused is None)
        with self._lock:
            c = self.counters
            c.messages += sum(1 for p in parsed if not (p.stats or p.gaps or p.corrections) and p.answer is None)
            c.results += results
            c.inserted += inserted
            c.duplicates += results - inserted
            c.malformed += len(refused)
            c.stats += sum(len(p.stats) for p in parsed if p.refused is None)
            for p in refused:
                reason = p.refused[0] if p.refused else "?"
                c.quarantined[reason] = c.quarantined.get(reason, 0) + 1
        for p in refused:
            log.warning("ingest: a message on %s quarantined (%s): %s", p.item.topic[:200], *(p.refused or ("?", "")))

    def _commit(
        self, parsed: list[_Parsed], now: float, backoff: Backoff, replays: list[ReplayRow]
    ) -> tuple[int, list[_Parsed]] | None:
        """Write the batch until it works (the database restarts: retry with backoff); (rows inserted, the
        messages quarantined), or None if asked to stop first. A batch the database refuses for its data is
        written message by message, and a message it refuses alone is quarantined."""
        while True:
            try:
                inserted = self._write_isolating(parsed, now, replays)
            except IngestError as exc:
                with self._lock:
                    self.counters.db_errors += 1
                self._note_error(f"database write failed, retrying (nothing acknowledged meanwhile): {exc}")
                if self._stopping.wait(backoff.next_delay()):
                    return None
                continue
            backoff.reset()
            return inserted, [p for p in parsed if p.refused is not None]

    def _write_isolating(self, parsed: list[_Parsed], now: float, replays: list[ReplayRow]) -> int:
        try:
            return self.db.write(_batch(parsed, now, replays))
        except IngestDataError as exc:
            log.warning("ingest: the database refused a batch (%s); writing it message by message", exc)
        inserted = 0
        for p in parsed:
            if p.refused is not None:
                continue
            try:
                inserted += self.db.write(_batch([p], now))
            except IngestDataError as exc:
                p.refused = ("db_refused", str(exc))
        self.db.write(_batch([p for p in parsed if p.refused is not None], now, replays))
        return inserted

    def _ack(self, items: list[_Item]) -> None:
        with self._lock:
            generation = self._generation
        for item in items:
            if item.qos and item.generation == generation:  # an older connection's mid means nothing now
                self.client.ack(item.mid, item.qos)  # disconnected meanwhile: an error code, a redelivery

    def _note_error(self, message: str) -> None:
        with self._lock:
            repeated = self.counters.last_error == message
            self.counters.last_error = message
        log.log(logging.DEBUG if repeated else logging.WARNING, "ingest: %s", message)

    def _on_death(self, why: str) -> None:
        self._note_error(f"the database writer died: {why}")
        if self._on_writer_death is not None:
            self._on_writer_death()
