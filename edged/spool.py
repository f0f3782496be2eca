"""The durable queue: SQLite in WAL mode. Results wait here until the broker acknowledged them.

One writer thread owns the write connection. It commits appends in small batches (per `batch_max`
results or `batch_ms` milliseconds, whichever comes first) and applies, in the same transactions, the
acknowledgements, the broker's refusals (dead letter after N), the TTL and the size bound. `seq` numbers
are allocated here and persisted, so they keep increasing across restarts (and across a recovery from
a damaged database).

Policies (all counted by reason, nothing disappears silently):
- `max_bytes` bounds the stored payload bytes; it shrinks to what the filesystem can hold while keeping
  `min_free_bytes` free. When full, `on_full: drop_oldest` evicts the oldest rows, `drop_newest` refuses
  the new ones.
- `max_age_s` (TTL) runs on the spool clock: monotonic time accumulated while edged runs, persisted.
  It never runs backwards, so a wall-clock jump (a Pi without RTC booting in 1970, then NTP) or a device
  switched off never expires results early; the capture time (`ts`) is for reporting only.
- A ballast file keeps room for SQLite to delete and checkpoint on a full disk (see diskspace.py).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edged import spooldb
from edged.diskspace import Ballast, free_bytes
from edged.errors import SpoolError
from edged.spooldb import Pending, Row

log = logging.getLogger(__name__)

__all__ = ["Row", "Spool", "SpoolLimits"]

SEQ_FLOOR_STEP = 10_000  # seq floors are persisted every this many results (see _raise_floor)
CLOCK_SAVE_S = 10.0  # the spool clock reaches the disk this often (a crash loses at most this much TTL)


@dataclass(frozen=True)
class SpoolLimits:
    """Bounds and policies; the defaults are the config's."""

    max_bytes: int = 256 * 2**20
    max_age_s: float = 7 * 86400.0
    on_full: str = "drop_oldest"
    min_free_bytes: int = 64 * 2**20
    ballast_bytes: int = 16 * 2**20
    dead_letter_after: int = 5


@dataclass
class _Counters:
    depth: int = 0
    bytes: int = 0
    dead_letters: int = 0
    dropped: dict[str, int] = field(default_factory=dict)

    def drop(self, reason: str, rows: int, size: int) -> None:
        if rows:
            self.dropped[reason] = self.dropped.get(reason, 0) + rows
            self.depth -= rows
            self.bytes -= size


class Spool:
    """Durable FIFO of results. Thread-safe: producers `append`, the publisher `fetch`es and `ack`s."""

    def __init__(
        self,
        path: Path,
        *,
        sync: str = "normal",
        batch_max: int = 128,
        batch_ms: int = 1000,
        queue_max: int = 1024,
        limits: SpoolLimits | None = None,
    ) -> None:
        self.path = path
        self.sync = sync
        self.batch_max = batch_max
        self.batch_s = batch_ms / 1000.0
        self.queue_max = queue_max
        self.limits = limits or SpoolLimits()
        self._cond = threading.Condition()
        self._pending: deque[Pending] = deque()
        self._acks: list[int] = []
        self._refusals: dict[int, str] = {}
        self._acked: set[int] = set()  # acknowledged, delete not yet committed
        self._acked_max = 0  # at least the highest id in _acked (0 when it is empty)
        self._first_wait: float | None = None
        self._writing = False  # the writer holds a batch it has not committed yet
        self._forced = 0  # flush() calls waiting
        self._closing = False
        self._seq_lock = threading.Lock()
        self._committed = threading.Condition()
        self._commits = 0
        self._writer: threading.Thread | None = None
        self._write_error: str | None = None
        self._disk_cap = self.limits.max_bytes
        self.ballast = Ballast(path.with_name(path.name + ".ballast"), self.limits.ballast_bytes)
        self._wconn, self.recovered_from = spooldb.open_checked(path, sync)
        self._rconn = spooldb.connect(path, sync)
        self._rlock = threading.Lock()
        state = spooldb.load_state(self._wconn)
        self._seq: dict[str, int] = state["seqs"]
        self._floor = self._read_floor_file()
        if self.recovered_from is not None:
            self._restore_seqs_after_recovery()
        self._n = _Counters(state["depth"], state["bytes"], state["dead_letters"], state["dropped"])
        self._clock_base = float(state["clock"])
        self._clock_saved = self._clock_base
        self._mono0 = time.monotonic()
        self.ballast.ensure(self.limits.min_free_bytes)
        if self._n.depth:
            log.info("spool %s holds %d results from before (%d bytes)", path, self._n.depth, self._n.bytes)

    def _restore_seqs_after_recovery(self) -> None:
        """Never hand out a seq again: salvage what the damaged file shows, else jump past the floor."""
        salvaged = spooldb.salvage_seqs(self.recovered_from) if self.recovered_from else {}
        floors = self._read_floor_file()
        for p in set(salvaged) | set(floors):
            self._seq[p] = max(salvaged.get(p, 0), floors.get(p, 0))
        log.warning("spool: sequence numbers continue from %s after the recovery", self._seq or "1")

    def _floor_file(self) -> Path:
        return self.path.with_name(self.path.name + ".seqfloor")

    def _read_floor_file(self) -> dict[str, int]:
        try:
            data = json.loads(self._floor_file().read_text(encoding="utf-8"))
            return {str(k): int(v) for k, v in data.items()}
        except (OSError, ValueError):
            return {}

    def clock(self) -> float:
        """The spool clock: seconds edged has been running, accumulated across restarts."""
        return self._clock_base + (time.monotonic() - self._mono0)

    # -- producers -------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the writer thread."""
        self._writer = threading.Thread(target=self._write_loop, name="edged-spool-writer", daemon=True)
        self._writer.start()

    def next_seq(self, pipeline: str) -> int:
        """The next sequence number of a pipeline (1, 2, ...; continues after a restart)."""
        with self._seq_lock:
            value = self._seq.get(pipeline, 0) + 1
            self._seq[pipeline] = value
            if value >= self._floor.get(pipeline, 0):
                self._raise_floor(pipeline, value)
            return value

    def _raise_floor(self, pipeline: str, value: int) -> None:
        """Write, outside the database, a seq that will not be reached for SEQ_FLOOR_STEP results.

        After a damaged database is replaced, seq restarts from this floor (a gap, never a reuse). One
        small write per SEQ_FLOOR_STEP results costs no flash wear worth counting.
        """
        self._floor[pipeline] = value + SEQ_FLOOR_STEP
        tmp = self._floor_file().with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(self._floor), encoding="utf-8")
            tmp.replace(self._floor_file())
        except OSError as exc:
            log.debug("spool: cannot write %s: %s", self._floor_file(), exc)

    def append(self, pipeline: str, seq: int, ts: float, topic: str, payload: bytes) -> None:
        """Queue a result for the next commit; blocks while the (small) hand-off queue is full."""
        with self._cond:
            while len(self._pending) >= self.queue_max and not self._closing:
                self._cond.wait(0.5)
            if self._closing:
                raise SpoolError("spool is closed")
            self._pending.append(Pending(pipeline, seq, ts, topic, payload))
            if self._first_wait is None or len(self._pending) >= self.batch_max:
                self._first_wait = self._first_wait or time.monotonic()
                self._cond.notify_all()  # the batch timer starts, or the batch is full

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything appended (and acknowledged) so far is committed. True when it was."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._forced += 1  # everything is due now, whatever batch_ms says
            self._cond.notify_all()
            try:
                while self._busy() and time.monotonic() < deadline:
                    self._cond.wait(0.05)
                return not self._busy()
            finally:
                self._forced -= 1

    def _busy(self) -> bool:
        return bool(self._pending or self._acks or self._refusals or self._writing)

    # -- publisher -------------------------------------------------------------------------------------

    def fetch(self, after_id: int, limit: int) -> list[Row]:
        """Committed rows with id > after_id, oldest first, skipping rows already acknowledged."""
        with self._cond:
            # only acknowledged rows past the cursor are in the way (after a reconnect); while draining,
            # every acknowledged row is behind it and nothing extra is read
            skip = {i for i in self._acked if i > after_id} if self._acked_max > after_id else set()
        with self._rlock:
            rows = spooldb.fetch(self._rconn, after_id, limit + len(skip))
        return [r for r in rows if r.id not in skip][:limit] if skip else rows

    def ack(self, row_ids: list[int]) -> None:
        """The broker acknowledged these rows: delete them in the next commit."""
        with self._cond:
            self._acks.extend(row_ids)
            self._acked.update(row_ids)
            if row_ids:
                self._acked_max = max(self._acked_max, *row_ids)
            self._due_soon()

    def refuse(self, row_id: int, reason: str) -> None:
        """The broker refused this row (a failure reason code); after N refusals it is dead-lettered."""
        with self._cond:
            self._refusals[row_id] = reason
            self._due_soon()

    def _due_soon(self) -> None:
        # wake the writer only to start its batch timer; waking it on every ack costs a thread switch each
        if self._first_wait is None:
            self._first_wait = time.monotonic()
            self._cond.notify_all()

    def ttl_offset(self) -> float:
        """`max_age` minus the spool clock now: a row has `row.clock + ttl_offset()` seconds left to live
        (MQTT 5 message expiry). One call serves a whole fetch: the publisher adds it to each row's clock."""
        return self.limits.max_age_s - self.clock()

    def wait_for_commit(self, after: int, timeout: float) -> int:
        """Block until a commit newer than `after` happened (or timeout); return the commit counter."""
        with self._committed:
            if self._commits <= after:
                self._committed.wait(timeout)
            return self._commits

    # -- status ----------------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """The `spool` entry of the status JSON."""
        with self._rlock:
            row = self._rconn.execute("SELECT ts FROM results ORDER BY id LIMIT 1").fetchone()
        with self._cond:
            n = self._n
            snapshot = {
                "depth": n.depth,
                "bytes": n.bytes,
                "oldest_age_s": round(max(0.0, time.time() - float(row[0])), 1) if row else 0.0,
                "dropped": sum(n.dropped.values()),
                "dropped_by_reason": dict(n.dropped),
                "dead_letters": n.dead_letters,
                "uncommitted": len(self._pending),
                "max_bytes": self._disk_cap,
                "error": self._write_error,
            }
        try:
            disk_free = free_bytes(self.path.parent)
        except OSError:
            disk_free = None
        snapshot |= {
            "disk_free_bytes": disk_free,
            "path": str(self.path),
            "recovered_from": str(self.recovered_from) if self.recovered_from else None,
        }
        return snapshot

    @property
    def depth(self) -> int:
        """Committed rows not yet acknowledged-and-deleted."""
        with self._cond:
            return self._n.depth - len(self._acked)

    # -- writer ----------------------------------------------------------------------------------------

    def _write_loop(self) -> None:
        while True:
            with self._cond:
                while not self._due() and not self._closing:
                    timeout = None
                    if self._first_wait is not None:
                        timeout = max(0.0, self._first_wait + self.batch_s - time.monotonic())
                    self._cond.wait(timeout)
                batch = [self._pending.popleft() for _ in range(min(len(self._pending), self.batch_max))]
                acks, self._acks = self._acks, []
                refusals, self._refusals = self._refusals, {}
                self._first_wait = time.monotonic() if (self._pending or self._acks) else None
                done = self._closing and not self._pending
                self._writing = bool(batch or acks or refusals)
                self._cond.notify_all()  # producers waiting for room
            if batch or acks or refusals:
                self._commit(batch, acks, refusals)
            if done:
                return

    def _due(self) -> bool:
        if len(self._pending) >= self.batch_max or (self._forced and self._busy()):
            return True
        if self._first_wait is None:
            return False
        return time.monotonic() - self._first_wait >= self.batch_s

    def _commit(self, batch: list[Pending], acks: list[int], refusals: dict[int, str]) -> None:
        delay = 0.1
        while True:
            try:
                self._transaction(batch, acks, refusals)
                break
            except sqlite3.Error as exc:
                if self._wconn.in_transaction:
                    self._wconn.execute("ROLLBACK")
                self._note_write_error(exc)
                if spooldb.is_disk_full(exc):
                    self._on_disk_full()
                # keep the batch in memory and retry: nothing is dropped here
                if self._closing and delay > 2.0:
                    log.exception("spool: giving up on %d uncommitted results at shutdown", len(batch))
                    break
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
        with self._cond:
            self._acked.difference_update(acks)
            if not self._acked:
                self._acked_max = 0
            self._writing = False
            self._cond.notify_all()
        with self._committed:
            self._commits += 1
            self._committed.notify_all()

    def _transaction(self, batch: list[Pending], acks: list[int], refusals: dict[int, str]) -> None:
        conn, limits, clock = self._wconn, self.limits, self.clock()
        n = _Counters(self._n.depth, self._n.bytes, self._n.dead_letters, dict(self._n.dropped))
        conn.execute("BEGIN IMMEDIATE")
        rows, size = spooldb.delete_ids(conn, acks)
        n.depth, n.bytes = n.depth - rows, n.bytes - size
        dead = spooldb.refuse(conn, refusals, limits.dead_letter_after)
        rows, size = spooldb.delete_ids(conn, dead)
        n.depth, n.bytes, n.dead_letters = n.depth - rows, n.bytes - size, n.dead_letters + rows
        n.drop("expired", *spooldb.expire(conn, clock - limits.max_age_s))
        admitted = self._make_room(conn, batch, n)
        spooldb.insert(conn, admitted, clock)
        n.depth += len(admitted)
        n.bytes += sum(len(r.payload) for r in admitted)
        tops: dict[str, int] = {}
        for r in batch:  # dropped results' seqs too: a seq is never handed out twice
            tops[r.pipeline] = max(tops.get(r.pipeline, 0), r.seq)
        spooldb.save_seqs(conn, tops)
        if n.dropped != self._n.dropped or clock - self._clock_saved >= CLOCK_SAVE_S:
            # one page fewer per commit: the clock is saved every CLOCK_SAVE_S (flash wear), counters on change
            spooldb.save_meta(conn, {"clock": clock, "dropped": n.dropped})
            self._clock_saved = clock
        conn.execute("COMMIT")
        with self._cond:
            self._n = n
            self._write_error = None
        if dead:
            log.error("spool: %d result(s) refused %d times moved to dead_letters", len(dead), limits.dead_letter_after)

    def _make_room(self, conn: sqlite3.Connection, batch: list[Pending], n: _Counters) -> list[Pending]:
        """Apply max_bytes (and the disk's own limit) to the batch with the on_full policy."""
        cap = self._capacity(n.bytes)
        incoming = sum(len(r.payload) for r in batch)
        if n.bytes + incoming <= cap:
            return batch
        if self.limits.on_full == "drop_oldest":
            with self._cond:
                keep = set(self._acked)
            n.drop("full_evicted_oldest", *spooldb.evict_oldest(conn, n.bytes + incoming - cap, keep))
            admitted = list(batch)
            while admitted and n.bytes + sum(len(r.payload) for r in admitted) > cap:
                admitted.pop(0)  # the batch alone is over the cap: its oldest go too
                n.dropped["full_evicted_oldest"] = n.dropped.get("full_evicted_oldest", 0) + 1
            return admitted
        admitted, room = [], cap - n.bytes
        for r in batch:
            if len(r.payload) <= room:
                admitted.append(r)
                room -= len(r.payload)
            else:
                n.dropped["full_rejected_newest"] = n.dropped.get("full_rejected_newest", 0) + 1
        return admitted

    def _capacity(self, stored: int) -> int:
        """max_bytes, lowered to what the filesystem holds while keeping min_free_bytes free.

        Asked at every commit (statvfs costs microseconds), so eviction starts before the disk is full.
        """
        try:
            free = free_bytes(self.path.parent)
        except OSError:
            return self._disk_cap
        if self._ballast_missing(free) and self.ballast.ensure(self.limits.min_free_bytes):
            log.info("spool: disk space is back; ballast file restored")
            free -= self.limits.ballast_bytes
        self._disk_cap = max(0, min(self.limits.max_bytes, stored + free - self.limits.min_free_bytes))
        return self._disk_cap

    def _ballast_missing(self, free: int) -> bool:
        size = self.limits.ballast_bytes
        return bool(size) and not self.ballast.present and free > 3 * size

    def _on_disk_full(self) -> None:
        """SQLite hit a full disk: release the ballast so the next try can delete and checkpoint."""
        if self.ballast.release():
            log.error("spool: disk full; released the %d-byte ballast to keep working", self.limits.ballast_bytes)

    def _note_write_error(self, exc: sqlite3.Error) -> None:
        msg = f"spool write failed: {exc} (disk full or read-only?); retrying, results are kept in memory"
        with self._cond:
            first = self._write_error is None
            self._write_error = str(exc)
        if first:
            log.error("%s", msg)

    def close(self) -> None:
        """Commit everything queued, stop the writer, close the database."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._writer is not None:
            self._writer.join(timeout=30)
        with self._rlock:
            self._rconn.close()
        self._wconn.close()
