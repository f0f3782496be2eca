"""What every ingest of a fleet shares for replay: the database (docs/fleet.md, "Replay with several ingests").

Several `edged ingest` processes in one shared group each see only the rows the broker handed them, so a seq
one of them did not see is, most of the time, a row another one wrote. The replayer (replayer.py) never asks a
device on its own view: it asks this shared state, on a connection of its own,

- `present`: which of the seqs it did not see are in the database (written by any ingest), for many streams in
  one query;
- `claim`: of what is really missing, the ranges no other ingest asked for lately, written down as asked
  (`replay_ranges`, with the client id) in the same transaction, under a lock per stream, so two ingests that
  find the same loss at the same moment ask for it once;
- `tops_below`: a stream this ingest forgot (idle, or new to it) is picked up again from the highest seq the
  database holds below the one that brought it back.

At steady state with one ingest none of this runs (it saw every seq); with several, one `present` query per
check (every `replay_after_s`) covers every stream due.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import zlib
from pathlib import Path
from typing import Any, Protocol

from edged.core.errors import IngestError

StreamKey = tuple[str, str]  # (device, pipeline)
Span = tuple[str, str, int, int]  # (device, pipeline, first, last)

# ranges not to ask for: asked lately by another ingest, or answered gone (to anyone)
CLAIMS_OVERLAPPING = (
    "SELECT first, last FROM replay_ranges WHERE device = {p} AND pipeline = {p} AND last >= {p} AND first <= {p} "
    "AND (outcome = 'gone' OR (outcome = 'asked' AND client IS NOT NULL AND client <> {p} AND ts > {p}))"
)
INSERT_ASKED = "INSERT INTO replay_ranges (device, pipeline, first, last, outcome, ts, client) VALUES ({p})"
PRESENT_IN = "SELECT seq FROM results WHERE device = {p} AND pipeline = {p} AND seq BETWEEN {p} AND {p}"


class ReplayState(Protocol):
    """The shared state as the replayer asks it (IngestError when the database is away)."""

    def present(self, spans: list[Span]) -> set[tuple[str, str, int]]:
        """Of the seqs in `spans`, those the database holds."""

    def tops_below(self, keys: list[tuple[str, str, int]]) -> dict[StreamKey, int | None]:
        """Per (device, pipeline, seq): the highest seq the database holds below `seq` (None: none)."""

    def claim(  # noqa: PLR0917  (one stream's claim)
        self, device: str, pipeline: str, ranges: list[tuple[int, int]], client: str, now: float, hold_s: float
    ) -> tuple[list[tuple[int, int]], list[int]]:
        """Of `ranges` of one stream, what is not in the database, was not asked for by another client within
        `hold_s` and was not answered gone: recorded as asked by `client` at `now`, and returned; and the seqs of
        `ranges` the database holds."""

    def close(self) -> None:
        """Close the connection."""


def subtract(ranges: list[tuple[int, int]], taken: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """`ranges` less every seq in `taken` (both lists of inclusive [first, last])."""
    out = list(ranges)
    for lo, hi in taken:
        nxt: list[tuple[int, int]] = []
        for a, b in out:
            if hi < a or lo > b:
                nxt.append((a, b))
                continue
            if a < lo:
                nxt.append((a, lo - 1))
            if hi < b:
                nxt.append((hi + 1, b))
        out = nxt
    return out


def as_ranges(seqs: list[int]) -> list[tuple[int, int]]:
    """Sorted distinct seqs as ranges."""
    out: list[list[int]] = []
    for seq in seqs:
        if out and seq == out[-1][1] + 1:
            out[-1][1] = seq
        else:
            out.append([seq, seq])
    return [(a, b) for a, b in out]


def _missing(
    ranges: list[tuple[int, int]], present: list[int], claimed: list[tuple[int, int]]
) -> list[tuple[int, int]]:
    return subtract(subtract(ranges, as_ranges(sorted(set(present)))), claimed)


def stream_lock(device: str, pipeline: str) -> int:
    """A 32-bit key for PostgreSQL's advisory lock of one stream's claims."""
    return zlib.crc32(f"{device}\x00{pipeline}".encode()) - 2**31


class SqliteReplayState:
    """The shared state in an SQLite file (its own connection: the writer's transactions are not disturbed)."""

    def __init__(self, path: Path) -> None:
        try:
            self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self.conn.execute("PRAGMA busy_timeout=10000")
        except sqlite3.Error as exc:
            raise IngestError(f"cannot open {path}: {exc}") from exc

    def present(self, spans: list[Span]) -> set[tuple[str, str, int]]:
        query = (
            "SELECT r.device, r.pipeline, r.seq FROM json_each(?) AS q CROSS JOIN results AS r "
            "WHERE r.device = json_extract(q.value, '$[0]') AND r.pipeline = json_extract(q.value, '$[1]') "
            "AND r.seq BETWEEN json_extract(q.value, '$[2]') AND json_extract(q.value, '$[3]')"
        )
        try:
            rows = self.conn.execute(query, (json.dumps(spans),)).fetchall()
        except sqlite3.Error as exc:
            raise IngestError(f"replay check: {exc}") from exc
        return {(str(d), str(p), int(s)) for d, p, s in rows}

    def tops_below(self, keys: list[tuple[str, str, int]]) -> dict[StreamKey, int | None]:
        query = (
            "SELECT json_extract(q.value, '$[0]'), json_extract(q.value, '$[1]'), (SELECT MAX(seq) FROM results AS r "
            "WHERE r.device = json_extract(q.value, '$[0]') AND r.pipeline = json_extract(q.value, '$[1]') "
            "AND r.seq < json_extract(q.value, '$[2]')) FROM json_each(?) AS q"
        )
        try:
            rows = self.conn.execute(query, (json.dumps(keys),)).fetchall()
        except sqlite3.Error as exc:
            raise IngestError(f"replay check: {exc}") from exc
        return {(str(d), str(p)): (int(t) if t is not None else None) for d, p, t in rows}

    def claim(  # noqa: PLR0917
        self, device: str, pipeline: str, ranges: list[tuple[int, int]], client: str, now: float, hold_s: float
    ) -> tuple[list[tuple[int, int]], list[int]]:
        if not ranges:
            return [], []
        lo, hi = min(a for a, _ in ranges), max(b for _, b in ranges)
        conn = self.conn
        try:
            conn.execute("BEGIN IMMEDIATE")  # one writer at a time across processes: the claim is atomic
            present = [int(s) for (s,) in conn.execute(PRESENT_IN.format(p="?"), (device, pipeline, lo, hi))]
            claimed = conn.execute(
                CLAIMS_OVERLAPPING.format(p="?"), (device, pipeline, lo, hi, client, now - hold_s)
            ).fetchall()
            present = [s for s in present if any(a <= s <= b for a, b in ranges)]
            missing = _missing(ranges, present, [(int(a), int(b)) for a, b in claimed])
            conn.executemany(INSERT_ASKED.format(p="?, ?, ?, ?, ?, ?, ?"),
                             [(device, pipeline, a, b, "asked", now, client) for a, b in missing])  # fmt: skip
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise IngestError(f"replay claim: {exc}") from exc
        return missing, present

    def close(self) -> None:
        self.conn.close()


class PostgresReplayState:
    """The shared state in PostgreSQL (its own connection; reconnects after the server restarted)."""

    PRESENT = (
        "SELECT r.device, r.pipeline, r.seq FROM unnest(%s::text[], %s::text[], %s::bigint[], %s::bigint[]) "
        "AS q(d, p, a, b) JOIN results r ON r.device = q.d AND r.pipeline = q.p AND r.seq BETWEEN q.a AND q.b"
    )
    TOPS = (
        "SELECT q.d, q.p, (SELECT MAX(r.seq) FROM results r WHERE r.device = q.d AND r.pipeline = q.p "
        "AND r.seq < q.s) FROM unnest(%s::text[], %s::text[], %s::bigint[]) AS q(d, p, s)"
    )

    def __init__(self, url: str) -> None:
        import psycopg  # noqa: PLC0415  (the postgresql extra)

        self.url = url
        self._psycopg = psycopg
        self.conn: Any = None

    def _connection(self) -> Any:
        if self.conn is None or self.conn.closed:
            self.conn = self._psycopg.connect(self.url, connect_timeout=10, autocommit=False)
        return self.conn

    def _run(self, what: str, work: Any) -> Any:
        try:
            conn = self._connection()
            with conn.transaction():
                return work(conn)
        except self._psycopg.Error as exc:
            self._drop()
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise IngestError(f"replay {what}: {first}") from exc

    def present(self, spans: list[Span]) -> set[tuple[str, str, int]]:
        if not spans:
            return set()
        cols = [list(c) for c in zip(*spans, strict=True)]
        rows = self._run("check", lambda c: c.execute(self.PRESENT, cols).fetchall())
        return {(str(d), str(p), int(s)) for d, p, s in rows}

    def tops_below(self, keys: list[tuple[str, str, int]]) -> dict[StreamKey, int | None]:
        if not keys:
            return {}
        cols = [list(c) for c in zip(*keys, strict=True)]
        rows = self._run("check", lambda c: c.execute(self.TOPS, cols).fetchall())
        return {(str(d), str(p)): (int(t) if t is not None else None) for d, p, t in rows}

    def claim(  # noqa: PLR0917
        self, device: str, pipeline: str, ranges: list[tuple[int, int]], client: str, now: float, hold_s: float
    ) -> tuple[list[tuple[int, int]], list[int]]:
        if not ranges:
            return [], []
        lo, hi = min(a for a, _ in ranges), max(b for _, b in ranges)

        def work(conn: Any) -> tuple[list[tuple[int, int]], list[int]]:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (stream_lock(device, pipeline),))
            present = [int(s) for (s,) in conn.execute(PRESENT_IN.format(p="%s"), (device, pipeline, lo, hi))]
            claimed = conn.execute(
                CLAIMS_OVERLAPPING.format(p="%s"), (device, pipeline, lo, hi, client, now - hold_s)
            ).fetchall()
            present = [s for s in present if any(a <= s <= b for a, b in ranges)]
            missing = _missing(ranges, present, [(int(a), int(b)) for a, b in claimed])
            with conn.cursor() as cur:
                cur.executemany(INSERT_ASKED.format(p="%s, %s, %s, %s, %s, %s, %s"),
                                [(device, pipeline, a, b, "asked", now, client) for a, b in missing])  # fmt: skip
            return missing, present

        result: tuple[list[tuple[int, int]], list[int]] = self._run("claim", work)
        return result

    def _drop(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(self._psycopg.Error):
                self.conn.close()
        self.conn = None

    def close(self) -> None:
        self._drop()


def open_replay_state(url: str) -> ReplayState:
    """The replayer's own connection to the ingest's database (`url` as `open_database` takes it)."""
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresReplayState(url)
    return SqliteReplayState(Path(url.removeprefix("sqlite:///").removeprefix("sqlite://")))
