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
- `spooldb`: every SQL statement.

Policies (all counted by reason, nothing disappears silently): `max_bytes` with `on_full`
(`drop_oldest` evicts the oldest rows, `drop_newest` refuses new ones); `max_age_s` (TTL) on the spool
clock: monotonic time accumulated while edged runs, persisted; it never runs backwards, so a wall-clock
jump never expires results early (the capture time `ts` is for reporting only).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edged.core.errors import SpoolError
from edged.core.recent import Recent
from edged.core.threads import DeathHook, Supervised
from edged.store import recovery, spooldb
from edged.store.batchwrite import BatchWriter
from edged.store.capacity import IntakeRate, capacity_s, describe
from edged.store.diskspace import Ballast, free_bytes
from edged.store.eviction import Totals
from edged.store.gaplog import GapLog
from edged.store.outbox import Batch, Outbox
from edged.store.policy import Durability
from edged.store.seqlease import SeqAllocator, SeqGap
from edged.store.settings import SpoolConfig
from edged.store.spooldb import Row
from edged.store.spoolspace import SpaceGuard
from edged.store.window import ReplayWindow

log = logging.getLogger(__name__)

__all__ = ["Row", "Spool", "SpoolConfig"]

RECENT_S = 60.0  # `dropped_recent` and `dead_letters_recent` count this far back (a status reason while > 0)
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
        self.batch_max = cfg.batch_max
        self.dead_letter_after = dead_letter_after  # mqtt.dead_letter_after: refusals before a row is set aside
        self._cond = threading.Condition()
        self._forced = 0  # flush() calls waiting
        self._closing = False
        self._writing = False
        self._due_since: float | None = None  # deletes / refusals wait for a commit since then
        self._meta_dirty = False
        self._commits = 0
        self._changes = 0
        self._listeners: list[Callable[[], None]] = []
        self.writer: Supervised | None = None
        self._write_error: str | None = None
        self._wconn, self.recovered_from, state, checking = recovery.open_spool(path, self.policy)
        self._rconn = spooldb.connect(path, self.policy)
        self._rlock = threading.Lock()
        self.space = SpaceGuard(path, cfg)
        self._n = Totals(state["depth"], state["bytes"], state["dead_letters"], state["dropped"], state["uncertain"])
        committed: dict[str, int] = state["seqs"]
        if self.recovered_from is not None:
            recovery.count_quarantined(self.recovered_from, self._n, committed)
            self._meta_dirty = True
        # drops and dead letters of the last minute, for status reasons (read anywhere, noted at each commit)
        self.recent_drops = Recent(RECENT_S, sum(self._n.dropped.values()))
        self.recent_dead = Recent(RECENT_S, self._n.dead_letters)
        trusted = self.settled if self.policy.settled_marks_trusted else None
        self.seqs = SeqAllocator(recovery.floor_path(path), committed, trusted)
        # a large spool closed cleanly is checked while results flow (recovery.py)
        self.check = recovery.BackgroundCheck(path, self.policy, self.seqs.keep_unclean) if checking else None
        self.gap_log = GapLog(state["gaps"])
        self.new_gaps: list[SeqGap] = list(self.seqs.gaps)  # to announce (announce_gaps) before they settle
        if self.seqs.gaps:
            self._n.uncertain += self.gap_log.note(self.seqs.gaps)
            self._meta_dirty = True
        # per seq stream: the highest seq appended, and a cap while a gap is not announced yet
        self._appended: dict[str, int] = self.seqs.last()
        self._caps: dict[str, int] = {g.stream: g.first - 1 for g in self.seqs.gaps}
        self.outbox = Outbox(state["next_id"], dead_letter_after)
        self.window = ReplayWindow(cfg, self._wconn)
        self.outbox.keep_sent = self.window.enabled
        self.batches = BatchWriter(cfg, self.space, self.window, dead_letter_after)
        self.replayed = 0  # results sent again from the window on a consumer's request
        self.intake = IntakeRate()  # bytes a second appended: what an outage would have to hold
        self._sending_to_window: list[Row] = []  # acknowledged rows in the writer's open commit to the window
        self._clock_base = float(state["clock"])
        self._mono0 = time.monotonic()
        if self._n.depth:
            log.info("spool %s holds %d results from before (%d bytes)", path, self._n.depth, self._n.bytes)

    @property
    def ballast(self) -> Ballast:
        """The ballast file next to the spool (see diskspace.py)."""
        return self.space.ballast

    def announce_gaps(self, message: Callable[[SeqGap], tuple[str, bytes]]) -> None:
        """Spool one message per gap of this start (`message(gap)` gives its topic and payload), like a
        result: the gap counts as settled only once its announcement is committed or acknowledged, so a
        second cut before that declares it again."""
        for gap in self.new_gaps:
            topic, payload = message(gap)
            self.append(gap.stream, gap.first, time.time(), topic, payload)
        with self._cond:
            for gap in self.new_gaps:
                self._caps.pop(gap.stream, None)
            self.new_gaps = []

    def settled(self) -> dict[str, int]:
        """Per seq stream, the highest seq up to which every seq is committed, acknowledged by the broker or
        counted as dropped: what a crash cannot make uncertain."""
        with self._cond:
            return self._marks(self.outbox.pending.values())

    def _marks(self, unsettled: Any) -> dict[str, int]:
        marks = dict(self._appended)
        for key, cap in self._caps.items():
            marks[key] = min(marks.get(key, cap), cap)
        for row in unsettled:
            if row.seq - 1 < marks.get(row.stream, row.seq):
                marks[row.stream] = row.seq - 1
        return marks

    def clock(self) -> float:
        """The spool clock: seconds edged has been running, accumulated across restarts."""
        return self._clock_base + (time.monotonic() - self._mono0)

    def on_change(self, callback: Callable[[], None]) -> None:
        """Call `callback` (cheap, non-blocking) whenever there is something new to fetch."""
        self._listeners.append(callback)

    def _notify(self) -> None:
        for callback in self._listeners:
            callback()

    # -- producers -------------------------------------------------------------------------------------

    def start(self, on_death: DeathHook | None = None) -> None:
        """Start the writer thread (and the seq lease's). `on_death(why)`: either of them died (the daemon
        exits for systemd to restart it: their state is not safe to resume in-process, the file is)."""
        self.writer = Supervised("edged-spool-writer", target=self._write_loop, on_death=on_death)
        self.writer.start()
        self.seqs.start(on_death)
        if self.check is not None:
            self.check.start()

    def next_seq(self, pipeline: str) -> int:
        """The next sequence number of a pipeline (1, 2, ...; continues after a restart, never reused)."""
        return self.seqs.next(pipeline)

    def append(self, pipeline: str, seq: int, ts: float, topic: str, payload: bytes) -> None:
        """Hand a result over: the publisher can send it now; it is committed unless acknowledged first.

        Blocks while QUEUE_MAX results wait in memory (the writer cannot keep up: a slow disk)."""
        with self._cond:
            while self.outbox.unacked_pending() >= QUEUE_MAX and not self._closing:
                self._cond.wait(0.5)
            if self._closing:
                raise SpoolError("spool is closed")
            row = Row(self.outbox.take_id(), pipeline, seq, ts, self.clock(), topic, payload)
            self.outbox.add(row)
            self.intake.note(len(payload))
            if seq > self._appended.get(pipeline, 0):
                self._appended[pipeline] = seq
            self._changes += 1
            if len(self.outbox.pending) == 1 or len(self.outbox.pending) >= self.batch_max:
                self._cond.notify_all()  # the writer starts its timer, or the batch is full
        self._notify()

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything appended (and acknowledged) so far is committed. True when it was."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._forced += 1  # everything is due now, whatever batch_ms says
            self._cond.notify_all()
            try:
                while self._busy() and (left := deadline - time.monotonic()) > 0:
                    self._cond.wait(left)
                return not self._busy()
            finally:
                self._forced -= 1

    def _busy(self) -> bool:
        return bool(self.outbox.pending or self.outbox.has_due() or self._writing or self._meta_dirty)

    # -- publisher -------------------------------------------------------------------------------------

    def fetch(self, after_id: int, limit: int) -> list[Row]:
        """Rows with id > after_id, oldest first: committed ones from the database, then pending ones from
        memory; acknowledged and dead rows are skipped."""
        with self._cond:
            live = self.outbox.live_after(after_id, limit)
            on_disk = after_id < self.outbox.committed_max
            skip = self.outbox.skip_after(after_id) if on_disk else set()
        if not on_disk:
            return live
        with self._rlock:
            rows = spooldb.fetch(self._rconn, after_id, limit + len(skip))
        if skip:
            rows = [r for r in rows if r.id not in skip]
        with self._cond:
            self.outbox.note_tries(rows)
        if live:
            seen = {r.id for r in rows}
            rows += [r for r in live if r.id not in seen]
        return rows[:limit]

    def changes(self) -> int:
        """A counter that moves whenever `fetch` may return something new."""
        with self._cond:
            return self._changes

    def ack(self, row_ids: list[int]) -> None:
        """The broker acknowledged these rows: a pending one is never written, a committed one is deleted."""
        with self._cond:
            self.outbox.ack(row_ids)
            self._due_soon()

    def refuse(self, row_id: int, reason: str, *, final: bool = False) -> bool:
        """The broker refused this row (counted now); after `dead_letter_after` refusals, or at once when
        `final` (it can never be sent), it is a dead letter: never sent again, moved to dead_letters in the
        next commit. True when it became one."""
        with self._cond:
            dead = self.outbox.refuse(row_id, reason, final=final)
            self._changes += 1
            self._due_soon()
        if dead:
            log.error(
                "spool: a result refused %d times is set aside as a dead letter: %s",
                self.dead_letter_after, reason,
            )  # fmt: skip
        return dead

    def _due_soon(self) -> None:
        # wake the writer only to start its timer; waking it on every ack costs a thread switch each
        if self._due_since is None and self.outbox.has_due():
            self._due_since = time.monotonic()
            self._cond.notify_all()

    def ttl_offset(self) -> float:
        """`max_age` minus the spool clock now: a row has `row.clock + ttl_offset()` seconds left to live
        (MQTT 5 message expiry). One call serves a whole fetch: the publisher adds it to each row's clock."""
        return self.cfg.max_age - self.clock()

    def wait_for_commit(self, after: int, timeout: float) -> int:
        """Block until a commit newer than `after` happened (or timeout); return the commit counter."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._commits <= after and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)
            return self._commits

    # -- status ----------------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """The `spool` entry of the status JSON."""
        with self._rlock:
            stored_ts = spooldb.oldest_ts(self._rconn)
            _, reusable = spooldb.space(self._rconn)
        with self._cond:
            n, box = self._n, self.outbox
            oldest_ts = stored_ts
            first = box.oldest_pending()
            if oldest_ts is None and first is not None:
                oldest_ts = first.ts
            snapshot = {
                "depth": self._depth(),
                "bytes": n.bytes,
                "oldest_age_s": round(max(0.0, time.time() - oldest_ts), 1) if oldest_ts is not None else 0.0,
                "dropped": sum(n.dropped.values()),
                "dropped_by_reason": dict(n.dropped),
                "dead_letters": n.dead_letters,
                "dropped_recent": self.recent_drops.growth(),
                "dead_letters_recent": self.recent_dead.growth(),
                "uncertain": n.uncertain,
                "uncommitted": box.unacked_pending(),
                "acked_before_commit": box.acked_pending,
                "max_bytes": self.space.cap,
                "error": (self.check and self.check.damage) or self._write_error or self.seqs.error,
                "space_warning": self.space.warning,
                "seq_gaps": list(self.gap_log.entries),
                "replay_window": self.window.snapshot(due=[*box.sent_due, *self._sending_to_window]),
                "replayed": self.replayed,
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

    def window_rows(self, pipeline: str, first: int, last: int, limit: int) -> tuple[list[Row], list[int]]:
        """(results of one stream with first <= seq <= last the broker acknowledged, by seq, at most `limit`;
        the seqs among them still waiting for their first delivery). The acknowledged ones are in the window,
        or still in memory on their way there, or committed with their delete due."""
        with self._rlock:
            kept = spooldb.sent_rows(self._rconn, pipeline, first, last, limit)
            stored = spooldb.stream_rows(self._rconn, pipeline, first, last, limit)
        with self._cond:
            box = self.outbox
            acked = [r for r in stored if r.id in box.acked]
            kept += acked + [r for r in self._window_due(pipeline) if first <= r.seq <= last]
            waiting = [r.seq for r in stored if r.id not in box.acked and r.id not in box.dead]
            waiting += [r.seq for r in box.pending.values() if r.stream == pipeline and first <= r.seq <= last]
        unique = {r.seq: r for r in kept}
        return [unique[s] for s in sorted(unique)][:limit], sorted(set(waiting) - set(unique))

    def _window_due(self, pipeline: str) -> list[Row]:
        """A stream's acknowledged rows on their way to the window: in memory, or in the writer's open commit
        (with `_cond` held)."""
        return [r for r in (*self.outbox.sent_due, *self._sending_to_window) if r.stream == pipeline]

    def capacity_text(self) -> str:
        """The outage the spool holds at the current rate, in words (`3 d 4 h`, `unknown`), for the status line."""
        seconds = self.stats().get("capacity_s")
        return describe(seconds if isinstance(seconds, int | float) else None)

    def window_span(self, pipeline: str) -> list[int] | None:
        """[lowest, highest] seq of one stream in the replay window, or None."""
        with self._rlock:
            span = spooldb.sent_span(self._rconn, pipeline)
        with self._cond:  # and those on their way there: in memory, or committed with their delete due
            seqs = [r.seq for r in self._window_due(pipeline)] + (list(span) if span else [])
            acked = list(self.outbox.acked)
        if acked:
            with self._rlock:
                stored = spooldb.acked_span(self._rconn, pipeline, acked)
            seqs += list(stored) if stored else []
        return [min(seqs), max(seqs)] if seqs else None

    def send_again(self, rows: list[Row]) -> int:
        """Hand results from the window to the publisher again (never blocks: a replay is bounded by its
        request); how many."""
        with self._cond:
            if self._closing:
                return 0
            count = self.outbox.add_again(rows)
            self.replayed += count
            self._changes += count
            self._cond.notify_all()
        self._notify()
        return count

    def _depth(self) -> int:
        return self._n.depth - len(self.outbox.acked) + self.outbox.unacked_pending()

    @property
    def depth(self) -> int:
        """Results not acknowledged yet: committed and pending (the real backlog)."""
        with self._cond:
            return self._depth()

    # -- writer ----------------------------------------------------------------------------------------

    def _write_loop(self) -> None:
        while True:
            with self._cond:
                while not self._closing and (wait := self._wait_s()) != 0.0:
                    self._cond.wait(wait)
                keep = set(self.outbox.acked)
                batch = self.outbox.take_batch(self.batch_max)
                self._sending_to_window = batch.sent  # in the commit now: still readable for a replay request
                # what this commit makes settled: rows after the batch stay pending (uncommitted)
                marks = self._marks(r for i, r in self.outbox.pending.items() if i > self.outbox.writing_upto)
                meta, self._meta_dirty = self._meta_dirty, False
                self._due_since = time.monotonic() if self.outbox.has_due() else None
                self._writing = bool(batch) or meta
                done = self._closing and not self._writing
            if self._writing:
                self._commit(batch, keep, marks)
            if done:
                return

    def _wait_s(self) -> float | None:
        """0 when a commit is due now, else how long until one will be (None: nothing waits): policy.py
        decides from what waits."""
        box, now = self.outbox, time.monotonic()
        first = box.oldest_pending()
        return self.policy.commit_wait_s(
            urgent=self._meta_dirty or bool(self._forced and self._busy()),
            unacked=box.unacked_pending(),
            oldest_pending_age_s=self.clock() - first.clock if first is not None else None,
            changes_age_s=now - self._due_since if self._due_since is not None else None,
            sent_age_s=now - box.sent_since if box.sent_since is not None else None,
            sent_waiting=len(box.sent_due),
        )

    def _commit(self, batch: Batch, keep: set[int], marks: dict[str, int]) -> None:
        delay = 0.1
        while True:
            try:
                n = self.batches.write(self._wconn, self._n, batch, keep=keep, marks=marks, clock=self.clock(),
                                       gaps=self.gap_log.entries)  # fmt: skip
                with self._cond:
                    self._write_error = None
                self.seqs.retry()
                break
            except sqlite3.Error as exc:
                if self._wconn.in_transaction:
                    spooldb.rollback(self._wconn)
                self.window.recount(self._wconn)
                self._note_write_error(exc)
                if spooldb.is_disk_full(exc):
                    self.space.on_disk_full()
                # keep the batch in memory and retry: nothing is dropped here
                if self._closing and delay > 2.0:
                    log.exception("spool: giving up on %d uncommitted results at shutdown", len(batch.rows))
                    n = self._n
                    break
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
        self.recent_drops.note(sum(n.dropped.values()))
        self.recent_dead.note(n.dead_letters)
        with self._cond:
            self._n = n
            self.outbox.committed(batch)
            self._sending_to_window = []
            self.window.settle()
            self._writing = False
            self._commits += 1
            self._changes += 1
            self._cond.notify_all()

    def _note_write_error(self, exc: sqlite3.Error) -> None:
        msg = f"spool write failed: {exc} (disk full or read-only?); retrying, results are kept in memory"
        with self._cond:
            first = self._write_error is None
            self._write_error = msg
        if first:
            log.error("%s", msg)

    def close(self, timeout: float = 30.0) -> None:
        """Commit everything queued, stop the writer, close the database; a clean stop for the seq lease.

        A writer still committing after `timeout` (a disk that stalls) is left to finish as the process
        ends: what it committed is safe in the WAL, the lease is left unclean (the next start skips ahead)."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self.writer is not None:
            self.writer.join(timeout=timeout)
            if self.writer.is_alive():
                log.error("spool: the writer is still committing after %.0f s; leaving it to finish", timeout)
                return
        if self.check is not None:
            self.check.stop()
        with self._rlock:
            self._rconn.close()
        self._wconn.close()
        self.seqs.close()
