"""The durable queue: SQLite in WAL mode, with results published from memory while their commit is due.

A result appended here is at once visible to the publisher (`fetch` returns pending rows from memory and
committed rows from the database, one id-ordered stream) and waits for its commit. The writer thread
commits a result only when it is still unacknowledged after `batch_ms` (or `batch_max` of them wait):
with the broker up and keeping up, results are acknowledged within milliseconds and never written, so a
healthy online device writes next to nothing; while the broker is down or slow every result is durable
within the commit window, as before.

The parts, each in its own module:
- `outbox.Outbox`: where every result stands (pending, acknowledged, refused, dead); the one owner of
  acknowledgement state;
- `seqlease.SeqAllocator`: `seq` numbers leased ahead in an fsync'd file, never reused after kill -9 or a
  torn WAL;
- `spoolspace.SpaceGuard`: the capacity (`max_bytes`, lowered to what the disk has room for) and the ballast;
- `recovery`: opening a spool left by a crash or a power cut (the integrity check, before the start or in
  the background, a damaged file moved aside and its seqs and unsent results counted);
- `batchwrite`: one commit of the writer thread, as one transaction; `eviction`: the TTL, `max_bytes` with
  `on_full`, and the totals every drop is counted in; `gaplog`: the seq gaps status shows;
- `spooldb`: every SQL statement;
- `ledger.Ledger`: the state in memory, under one condition, that the parts below share;
- `writer.SpoolWriter`: the writer thread (when to commit is `policy.Durability`'s to say);
- `replayview.ReplayView`: the replay window as the uplink's replay requests read it.

`Spool` itself is the facade producers and the uplink meet (store/outlet.py names what the uplink may use).

Policies (all counted by reason, nothing disappears silently): `max_bytes` with `on_full`
(`drop_oldest` evicts the oldest rows, `drop_newest` refuses new ones); `max_age_s` (TTL) on the spool
clock: monotonic time accumulated while edged runs, persisted; it never runs backwards, so a wall-clock
jump never expires results early (the capture time `ts` is for reporting only).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edged.core.errors import SpoolError
from edged.core.threads import DeathHook
from edged.store import recovery, spooldb
from edged.store.batchwrite import BatchWriter
from edged.store.capacity import IntakeRate, capacity_s
from edged.store.diskspace import free_bytes
from edged.store.eviction import Totals
from edged.store.gaplog import GapLog
from edged.store.ledger import Ledger
from edged.store.outbox import Outbox
from edged.store.policy import Durability
from edged.store.replayview import ReplayView
from edged.store.seqlease import SeqAllocator, SeqGap
from edged.store.settings import SpoolConfig
from edged.store.spooldb import Reader, Row
from edged.store.spoolspace import SpaceGuard
from edged.store.window import ReplayWindow
from edged.store.writer import SpoolWriter

log = logging.getLogger(__name__)

__all__ = ["Row", "Spool", "SpoolConfig"]

QUEUE_MAX = 1024  # unacknowledged results waiting in memory at most; append() blocks beyond (a slow disk)


class Spool:
    """Durable FIFO of results. Thread-safe: producers `append`, the publisher `fetch`es, `ack`s, `refuse`s."""

    def __init__(
        self,
        path: Path,
        cfg: SpoolConfig | None = None,
        *,
        dead_letter_after: int = 5,
    ) -> None:
        self.path = path
        self.cfg = cfg = cfg or SpoolConfig()
        self.policy = Durability.of(cfg)  # when to commit, fsync, what is trusted after a crash (policy.py)
        self.dead_letter_after = dead_letter_after  # mqtt.dead_letter_after: refusals before a row is set aside
        wconn, self.recovered_from, state, checking = recovery.open_spool(path, self.policy)
        self.reader = Reader(path, self.policy)
        self.space = SpaceGuard(path, cfg)
        n = Totals(state["depth"], state["bytes"], state["dead_letters"], state["dropped"], state["uncertain"])
        committed: dict[str, int] = state["seqs"]
        meta_dirty = False
        if self.recovered_from is not None:
            recovery.count_quarantined(self.recovered_from, n, committed)
            meta_dirty = True
        self.window = ReplayWindow(cfg, wconn)  # the replay window: in memory while running, a table at a stop
        outbox = Outbox(state["next_id"], dead_letter_after, self.window.recent if self.window.enabled else None)
        self.ledger = led = Ledger(outbox, n, {}, {}, float(state["clock"]))
        trusted = led.settled if self.policy.settled_marks_trusted else None
        self.seqs = SeqAllocator(recovery.floor_path(path), committed, trusted)
        # a large spool closed cleanly is checked while results flow (recovery.py)
        self.check = recovery.BackgroundCheck(path, self.policy, self.seqs.keep_unclean) if checking else None
        self.gap_log = GapLog(state["gaps"])
        self.new_gaps: list[SeqGap] = list(self.seqs.gaps)  # to announce (announce_gaps) before they settle
        if self.seqs.gaps:
            n.uncertain += self.gap_log.note(self.seqs.gaps)
            meta_dirty = True
        led.meta_dirty = meta_dirty
        # per seq stream: the highest seq appended, and a cap while a gap is not announced yet
        led.appended = self.seqs.last()
        led.caps = {g.stream: g.first - 1 for g in self.seqs.gaps}
        batches = BatchWriter(cfg, self.space, self.window, dead_letter_after)
        parts = (self.space, self.window, self.gap_log, self.seqs)
        self.writer = SpoolWriter(led, wconn, self.policy, batches, parts=parts, batch_max=cfg.batch_max)
        self.replay = ReplayView(led, self.reader, self.window)  # the replay requests read it (outlet.ReplaySource)
        self.intake = IntakeRate()  # bytes a second appended: what an outage would have to hold
        self.clock = led.clock  # the spool clock: seconds edged has been running, accumulated across restarts
        self.wait_for_commit = self.writer.wait_for_commit
        if n.depth:
            log.info("spool %s holds %d results from before (%d bytes)", path, n.depth, n.bytes)

    # -- producers -------------------------------------------------------------------------------------

    def start(self, on_death: DeathHook | None = None) -> None:
        """Start the writer thread (and the seq lease's). `on_death(why)`: either of them died (the daemon
        exits for systemd to restart it: their state is not safe to resume in-process, the file is)."""
        self.writer.start(on_death)
        self.seqs.start(on_death)
        if self.check is not None:
            self.check.start()

    def next_seq(self, pipeline: str) -> int:
        """The next sequence number of a pipeline (1, 2, ...; continues after a restart, never reused)."""
        return self.seqs.next(pipeline)

    def append(self, pipeline: str, seq: int, ts: float, topic: str, payload: bytes) -> None:
        """Hand a result over: the publisher can send it now; it is committed unless acknowledged first.

        Blocks while QUEUE_MAX results wait in memory (the writer cannot keep up: a slow disk)."""
        led = self.ledger
        with led.cond:
            box = led.outbox
            while box.unacked_pending() >= QUEUE_MAX and not led.closing:
                led.cond.wait(0.5)
            if led.closing:
                raise SpoolError("spool is closed")
            row = Row(box.take_id(), pipeline, seq, ts, led.clock(), topic, payload)
            box.add(row)
            self.intake.note(len(payload))
            if seq > led.appended.get(pipeline, 0):
                led.appended[pipeline] = seq
            led.changes += 1
            if len(box.pending) == 1 or len(box.pending) >= self.writer.batch_max:
                led.cond.notify_all()  # the writer starts its timer, or the batch is full
        led.notify()

    def announce_gaps(self, message: Callable[[SeqGap], tuple[str, bytes]]) -> None:
        """Spool one message per gap of this start (`message(gap)` gives its topic and payload), like a
        result: the gap counts as settled only once its announcement is committed or acknowledged, so a
        second cut before that declares it again."""
        for gap in self.new_gaps:
            topic, payload = message(gap)
            self.append(gap.stream, gap.first, time.time(), topic, payload)
        with self.ledger.cond:
            for gap in self.new_gaps:
                self.ledger.caps.pop(gap.stream, None)
            self.new_gaps = []

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything appended (and acknowledged) so far is committed. True when it was."""
        return self.writer.flush(timeout)

    # -- the uplink (store/outlet.py Outlet) -----------------------------------------------------------

    def on_change(self, callback: Callable[[], None]) -> None:
        """Call `callback` (cheap, non-blocking) whenever there is something new to fetch."""
        self.ledger.listeners.append(callback)

    def fetch(self, after_id: int, limit: int) -> list[Row]:
        """Rows with id > after_id, oldest first: committed ones from the database, then pending ones from
        memory; acknowledged and dead rows are skipped."""
        led = self.ledger
        with led.cond:
            live = led.outbox.live_after(after_id, limit)
            on_disk = after_id < led.outbox.committed_max
            skip = led.outbox.skip_after(after_id) if on_disk else set()
        if not on_disk:
            return live
        with self.reader.use() as conn:
            rows = spooldb.fetch(conn, after_id, limit + len(skip))
        if skip:
            rows = [r for r in rows if r.id not in skip]
        with led.cond:
            led.outbox.note_tries(rows)
        if live:
            seen = {r.id for r in rows}
            rows += [r for r in live if r.id not in seen]
        return rows[:limit]

    def changes(self) -> int:
        """A counter that moves whenever `fetch` may return something new."""
        with self.ledger.cond:
            return self.ledger.changes

    def ack(self, row_ids: list[int]) -> None:
        """The broker acknowledged these rows: a pending one is never written, a committed one is deleted."""
        with self.ledger.cond:
            self.ledger.outbox.ack(row_ids, self.ledger.clock())
            self.writer.due_soon()

    def refuse(self, row_id: int, reason: str, *, final: bool = False) -> bool:
        """The broker refused this row (counted now); after `dead_letter_after` refusals, or at once when
        `final` (it can never be sent), it is a dead letter: never sent again, moved to dead_letters in the
        next commit. True when it became one."""
        with self.ledger.cond:
            dead = self.ledger.outbox.refuse(row_id, reason, final=final)
            self.ledger.changes += 1
            self.writer.due_soon()
        if dead:
            log.error(
                "spool: a result refused %d times is set aside as a dead letter: %s",
                self.dead_letter_after, reason,
            )  # fmt: skip
        return dead

    def ttl_offset(self) -> float:
        """`max_age` minus the spool clock now: a row has `row.clock + ttl_offset()` seconds left to live
        (MQTT 5 message expiry). One call serves a whole fetch: the publisher adds it to each row's clock."""
        return self.cfg.max_age - self.clock()

    @property
    def depth(self) -> int:
        """Results not acknowledged yet: committed and pending (the real backlog)."""
        with self.ledger.cond:
            return self.ledger.depth()

    # -- status ----------------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """The `spool` entry of the status JSON."""
        with self.reader.use() as conn:
            stored_ts = spooldb.oldest_ts(conn)
            _, reusable = spooldb.space(conn)
        led, writer = self.ledger, self.writer
        with led.cond:
            n, box = led.n, led.outbox
            oldest_ts = stored_ts
            first = box.oldest_pending()
            if oldest_ts is None and first is not None:
                oldest_ts = first.ts
            snapshot = {
                "depth": led.depth(),
                "bytes": n.bytes,
                "oldest_age_s": round(max(0.0, time.time() - oldest_ts), 1) if oldest_ts is not None else 0.0,
                "dropped": sum(n.dropped.values()),
                "dropped_by_reason": dict(n.dropped),
                "dead_letters": n.dead_letters,
                "dropped_recent": writer.recent_drops.growth(),
                "dead_letters_recent": writer.recent_dead.growth(),
                "uncertain": n.uncertain,
                "uncommitted": box.unacked_pending(),
                "acked_before_commit": box.acked_pending,
                "max_bytes": self.space.cap,
                "error": (self.check and self.check.damage) or writer.error or self.seqs.error,
                "space_warning": self.space.warning,
                "seq_gaps": list(self.gap_log.entries),
                "seqs": dict(led.appended),  # per stream, the highest seq handed to a result (consumers bound by it)
                "replay_window": self.window.snapshot(due=[*box.sent_due, *led.sending_to_window]),
                "replayed": self.replay.replayed,
            }
        try:
            disk_free = free_bytes(self.path.parent)
        except OSError:
            disk_free = None
        held = n.bytes
        room = self.space.room(held, reusable, disk_free) if disk_free is not None else self.space.cap
        rate = self.intake.bytes_per_s()
        seconds = capacity_s(max(0, room - held), rate)
        snapshot |= {
            "capacity_s": round(seconds, 1) if seconds is not None else None,  # outage it holds at the current rate
            "intake_bytes_per_s": round(rate, 1) if rate is not None else None,
            "min_capacity_s": self.cfg.min_capacity,
            "disk_free_bytes": disk_free,
            "path": str(self.path),
            "recovered_from": str(self.recovered_from) if self.recovered_from else None,
        }
        return snapshot

    def close(self, timeout: float = 30.0) -> None:
        """Commit everything queued, stop the writer, close the database; a clean stop for the seq lease.

        A writer still committing after `timeout` (a disk that stalls) is left to finish as the process
        ends: what it committed is safe in the WAL, the lease is left unclean (the next start skips ahead)."""
        if not self.writer.stop(timeout):
            log.error("spool: the writer is still committing after %.0f s; leaving it to finish", timeout)
            return
        if self.check is not None:
            self.check.stop()
        self.reader.close()
        self.writer.conn.close()
        self.seqs.close()
