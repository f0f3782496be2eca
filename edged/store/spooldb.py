"""The spool's SQLite layer: schema, opening with an integrity check, and the statements of one commit.

Kept apart from `spool.py` (threads, batching, accounting) so that every SQL statement lives here.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from edged.core.durable import fsync_dir, make_dirs
from edged.core.errors import SpoolError
from edged.store.policy import Durability

log = logging.getLogger(__name__)

SCHEMA_VERSION = 2
SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    pipeline TEXT NOT NULL,
    seq INTEGER NOT NULL,
    ts REAL NOT NULL,            -- capture time (wall clock), for reporting
    clock REAL NOT NULL,         -- spool clock at creation: only moves forward, drives the TTL
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    tries INTEGER NOT NULL DEFAULT 0   -- refusals by the broker so far
);
CREATE TABLE IF NOT EXISTS seqs (pipeline TEXT PRIMARY KEY, last INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS dead_letters (
    id INTEGER PRIMARY KEY,
    pipeline TEXT NOT NULL,
    seq INTEGER NOT NULL,
    ts REAL NOT NULL,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    tries INTEGER NOT NULL,
    reason TEXT NOT NULL,
    dead_ts REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS sent (   -- the replay window: results the broker acknowledged (window.py)
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    pipeline TEXT NOT NULL,
    seq INTEGER NOT NULL,
    ts REAL NOT NULL,
    clock REAL NOT NULL,         -- spool clock when it entered the window (acknowledged)
    topic TEXT NOT NULL,
    payload BLOB NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS sent_seq ON sent (pipeline, seq);
"""
SIDE_FILES = ("-wal", "-shm")
FILE_MODE = 0o640  # the spool: the daemon and its group (an operator in it may read results), nobody else
LOCK_WAIT_S = 60.0  # a spool another process holds locked is waited for this long at start
SQLITE_FULL = 13  # sqlite3.SQLITE_FULL from Python 3.11 on


class Row(NamedTuple):
    """One stored result, as the publisher sends it. `clock` is the spool clock at creation.

    A NamedTuple: a backlog is read a few hundred rows at a time, and tuples are the cheapest to build.
    """

    id: int
    stream: str  # the seq stream (`cam0/results`; the column is `pipeline`, as in older spools)
    seq: int
    ts: float
    clock: float
    topic: str
    payload: bytes
    tries: int = 0  # refusals by the broker so far


def connect(path: Path, policy: Durability, timeout: float = 30.0) -> sqlite3.Connection:
    """Open (creating) the database in WAL mode with the schema, fsync'd as `policy` says (policy.py);
    raises sqlite3.Error."""
    new = not path.exists()
    if new:  # its mode set here, whatever the umask: results are nobody else's to read (SQLite gives the WAL
        # and its index the database file's mode)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE))
        path.chmod(FILE_MODE)  # the umask may have taken bits from FILE_MODE too: exactly this mode
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=timeout)
    # a new file gives deleted pages back to the filesystem on request (see reclaim): a drained backlog
    # must not keep the disk full (an existing file keeps its mode; VACUUM would rewrite it whole)
    conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={policy.synchronous}")
    # checkpoint every 500 pages (2 MB of WAL): big enough that a row acknowledged soon after it was
    # written is often deleted before its page reaches the main file, small enough that the WAL fits
    # in the spool's free-space reserve (min_free_bytes) on a small SD card
    conn.execute("PRAGMA wal_autocheckpoint=500")
    conn.execute("PRAGMA journal_size_limit=4194304")
    conn.executescript(SCHEMA)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
    if new:
        # SQLite fsyncs the WAL's folder when it creates the WAL, not the main file's: a cut right after the
        # first start must not leave a WAL whose database file name was never made durable
        fsync_dir(path.parent)
    return conn


class Reader:
    """The spool's read connection, one user at a time: status, the uplink's fetch and replay requests read
    from different threads, beside the writer's own connection."""

    def __init__(self, path: Path, policy: Durability) -> None:
        self._conn = connect(path, policy)
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def use(self) -> Iterator[sqlite3.Connection]:
        """The connection, held for the `with` block."""
        with self._lock:
            yield self._conn

    def close(self) -> None:
        """Close the connection (after its last user)."""
        with self._lock:
            self._conn.close()


def open_checked(
    path: Path, policy: Durability, *, check: bool = True, lock_wait_s: float = LOCK_WAIT_S
) -> tuple[sqlite3.Connection, Path | None]:
    """Open the spool; a database failing its integrity check is moved aside and a fresh one started.

    `check=False` skips the integrity check (after a clean stop: reading a million-row file costs
    seconds). A database that another process holds locked is waited for, up to `lock_wait_s`, and then
    refused with SpoolError: a busy database is not a damaged one. Returns the connection and, after a
    recovery, where the damaged files were moved.
    """
    try:
        make_dirs(path.parent, 0o750)
    except OSError as exc:
        raise SpoolError(f"cannot create {path.parent}: {exc.strerror}; check that state_dir is writable") from exc
    problem = _check(path, policy, lock_wait_s) if path.exists() and check else None
    moved: Path | None = None
    if problem is not None:
        moved = _move_aside(path)
        log.critical(
            "SPOOL DAMAGED: %s failed its integrity check (%s). Moved to %s for forensics; starting a fresh "
            "spool. Results only in the damaged file are not published.",
            path, problem, moved,
        )  # fmt: skip
    try:
        return connect(path, policy), moved
    except (sqlite3.Error, OSError) as exc:
        raise SpoolError(
            f"cannot open spool {path}: {exc}; check that state_dir is writable and the disk is not full"
        ) from exc


def integrity_problem(conn: sqlite3.Connection) -> str | None:
    """None when `PRAGMA quick_check` is happy, else what it found (first three lines)."""
    result = [r[0] for r in conn.execute("PRAGMA quick_check")]
    return None if result == ["ok"] else "; ".join(result[:3])


def _check(path: Path, policy: Durability, lock_wait_s: float) -> str | None:
    deadline = time.monotonic() + lock_wait_s
    warned = False
    while True:
        try:
            conn = connect(path, policy, timeout=min(1.0, lock_wait_s))
            try:
                problem = integrity_problem(conn)
            finally:
                conn.close()
        except sqlite3.OperationalError as exc:
            if not is_busy(exc):
                return str(exc)
            if time.monotonic() >= deadline:
                raise SpoolError(
                    f"spool {path} is locked by another process ({exc}) for {lock_wait_s:.0f} s; "
                    "it is left as it is: stop whatever holds it (another edged? a backup?) and start again"
                ) from exc
            if not warned:
                log.warning("spool %s is locked by another process (%s); waiting up to %.0f s", path, exc, lock_wait_s)
                warned = True
            time.sleep(0.5)
            continue
        except sqlite3.DatabaseError as exc:
            return str(exc)
        return problem


def is_busy(exc: sqlite3.Error) -> bool:
    """SQLITE_BUSY / SQLITE_LOCKED: another connection holds a lock; waiting helps, moving the file aside does not."""
    code = getattr(exc, "sqlite_errorcode", None) or 0
    return code & 0xFF in (5, 6) or "locked" in str(exc).lower() or "busy" in str(exc).lower()


def _move_aside(path: Path) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%S")
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    path.rename(target)
    for suffix in SIDE_FILES:
        side = path.with_name(path.name + suffix)
        if side.exists():
            side.rename(target.with_name(target.name + suffix))
    fsync_dir(path.parent)  # the fresh spool must not come back beside the damaged one's name after a cut
    return target


def salvage(damaged: Path) -> tuple[dict[str, int], int, dict[str, int]]:
    """Best effort, from a damaged spool: its seqs (so seq never goes back), how many results it still
    held (counted as dropped: `quarantined`) and its drop counters (so they survive)."""
    seqs: dict[str, int] = {}
    unsent = 0
    dropped: dict[str, int] = {}
    with contextlib.suppress(sqlite3.Error):
        conn = sqlite3.connect(f"file:{damaged}?mode=ro", uri=True)
        try:
            for query in ("SELECT pipeline, last FROM seqs", "SELECT pipeline, MAX(seq) FROM results GROUP BY 1"):
                with contextlib.suppress(sqlite3.Error, TypeError, ValueError):
                    for pipeline, top in conn.execute(query):
                        seqs[pipeline] = max(seqs.get(pipeline, 0), int(top))
            with contextlib.suppress(sqlite3.Error, TypeError, ValueError):
                unsent = int(conn.execute("SELECT COUNT(*) FROM results").fetchone()[0])
            with contextlib.suppress(sqlite3.Error, TypeError, ValueError):
                row = conn.execute("SELECT value FROM meta WHERE key = 'dropped'").fetchone()
                dropped = {str(k): int(v) for k, v in json.loads(row[0]).items()} if row else {}
        finally:
            conn.close()
    return seqs, unsent, dropped


# -- reading state at start-up -------------------------------------------------------------------------


def load_state(conn: sqlite3.Connection) -> dict[str, Any]:
    """Sequence numbers, depth/bytes, dead letters, the persisted clock, drop counters, the next row id.

    O(1) in the backlog: depth, bytes and dead letters are kept in `meta` by every commit. A file from
    an older edged (no `counts`) is counted once, by a scan.
    """
    seqs = {p: int(last) for p, last in conn.execute("SELECT pipeline, last FROM seqs")}
    meta = dict(conn.execute("SELECT key, value FROM meta"))
    if "counts" in meta:
        depth, size, dead = json.loads(meta["counts"])
    else:
        for p, top in conn.execute("SELECT pipeline, MAX(seq) FROM results GROUP BY pipeline"):
            seqs[p] = max(seqs.get(p, 0), int(top))
        depth, size = conn.execute("SELECT COUNT(*), COALESCE(SUM(LENGTH(payload)), 0) FROM results").fetchone()
        (dead,) = conn.execute("SELECT COUNT(*) FROM dead_letters").fetchone()
    top_ids = [
        conn.execute("SELECT COALESCE(MAX(seq), 0) FROM sqlite_sequence WHERE name = 'results'").fetchone()[0],
        conn.execute("SELECT COALESCE(MAX(id), 0) FROM results").fetchone()[0],
        conn.execute("SELECT COALESCE(MAX(id), 0) FROM dead_letters").fetchone()[0],
    ]
    return {
        "seqs": seqs,
        "depth": int(depth),
        "bytes": int(size),
        "dead_letters": int(dead),
        "clock": float(json.loads(meta.get("clock", "0"))),
        "dropped": _known_drops(json.loads(meta.get("dropped", "{}"))),
        "uncertain": int(json.loads(meta.get("uncertain", "0"))) or _old_unclean(meta),
        "gaps": json.loads(meta.get("seq_gaps", "[]")),
        "next_id": max(int(t) for t in top_ids) + 1,
    }


def _known_drops(dropped: dict[str, int]) -> dict[str, int]:
    """Drops by reason, less `unclean_stop`: an older edged counted a gap's seqs there, which are uncertain."""
    return {k: v for k, v in dropped.items() if k != "unclean_stop"}


def _old_unclean(meta: dict[str, str]) -> int:
    return int(json.loads(meta.get("dropped", "{}")).get("unclean_stop", 0))


# -- the statements of one commit ------------------------------------------------------------------------


INSERT = "INSERT INTO results (id, pipeline, seq, ts, clock, topic, payload, tries) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"


def insert(conn: sqlite3.Connection, rows: list[Row]) -> None:
    """Add results, with the ids the outbox gave them."""
    conn.executemany(INSERT, rows)


def insert_dead(conn: sqlite3.Connection, rows: list[tuple[Row, str]]) -> None:
    """Results refused enough times before they were ever committed: straight to dead_letters."""
    now = time.time()
    conn.executemany(
        "INSERT OR REPLACE INTO dead_letters (id, pipeline, seq, ts, topic, payload, tries, reason, dead_ts) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [(r.id, r.stream, r.seq, r.ts, r.topic, r.payload, r.tries, why, now) for r, why in rows],
    )


def save_seqs(conn: sqlite3.Connection, tops: dict[str, int]) -> None:
    """Persist the settled mark per seq stream (every seq up to it stored, acknowledged or dropped); a mark
    never goes back."""
    conn.executemany(
        "INSERT INTO seqs (pipeline, last) VALUES (?, ?) "
        "ON CONFLICT(pipeline) DO UPDATE SET last = MAX(last, excluded.last)",
        list(tops.items()),
    )


def save_meta(conn: sqlite3.Connection, values: dict[str, Any]) -> None:
    """Persist small state (clock, counters) as JSON."""
    conn.executemany(
        "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        [(k, json.dumps(v)) for k, v in values.items()],
    )


# Id lists go in as one JSON array (json_each): the statement text never changes, so sqlite3's statement
# cache holds one entry instead of one per list length (each of those costs memory: seen +15 MiB).
SIZE_OF_IDS = (
    "SELECT COUNT(*), COALESCE(SUM(LENGTH(payload)), 0) FROM results WHERE id IN (SELECT value FROM json_each(?))"
)
DELETE_IDS = "DELETE FROM results WHERE id IN (SELECT value FROM json_each(?))"


def delete_ids(conn: sqlite3.Connection, ids: list[int]) -> tuple[int, int]:
    """Delete rows by id; (rows, payload bytes) actually deleted."""
    if not ids:
        return 0, 0
    arg = (json.dumps(ids),)
    count, size = conn.execute(SIZE_OF_IDS, arg).fetchone()
    conn.execute(DELETE_IDS, arg)
    return int(count), int(size)


# -- the replay window (window.py) ---------------------------------------------------------------------------

COPY_TO_SENT = (
    "INSERT OR REPLACE INTO sent (pipeline, seq, ts, clock, topic, payload) SELECT pipeline, seq, ts, ?, topic, "
    "payload FROM results WHERE id IN (SELECT value FROM json_each(?)) ORDER BY id"
)
INSERT_SENT = "INSERT OR REPLACE INTO sent (pipeline, seq, ts, clock, topic, payload) VALUES (?, ?, ?, ?, ?, ?)"
TRIM_WALK = 500  # window rows one trim step reads


def copy_to_sent(conn: sqlite3.Connection, ids: list[int], clock: float) -> None:
    """Committed results the broker acknowledged, copied into the window before their delete."""
    if ids:
        conn.execute(COPY_TO_SENT, (clock, json.dumps(ids)))


def insert_sent(conn: sqlite3.Connection, rows: list[Row]) -> None:
    """Results acknowledged before they were ever committed (the window's memory, at a clean stop), into the
    table; each row's `clock` is the spool clock of its acknowledgement."""
    conn.executemany(INSERT_SENT, [(r.stream, r.seq, r.ts, r.clock, r.topic, r.payload) for r in rows])


def sent_size(conn: sqlite3.Connection) -> tuple[int, int]:
    """(rows, payload bytes) in the window."""
    rows, size = conn.execute("SELECT COUNT(*), COALESCE(SUM(LENGTH(payload)), 0) FROM sent").fetchone()
    return int(rows), int(size)


def trim_sent(conn: sqlite3.Connection, before_clock: float, over_bytes: int) -> tuple[int, int]:
    """Delete the window's oldest rows: those that entered before `before_clock`, and then as many as free
    `over_bytes`; (rows, bytes) deleted. Rows enter in clock order: the walk stops at the first it keeps."""
    rows = size = 0
    while True:
        ids = []
        walked = conn.execute("SELECT id, clock, LENGTH(payload) FROM sent ORDER BY id LIMIT ?", (TRIM_WALK,))
        for row_id, clock, length in walked.fetchall():
            if clock >= before_clock and size >= over_bytes:
                break
            ids.append(int(row_id))
            size += int(length)
        if not ids:
            return rows, size
        conn.execute("DELETE FROM sent WHERE id IN (SELECT value FROM json_each(?))", (json.dumps(ids),))
        rows += len(ids)
        if len(ids) < TRIM_WALK:
            return rows, size


def sent_rows(  # noqa: PLR0917  (a range query)
    conn: sqlite3.Connection, pipeline: str, first: int, last: int, limit: int, since: float
) -> list[Row]:
    """The table's rows of one stream with first <= seq <= last that entered the window at spool clock `since`
    or later, by seq (id 0: not a spool row)."""
    cur = conn.execute(
        "SELECT pipeline, seq, ts, clock, topic, payload FROM sent WHERE pipeline = ? AND seq BETWEEN ? AND ? "
        "AND clock >= ? ORDER BY seq LIMIT ?",
        (pipeline, first, last, since, limit),
    )
    return [Row(0, p, int(s), float(t), float(c), str(tp), bytes(pl)) for p, s, t, c, tp, pl in cur]


def stream_rows(conn: sqlite3.Connection, pipeline: str, first: int, last: int, limit: int) -> list[Row]:
    """The spool's own rows (not the window's) of one stream with first <= seq <= last."""
    cur = conn.execute(
        "SELECT id, pipeline, seq, ts, clock, topic, payload, tries FROM results WHERE pipeline = ? AND seq "
        "BETWEEN ? AND ? LIMIT ?",
        (pipeline, first, last, limit),
    )
    return [Row(*r) for r in cur]


def acked_span(conn: sqlite3.Connection, pipeline: str, ids: list[int]) -> tuple[int, int] | None:
    """The lowest and highest seq of a stream among the spool's rows `ids` (acknowledged, their delete due)."""
    low, high = conn.execute(
        "SELECT MIN(seq), MAX(seq) FROM results WHERE pipeline = ? AND id IN (SELECT value FROM json_each(?))",
        (pipeline, json.dumps(ids)),
    ).fetchone()
    return None if low is None else (int(low), int(high))


def sent_span(conn: sqlite3.Connection, pipeline: str, since: float) -> tuple[int, int] | None:
    """The lowest and highest seq of a stream in the table that entered it at spool clock `since` or later."""
    low, high = conn.execute(
        "SELECT MIN(seq), MAX(seq) FROM sent WHERE pipeline = ? AND clock >= ?", (pipeline, since)
    ).fetchone()
    return None if low is None else (int(low), int(high))


EXPIRE_MAX = 5000  # rows one commit expires at most: the rest go in the next ones (a bounded transaction)


def expire(conn: sqlite3.Connection, before_clock: float, keep: set[int]) -> tuple[list[int], int]:
    """Delete rows created before `before_clock` (spool clock), oldest first; (ids, bytes).

    Rows are created in clock order, so the walk starts at the oldest row (by id, the primary key) and
    stops at the first one still alive: the cost is the rows expired, never the backlog.
    """
    return _delete_oldest(conn, keep, lambda clock, _freed: clock >= before_clock, EXPIRE_MAX)


def evict_oldest(conn: sqlite3.Connection, need_bytes: int, keep: set[int]) -> tuple[list[int], int]:
    """Delete the oldest rows until at least `need_bytes` of payload are freed; (ids, bytes)."""
    return _delete_oldest(conn, keep, lambda _clock, freed: freed >= need_bytes)


def _delete_oldest(
    conn: sqlite3.Connection, keep: set[int], stop: Callable[[float, int], bool], limit: int = -1
) -> tuple[list[int], int]:
    """Walk the rows oldest first, skipping `keep`, until `stop(row clock, bytes so far)`; delete what was
    walked. (ids, payload bytes) deleted."""
    ids: list[int] = []
    size = 0
    cur = conn.execute("SELECT id, clock, LENGTH(payload) FROM results ORDER BY id LIMIT ?", (limit,))
    for row_id, clock, length in cur:
        if stop(float(clock), size):
            break
        if row_id in keep:
            continue
        ids.append(int(row_id))
        size += int(length)
    cur.close()
    if ids:
        conn.execute(DELETE_IDS, (json.dumps(ids),))
    return ids, size


def save_tries(conn: sqlite3.Connection, tries: dict[int, int]) -> None:
    """Persist the broker's refusals per row (counted in memory the moment they happen)."""
    conn.executemany("UPDATE results SET tries = ? WHERE id = ?", [(t, i) for i, t in tries.items()])


def move_to_dead_letters(conn: sqlite3.Connection, dead: dict[int, str], tries: int) -> list[int]:
    """Copy committed rows to dead_letters (refused `tries` times); the ids that were there (the caller
    deletes them from results with `delete_ids`)."""
    now = time.time()
    moved = []
    for row_id, reason in dead.items():
        cur = conn.execute(
            "INSERT OR REPLACE INTO dead_letters (id, pipeline, seq, ts, topic, payload, tries, reason, dead_ts) "
            "SELECT id, pipeline, seq, ts, topic, payload, MAX(tries, ?), ?, ? FROM results WHERE id = ?",
            (tries, reason, now, row_id),
        )
        if cur.rowcount:
            moved.append(row_id)
    return moved


def fetch(conn: sqlite3.Connection, after_id: int, limit: int) -> list[Row]:
    """Rows with id > after_id, oldest first."""
    cur = conn.execute(
        "SELECT id, pipeline, seq, ts, clock, topic, payload, tries FROM results WHERE id > ? ORDER BY id LIMIT ?",
        (after_id, limit),
    )
    return list(map(Row._make, cur))  # column types are as stored: INTEGER, TEXT, REAL, BLOB (bytes)


def is_disk_full(exc: sqlite3.Error) -> bool:
    """SQLITE_FULL (or an I/O error caused by it)."""
    code = getattr(exc, "sqlite_errorcode", None)  # Python >= 3.11
    return code == SQLITE_FULL or "full" in str(exc).lower()


def space(conn: sqlite3.Connection) -> tuple[int, int]:
    """(file bytes, reusable bytes: pages on SQLite's freelist) of the main database file."""
    page = int(conn.execute("PRAGMA page_size").fetchone()[0])
    pages = int(conn.execute("PRAGMA page_count").fetchone()[0])
    free = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
    return pages * page, free * page


def reclaim(conn: sqlite3.Connection, pages: int) -> None:
    """Give up to `pages` freelist pages back to the filesystem (auto_vacuum=INCREMENTAL files only)."""
    conn.execute(f"PRAGMA incremental_vacuum({int(pages)})").fetchall()


def oldest_ts(conn: sqlite3.Connection) -> float | None:
    """The capture time of the oldest stored result, None when there is none."""
    row = conn.execute("SELECT ts FROM results ORDER BY id LIMIT 1").fetchone()
    return float(row[0]) if row else None


def begin(conn: sqlite3.Connection) -> None:
    """Start the writer's transaction (taking the write lock at once)."""
    conn.execute("BEGIN IMMEDIATE")


def commit(conn: sqlite3.Connection) -> None:
    """Commit the writer's transaction."""
    conn.execute("COMMIT")


def rollback(conn: sqlite3.Connection) -> None:
    """Roll the writer's transaction back."""
    conn.execute("ROLLBACK")
