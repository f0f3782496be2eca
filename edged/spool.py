"""The durable queue: SQLite in WAL mode. Results wait here until the broker acknowledged them.

One writer thread owns the write connection. It commits appends in small batches (per `batch_max`
results or `batch_ms` milliseconds, whichever comes first) and deletes acknowledged rows in the same
transactions. `seq` numbers are allocated here and persisted with the rows, so they keep increasing
across restarts even when every row was delivered.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edged.errors import SpoolError

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    pipeline TEXT NOT NULL,
    seq INTEGER NOT NULL,
    ts REAL NOT NULL,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS seqs (
    pipeline TEXT PRIMARY KEY,
    last INTEGER NOT NULL
);
"""


@dataclass(frozen=True)
class Row:
    """One stored result, as the publisher sends it."""

    id: int
    pipeline: str
    seq: int
    ts: float
    topic: str
    payload: bytes


@dataclass(frozen=True)
class _Pending:
    pipeline: str
    seq: int
    ts: float
    topic: str
    payload: bytes


class Spool:
    """Durable FIFO of results. Thread-safe: producers `append`, the publisher `fetch`es and `ack`s."""

    def __init__(
        self,
        path: Path,
        *,
        sync: str = "normal",
        batch_max: int = 32,
        batch_ms: int = 200,
        queue_max: int = 1024,
    ) -> None:
        self.path = path
        self.sync = sync
        self.batch_max = batch_max
        self.batch_s = batch_ms / 1000.0
        self.queue_max = queue_max
        self._cond = threading.Condition()
        self._pending: deque[_Pending] = deque()
        self._acks: list[int] = []
        self._acked: set[int] = set()  # acknowledged, delete not yet committed
        self._first_wait: float | None = None
        self._writing = False  # the writer holds a batch it has not committed yet
        self._forced = 0  # flush() calls waiting
        self._closing = False
        self._seq: dict[str, int] = {}
        self._seq_lock = threading.Lock()
        self._depth = 0
        self._bytes = 0
        self._committed = threading.Condition()
        self._commits = 0
        self._writer: threading.Thread | None = None
        self._write_error: str | None = None
        self._wconn = self._connect()
        self._rconn = self._connect()
        self._rlock = threading.Lock()
        self._load()

    def _connect(self) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
            conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={'FULL' if self.sync == 'full' else 'NORMAL'}")
            conn.executescript(SCHEMA)
        except (sqlite3.Error, OSError) as exc:
            raise SpoolError(
                f"cannot open spool {self.path}: {exc}; check that state_dir is writable and the disk is not full"
            ) from exc
        return conn

    def _load(self) -> None:
        cur = self._wconn.execute("SELECT pipeline, last FROM seqs")
        self._seq = {p: int(last) for p, last in cur}
        for p, top in self._wconn.execute("SELECT pipeline, MAX(seq) FROM results GROUP BY pipeline"):
            self._seq[p] = max(self._seq.get(p, 0), int(top))
        depth, size = self._wconn.execute("SELECT COUNT(*), COALESCE(SUM(LENGTH(payload)), 0) FROM results").fetchone()
        self._depth, self._bytes = int(depth), int(size)
        if self._depth:
            log.info("spool %s holds %d results from before (%d bytes)", self.path, self._depth, self._bytes)

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
            return value

    def append(self, pipeline: str, seq: int, ts: float, topic: str, payload: bytes) -> None:
        """Queue a result for the next commit; blocks while the (small) hand-off queue is full."""
        with self._cond:
            while len(self._pending) >= self.queue_max and not self._closing:
                self._cond.wait(0.5)
            if self._closing:
                raise SpoolError("spool is closed")
            self._pending.append(_Pending(pipeline, seq, ts, topic, payload))
            if self._first_wait is None:
                self._first_wait = time.monotonic()
            self._cond.notify_all()

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything appended so far is committed. True when it was."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._forced += 1  # everything is due now, whatever batch_ms says
            self._cond.notify_all()
            try:
                while (self._pending or self._acks or self._writing) and time.monotonic() < deadline:
                    self._cond.wait(0.05)
                return not (self._pending or self._acks or self._writing)
            finally:
                self._forced -= 1

    # -- publisher -------------------------------------------------------------------------------------

    def fetch(self, after_id: int, limit: int) -> list[Row]:
        """Committed rows with id > after_id, oldest first, skipping rows already acknowledged."""
        with self._cond:
            skip = set(self._acked)
        with self._rlock:
            cur = self._rconn.execute(
                "SELECT id, pipeline, seq, ts, topic, payload FROM results WHERE id > ? ORDER BY id LIMIT ?",
                (after_id, limit + len(skip)),
            )
            rows = [Row(int(i), p, int(s), float(t), tp, bytes(pl)) for i, p, s, t, tp, pl in cur]
        return [r for r in rows if r.id not in skip][:limit]

    def ack(self, row_ids: list[int]) -> None:
        """The broker acknowledged these rows: delete them in the next commit."""
        with self._cond:
            self._acks.extend(row_ids)
            self._acked.update(row_ids)
            if self._first_wait is None:
                self._first_wait = time.monotonic()
            self._cond.notify_all()

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
            pending = len(self._pending)
            depth, size, error = self._depth, self._bytes, self._write_error
        oldest_age = round(max(0.0, time.time() - float(row[0])), 1) if row else 0.0
        return {
            "depth": depth,
            "bytes": size,
            "oldest_age_s": oldest_age,
            "dropped": 0,
            "uncommitted": pending,
            "path": str(self.path),
            "error": error,
        }

    @property
    def depth(self) -> int:
        """Committed rows not yet acknowledged-and-deleted."""
        with self._cond:
            return self._depth - len(self._acked)

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
                self._first_wait = time.monotonic() if (self._pending or self._acks) else None
                done = self._closing and not self._pending
                self._writing = bool(batch or acks)
            if batch or acks:
                self._commit(batch, acks)
            if done:
                return

    def _due(self) -> bool:
        if len(self._pending) >= self.batch_max or (self._forced and (self._pending or self._acks)):
            return True
        if self._first_wait is None:
            return False
        return time.monotonic() - self._first_wait >= self.batch_s

    def _commit(self, batch: list[_Pending], acks: list[int]) -> None:
        conn = self._wconn
        delay = 0.1
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany(
                    "INSERT INTO results (pipeline, seq, ts, topic, payload) VALUES (?, ?, ?, ?, ?)",
                    [(b.pipeline, b.seq, b.ts, b.topic, b.payload) for b in batch],
                )
                tops: dict[str, int] = {}
                for b in batch:
                    tops[b.pipeline] = max(tops.get(b.pipeline, 0), b.seq)
                conn.executemany(
                    "INSERT INTO seqs (pipeline, last) VALUES (?, ?) ON CONFLICT(pipeline) "
                    "DO UPDATE SET last = MAX(last, excluded.last)",
                    list(tops.items()),
                )
                deleted_bytes = 0
                if acks:
                    placeholders = ",".join("?" * len(acks))
                    (deleted_bytes,) = conn.execute(
                        f"SELECT COALESCE(SUM(LENGTH(payload)), 0) FROM results WHERE id IN ({placeholders})",  # noqa: S608
                        acks,
                    ).fetchone()
                    cur = conn.execute(f"DELETE FROM results WHERE id IN ({placeholders})", acks)  # noqa: S608
                    deleted = cur.rowcount
                else:
                    deleted = 0
                conn.execute("COMMIT")
                break
            except sqlite3.Error as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                self._note_write_error(exc)
                # keep the batch in memory and retry: a full disk may free up; nothing is dropped here
                if self._closing and delay > 2.0:
                    log.exception("spool: giving up on %d uncommitted results at shutdown", len(batch))
                    with self._cond:
                        self._writing = False
                    return
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
        with self._cond:
            self._depth += len(batch) - deleted
            self._bytes += sum(len(b.payload) for b in batch) - int(deleted_bytes)
            self._acked.difference_update(acks)
            self._write_error = None
            self._writing = False
            self._cond.notify_all()
        with self._committed:
            self._commits += 1
            self._committed.notify_all()

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
