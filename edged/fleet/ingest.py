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
from typing import Any

import paho.mqtt.client as paho

from edged.core.backoff import Backoff
from edged.core.errors import IngestDataError, IngestError, InputError
from edged.core.safejson import loads
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
from edged.fleet.ingestlink import IngestLink, Received
from edged.fleet.ingestoptions import IngestCounters, IngestOptions
from edged.fleet.ingestparse import (
    RefusedError,
    parse_clock,
    parse_gap,
    parse_results,
    parse_stats,
    topic_identity,
)
from edged.fleet.quarantinedb import QuarantineGate
from edged.fleet.replayer import Replayer
from edged.fleet.replaystate import ReplayState, open_replay_state
from edged.fleet.seqbounds import SeqBounds

log = logging.getLogger(__name__)

__all__ = ["Ingest", "IngestCounters", "IngestOptions"]

LOG_EVERY_S = 10.0
LOGGED_REFUSALS = 5  # refused messages logged per batch at most (a junk flood must not flood the journal)


@dataclass
class _Parsed:
    """What one message became: rows, stats, a gap, or a refusal (reason, detail) for the quarantine."""

    item: Received
    device: str | None  # as its topic names it
    rows: list[ResultRow] = field(default_factory=list)
    stats: list[StatsRow] = field(default_factory=list)
    gaps: list[GapRow] = field(default_factory=list)
    corrections: list[CorrectionRow] = field(default_factory=list)
    refused: tuple[str, str] | None = None
    answer: dict[str, Any] | None = None  # a device's answer to a replay request (nothing to write)
    skipped: bool = False  # refused faster than its device's quarantine budget: counted, not written


def _batch(
    parsed: list[_Parsed], now: float, replays: list[ReplayRow] | None = None, opts: IngestOptions | None = None
) -> IngestBatch:
    """The database write of some messages: their rows (one per key), stats, gaps, clock corrections and
    quarantined ones (those `skipped` only counted), and the replay records of this turn."""
    rows: dict[tuple[str, str, int], ResultRow] = {}
    stats: list[StatsRow] = []
    gaps: list[GapRow] = []
    quarantine: list[QuarantineRow] = []
    for p in parsed:
        if p.refused is not None and p.skipped:
            continue
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
    latest: dict[str, list[CorrectionRow]] = {}  # a clock message is the device's whole list: the last one wins
    for p in parsed:
        if p.refused is None and p.corrections:
            latest[p.corrections[0].device] = p.corrections
    corrections = [c for cs in latest.values() for c in cs]
    batch = IngestBatch(list(rows.values()), stats, gaps, quarantine, replays or [], corrections)
    if opts is not None:
        batch.quarantine_rows, batch.quarantine_bytes = opts.quarantine_rows, opts.quarantine_bytes
    return batch


def parse_answer(answers: str, item: Received) -> _Parsed:
    """A device's answer to a replay request (on `answers`, a filter with the device at its `+`): for the
    replayer, never written; refused if unreadable."""
    device = item.topic.split("/")[answers.split("/").index("+")]
    try:
        body = loads(item.payload, max_bytes=64 << 10, what="replay answer")
    except InputError as exc:
        return _Parsed(item, device, refused=(exc.reason, str(exc)))
    if not isinstance(body, dict):
        return _Parsed(item, device, refused=("malformed", "a replay answer is a JSON object"))
    return _Parsed(item, device, answer=body)


class Ingest:
    """One ingest process: a paho client and the database writer thread."""

    def __init__(self, opts: IngestOptions, db: Database, *, on_death: Callable[[], object] | None = None) -> None:
        """`on_death()`: the writer died (`edged ingest` then stops, exit 1)."""
        self.opts = opts
        self._on_writer_death = on_death
        self.db = db
        self.counters = IngestCounters()
        self._lock = threading.Lock()
        self._queue: queue.Queue[Received | None] = queue.Queue(maxsize=opts.receive_max + 16)
        self._stopping = threading.Event()
        self.link = IngestLink(opts, self._queue, self.counters, self._lock, self._stopping, self._note_error)
        # not restarted in-process: a death (a bug; every message's failure is caught in _parse) stops the ingest
        # with exit 1, so that its supervisor restarts it and the broker sends again what was not acknowledged
        self.writer = Supervised("edged-ingest-db", target=self._write_loop, on_death=self._on_death)
        self.replayer: Replayer | None = None
        self._state: ReplayState | None = None  # the replayer's own connection to the shared database
        if opts.replay_topic:
            self._state = open_replay_state(db.url)
            self.replayer = Replayer(opts.client_id, opts.replay_topic, self.link.ask, opts.replay_after_s,
                                     self._state)  # fmt: skip
        self._answers = self.link.answers
        self._quarantine_gate = QuarantineGate()
        self.bounds = SeqBounds()  # how far a stream's seq may jump (seqbounds.py)

    # -- lifecycle --------------------------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> None:
        """Connect (resuming the session the broker kept) and start the writer."""
        if self.replayer is not None:
            try:
                self.replayer.seed(self.db.gaps())  # what this database already misses
            except IngestError as exc:
                log.warning("ingest: cannot read the gaps already in the database: %s", exc)
            self.replayer.start()
        self.writer.start()
        try:
            self.link.connect(timeout)
        except IngestError:
            self.stop()
            raise

    def stop(self, timeout: float = 20.0) -> None:
        """Write and acknowledge what arrived, then disconnect (the session stays on the broker)."""
        self._stopping.set()
        if self.replayer is not None:
            self.replayer.stop()
        if self.writer.is_alive():
            self._queue.put(None)
            self.writer.join(timeout)
        self.link.close()
        if self._state is not None:
            self._state.close()
        log.info("ingest: stopped: %s", json.dumps(self.snapshot()))

    def wait_connected(self, timeout: float) -> bool:
        """True once connected and subscribed (after a broker restart paho reconnects by itself)."""
        return self.link.connected.wait(timeout)

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
                "quarantine_skipped": c.quarantine_skipped,
                "stats": c.stats,
                "db_errors": c.db_errors,
                "connects": c.connects,
                "connected": self.link.connected.is_set(),
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

    def _collect(self) -> tuple[list[Received], bool]:
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

    def _drain_rest(self) -> list[Received]:
        rest: list[Received] = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return rest
            if item is not None:
                rest.append(item)

    def _parse(self, item: Received, now: float) -> _Parsed:
        """One message as rows, stats or a gap; or refused, with why (never an exception: see ingestparse.py)."""
        o = self.opts
        if self._answers and paho.topic_matches_sub(self._answers, item.topic):
            return parse_answer(self._answers, item)
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
                parsed.corrections = parse_clock(item.payload, sender, now)
            else:
                parsed.rows = parse_results(item.payload, sender)
        except RefusedError as exc:
            return _Parsed(item, sender.device, refused=(exc.reason, str(exc)))
        except Exception as exc:  # a case the checks missed: refused all the same, never a dead writer
            log.exception("ingest: unexpected error reading a message on %s", item.topic)
            return _Parsed(item, sender.device, refused=("internal", f"{type(exc).__name__}: {exc}"))
        return parsed

    def _screen(self, parsed: list[_Parsed]) -> None:
        """Refuse results whose seq jumps past belief (seqbounds.py: `implausible_seq`); mark refused messages
        past their device's quarantine budget as only counted (quarantinedb.py)."""
        self.bounds.note_stats(s for p in parsed if p.refused is None for s in p.stats)
        for p in parsed:
            why = next((w for r in p.rows if (w := self.bounds.implausible(r))), None) if p.refused is None else None
            if why is not None:
                p.refused, p.rows = ("implausible_seq", why), []
            if p.refused is not None and not self._quarantine_gate.admit(p.device):
                p.skipped = True

    def _write(self, items: list[Received], backoff: Backoff) -> None:
        now = time.time()
        parsed = [self._parse(item, now) for item in items]
        self._screen(parsed)
        replays = self.replayer.take_log() if self.replayer is not None else []
        done = self._commit(parsed, now, backoff, replays)
        if done is None:
            return  # stopping while the database is away: nothing acknowledged, the broker sends them again
        inserted, refused = done
        self.link.ack(items)
        self.bounds.note_written(r for p in parsed if p.refused is None for r in p.rows)
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
            c.quarantine_skipped += sum(1 for p in refused if p.skipped)
        for p in refused[:LOGGED_REFUSALS]:
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
            return self.db.write(_batch(parsed, now, replays, self.opts))
        except IngestDataError as exc:
            log.warning("ingest: the database refused a batch (%s); writing it message by message", exc)
        inserted = 0
        for p in parsed:
            if p.refused is not None:
                continue
            try:
                inserted += self.db.write(_batch([p], now, opts=self.opts))
            except IngestDataError as exc:
                p.refused = ("db_refused", str(exc))
        self.db.write(_batch([p for p in parsed if p.refused is not None], now, replays, self.opts))
        return inserted

    def _note_error(self, message: str) -> None:
        with self._lock:
            repeated = self.counters.last_error == message
            self.counters.last_error = message
        log.log(logging.DEBUG if repeated else logging.WARNING, "ingest: %s", message)

    def _on_death(self, why: str) -> None:
        self._note_error(f"the database writer died: {why}")
        if self._on_writer_death is not None:
            self._on_writer_death()
