"""The spool's writer thread: it commits what waits in the outbox when the durability policy (policy.py) says
a commit is due, one transaction a batch (batchwrite.py), and keeps a failed batch in memory to retry.

Producers and the uplink never wait for it, except `flush` (everything committed now) and `close`."""

from __future__ import annotations

import logging
import sqlite3
import time

from edged.core.recent import Recent
from edged.core.threads import DeathHook, Supervised
from edged.store import spooldb
from edged.store.batchwrite import BatchWriter
from edged.store.gaplog import GapLog
from edged.store.ledger import Ledger
from edged.store.outbox import Batch
from edged.store.policy import Durability
from edged.store.seqlease import SeqAllocator
from edged.store.spoolspace import SpaceGuard
from edged.store.window import ReplayWindow

log = logging.getLogger(__name__)

RECENT_S = 60.0  # `dropped_recent` and `dead_letters_recent` count this far back (a status reason while > 0)


class SpoolWriter:
    """Commits the ledger's outbox to the database on its own thread, as `policy` says when."""

    def __init__(
        self, ledger: Ledger, conn: sqlite3.Connection, policy: Durability, batches: BatchWriter, *,
        parts: tuple[SpaceGuard, ReplayWindow, GapLog, SeqAllocator], batch_max: int,
    ) -> None:  # fmt: skip
        self.ledger = ledger
        self.conn = conn  # the writer's own connection: only this thread writes
        self.policy = policy
        self.batches = batches
        self.space, self.window, self.gap_log, self.seqs = parts
        self.batch_max = batch_max
        self.thread: Supervised | None = None
        self.error: str | None = None  # the last failed commit, until one succeeds
        self.commits = 0
        self._forced = 0  # flush() calls waiting
        self._writing = False
        self._due_since: float | None = None  # deletes / refusals wait for a commit since then
        # drops and dead letters of the last minute, for status reasons (read anywhere, noted at each commit)
        self.recent_drops = Recent(RECENT_S, sum(ledger.n.dropped.values()))
        self.recent_dead = Recent(RECENT_S, ledger.n.dead_letters)

    def start(self, on_death: DeathHook | None = None) -> None:
        """Start the thread; `on_death(why)`: it died."""
        self.thread = Supervised("edged-spool-writer", target=self._loop, on_death=on_death)
        self.thread.start()

    def flush(self, timeout: float) -> bool:
        """Wait until everything appended (and acknowledged) so far is committed. True when it was."""
        deadline = time.monotonic() + timeout
        cond = self.ledger.cond
        with cond:
            self._forced += 1  # everything is due now, whatever batch_ms says
            cond.notify_all()
            try:
                while self._busy() and (left := deadline - time.monotonic()) > 0:
                    cond.wait(left)
                return not self._busy()
            finally:
                self._forced -= 1

    def wait_for_commit(self, after: int, timeout: float) -> int:
        """Block until a commit newer than `after` happened (or timeout); return the commit counter."""
        deadline = time.monotonic() + timeout
        with self.ledger.cond:
            while self.commits <= after and (left := deadline - time.monotonic()) > 0:
                self.ledger.cond.wait(left)
            return self.commits

    def due_soon(self) -> None:
        """Deletes or refusals wait (with `cond` held): wake the thread only to start its timer; waking it on
        every ack costs a thread switch each."""
        if self._due_since is None and self.ledger.outbox.has_due():
            self._due_since = time.monotonic()
            self.ledger.cond.notify_all()

    def stop(self, timeout: float) -> bool:
        """Commit what waits and end the thread; False when it is still committing after `timeout`."""
        with self.ledger.cond:
            self.ledger.closing = True
            self.ledger.cond.notify_all()
        if self.thread is None:
            return True
        self.thread.join(timeout=timeout)
        return not self.thread.is_alive()

    def _busy(self) -> bool:
        box = self.ledger.outbox
        return bool(box.pending or box.has_due() or self._writing or self.ledger.meta_dirty)

    def _loop(self) -> None:
        led = self.ledger
        while True:
            with led.cond:
                while not led.closing and (wait := self._wait_s()) != 0.0:
                    led.cond.wait(wait)
                box = led.outbox
                if led.closing:
                    box.flush_recent()  # a clean stop: the window's memory into its table, for the next start
                keep = set(box.acked)
                batch = box.take_batch(self.batch_max)
                led.sending_to_window = batch.sent  # in the commit now: still readable for a replay request
                # what this commit makes settled: rows after the batch stay pending (uncommitted)
                marks = led.marks(r for i, r in box.pending.items() if i > box.writing_upto)
                meta, led.meta_dirty = led.meta_dirty, False
                self._due_since = time.monotonic() if box.has_due() else None
                self._writing = bool(batch) or meta
                done = led.closing and not self._writing
            if self._writing:
                self._commit(batch, keep, marks)
            if done:
                return

    def _wait_s(self) -> float | None:
        """0 when a commit is due now, else how long until one will be (None: nothing waits): policy.py
        decides from what waits."""
        led, now = self.ledger, time.monotonic()
        box = led.outbox
        first = box.oldest_pending()
        return self.policy.commit_wait_s(
            urgent=led.meta_dirty or bool(self._forced and self._busy()),
            unacked=box.unacked_pending(),
            oldest_pending_age_s=led.clock() - first.clock if first is not None else None,
            changes_age_s=now - self._due_since if self._due_since is not None else None,
        )

    def _commit(self, batch: Batch, keep: set[int], marks: dict[str, int]) -> None:
        led, delay = self.ledger, 0.1
        while True:
            try:
                n = self.batches.write(self.conn, led.n, batch, keep=keep, marks=marks, clock=led.clock(),
                                       gaps=self.gap_log.entries)  # fmt: skip
                with led.cond:
                    self.error = None
                self.seqs.retry()
                break
            except sqlite3.Error as exc:
                if self.conn.in_transaction:
                    spooldb.rollback(self.conn)
                self.window.recount(self.conn)
                self._note_error(exc)
                if spooldb.is_disk_full(exc):
                    self.space.on_disk_full()
                # keep the batch in memory and retry: nothing is dropped here
                if led.closing and delay > 2.0:
                    log.exception("spool: giving up on %d uncommitted results at shutdown", len(batch.rows))
                    n = led.n
                    break
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
        self.recent_drops.note(sum(n.dropped.values()))
        self.recent_dead.note(n.dead_letters)
        with led.cond:
            led.n = n
            led.outbox.committed(batch)
            led.sending_to_window = []
            self.window.settle()
            self._writing = False
            self.commits += 1
            led.changes += 1
            led.cond.notify_all()

    def _note_error(self, exc: sqlite3.Error) -> None:
        msg = f"spool write failed: {exc} (disk full or read-only?); retrying, results are kept in memory"
        with self.ledger.cond:
            first = self.error is None
            self.error = msg
        if first:
            log.error("%s", msg)
