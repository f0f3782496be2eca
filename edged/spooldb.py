"""The spool's SQLite layer: schema, opening with an integrity check, and the statements of one commit.

Kept apart from `spool.py` (threads, batching, accounting) so that every SQL statement lives here.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from edged.errors import SpoolError

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
"""
SIDE_FILES = ("-wal", "-shm")
SQLITE_FULL = 13  # sqlite3.SQLITE_FULL from Python 3.11 on


class Row(NamedTuple):
    """One stored result, as the publisher sends it. `clock` is the spool clock at creation.

    A NamedTuple: a backlog is read a few hundred rows at a time, and tuples are the cheapest to build.
    """

    id: int
    pipeline: str
    seq: int
    ts: float
    clock: float
    topic: str
    payload: bytes


@dataclass(frozen=True)
class Pending:
    """A result waiting for the next commit."""

    pipeline: str
    seq: int
    ts: float
    topic: str
    payload: bytes


def connect(path: Path, sync: str) -> sqlite3.Connection:
    """Open (creating) the database in WAL mode with the schema; raises sqlite3.Error."""
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={'FULL' if sync == 'full' else 'NORMAL'}")
    # checkpoint every 500 pages (2 MB of WAL): big enough that a row acknowledged soon after it was
    # written is often deleted before its page reaches the main file, small enough that the WAL fits
    # in the spool's free-space reserve (min_free_bytes) on a small SD card
    conn.execute("PRAGMA wal_autocheckpoint=500")
    conn.execute("PRAGMA journal_size_limit=4194304")
    conn.executescript(SCHEMA)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
    return conn


def open_checked(path: Path, sync: str) -> tuple[sqlite3.Connection, Path | None]:
    """Open the spool; a database failing its integrity check is moved aside and a fresh one started.

    Returns the connection and, after a recovery, where the damaged files were moved.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
    except OSError as exc:
        raise SpoolError(f"cannot create {path.parent}: {exc.strerror}; check that state_dir is writable") from exc
    problem = _check(path, sync) if path.exists() else None
    moved: Path | None = None
    if problem is not None:
        moved = _move_aside(path)
        log.critical(
            "SPOOL DAMAGED: %s failed its integrity check (%s). Moved to %s for forensics; starting a fresh "
            "spool. Results only in the damaged file are not published.",
            path, problem, moved,
        )  # fmt: skip
    try:
        return connect(path, sync), moved
    except (sqlite3.Error, OSError) as exc:
        raise SpoolError(
            f"cannot open spool {path}: {exc}; check that state_dir is writable and the disk is not full"
        ) from exc


def _check(path: Path, sync: str) -> str | None:
    try:
        conn = connect(path, sync)
        try:
            result = [r[0] for r in conn.execute("PRAGMA quick_check")]
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        return str(exc)
    return None if result == ["ok"] else "; ".join(result[:3])


def _move_aside(path: Path) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%S")
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    path.rename(target)
    for suffix in SIDE_FILES:
        side = path.with_name(path.name + suffix)
        if side.exists():
            side.rename(target.with_name(target.name + suffix))
    return target


def salvage_seqs(damaged: Path) -> dict[str, int]:
    """Best effort: the sequence numbers a damaged spool still shows (so seq never goes back)."""
    out: dict[str, int] = {}
    with contextlib.suppress(sqlite3.Error):
        conn = sqlite3.connect(f"file:{damaged}?mode=ro", uri=True)
        try:
            for query in ("SELECT pipeline, last FROM seqs", "SELECT pipeline, MAX(seq) FROM results GROUP BY 1"):
                with contextlib.suppress(sqlite3.Error):
                    for pipeline, top in conn.execute(query):
                        out[pipeline] = max(out.get(pipeline, 0), int(top))
        finally:
            conn.close()
    return out


# -- reading state at start-up -------------------------------------------------------------------------


def load_state(conn: sqlite3.Connection) -> dict[str, Any]:
    """Sequence numbers, depth/bytes, dead letters, the persisted clock and drop counters."""
    seqs = {p: int(last) for p, last in conn.execute("SELECT pipeline, last FROM seqs")}
    for p, top in conn.execute("SELECT pipeline, MAX(seq) FROM results GROUP BY pipeline"):
        seqs[p] = max(seqs.get(p, 0), int(top))
    depth, size = conn.execute("SELECT COUNT(*), COALESCE(SUM(LENGTH(payload)), 0) FROM results").fetchone()
    (dead,) = conn.execute("SELECT COUNT(*) FROM dead_letters").fetchone()
    meta = dict(conn.execute("SELECT key, value FROM meta"))
    return {
        "seqs": seqs,
        "depth": int(depth),
        "bytes": int(size),
        "dead_letters": int(dead),
        "clock": float(meta.get("clock", 0.0)),
        "dropped": json.loads(meta.get("dropped", "{}")),
    }


# -- the statements of one commit ------------------------------------------------------------------------


def insert(conn: sqlite3.Connection, rows: list[Pending], clock: float) -> None:
    """Add results."""
    conn.executemany(
        "INSERT INTO results (pipeline, seq, ts, clock, topic, payload) VALUES (?, ?, ?, ?, ?, ?)",
        [(r.pipeline, r.seq, r.ts, clock, r.topic, r.payload) for r in rows],
    )


def save_seqs(conn: sqlite3.Connection, tops: dict[str, int]) -> None:
    """Persist the highest seq handed out per pipeline (stored or dropped)."""
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
REFUSED_ENOUGH = "SELECT id FROM results WHERE id IN (SELECT value FROM json_each(?)) AND tries >= ?"


def delete_ids(conn: sqlite3.Connection, ids: list[int]) -> tuple[int, int]:
    """Delete rows by id; (rows, payload bytes) actually deleted."""
    if not ids:
        return 0, 0
    arg = (json.dumps(ids),)
    count, size = conn.execute(SIZE_OF_IDS, arg).fetchone()
    conn.execute(DELETE_IDS, arg)
    return int(count), int(size)


def expire(conn: sqlite3.Connection, before_clock: float) -> tuple[int, int]:
    """Delete rows created before `before_clock` (spool clock); (rows, bytes).

    Rows are inserted in clock order, so the oldest row (by id, the primary key) tells in O(1) whether
    anything expired; the scan runs only then.
    """
    oldest = conn.execute("SELECT clock FROM results ORDER BY id LIMIT 1").fetchone()
    if oldest is None or float(oldest[0]) >= before_clock:
        return 0, 0
    count, size = conn.execute(
        "SELECT COUNT(*), COALESCE(SUM(LENGTH(payload)), 0) FROM results WHERE clock < ?", (before_clock,)
    ).fetchone()
    if count:
        conn.execute("DELETE FROM results WHERE clock < ?", (before_clock,))
    return int(count), int(size)


def evict_oldest(conn: sqlite3.Connection, need_bytes: int, keep: set[int]) -> tuple[int, int]:
    """Delete the oldest rows until at least `need_bytes` of payload are freed; (rows, bytes)."""
    ids: list[int] = []
    freed = 0
    for row_id, size in conn.execute("SELECT id, LENGTH(payload) FROM results ORDER BY id"):
        if freed >= need_bytes:
            break
        if row_id in keep:
            continue
        ids.append(int(row_id))
        freed += int(size)
    return delete_ids(conn, ids)


def refuse(conn: sqlite3.Connection, refusals: dict[int, str], limit: int) -> list[int]:
    """Count broker refusals; rows refused `limit` times are copied to dead_letters; their ids (the
    caller deletes them from results with `delete_ids`)."""
    if not refusals:
        return []
    conn.executemany("UPDATE results SET tries = tries + 1 WHERE id = ?", [(i,) for i in refusals])
    dead = [
        (int(i), refusals[int(i)])
        for (i,) in conn.execute(
            REFUSED_ENOUGH,
            (json.dumps(list(refusals)), limit),
        )
    ]
    now = time.time()
    for row_id, reason in dead:
        conn.execute(
            "INSERT INTO dead_letters (id, pipeline, seq, ts, topic, payload, tries, reason, dead_ts) "
            "SELECT id, pipeline, seq, ts, topic, payload, tries, ?, ? FROM results WHERE id = ?",
            (reason, now, row_id),
        )
    return [row_id for row_id, _ in dead]


def fetch(conn: sqlite3.Connection, after_id: int, limit: int) -> list[Row]:
    """Rows with id > after_id, oldest first."""
    cur = conn.execute(
        "SELECT id, pipeline, seq, ts, clock, topic, payload FROM results WHERE id > ? ORDER BY id LIMIT ?",
        (after_id, limit),
    )
    return list(map(Row._make, cur))  # column types are as stored: INTEGER, TEXT, REAL, BLOB (bytes)


def is_disk_full(exc: sqlite3.Error) -> bool:
    """SQLITE_FULL (or an I/O error caused by it)."""
    code = getattr(exc, "sqlite_errorcode", None)  # Python >= 3.11
    return code == SQLITE_FULL or "full" in str(exc).lower()
