"""The ingest's database: results exactly once by (device, pipeline, seq), the devices' last stats messages.

A result stamped while its device's clock was not synchronized (core/clock.py) keeps what corrects it
(`clock_boot`, `clock_mono`) and `clock = 'unsynced'`; once the device's correction for that boot is here
(`clock_corrections`, from its clock message, whichever arrives first), `ts` becomes the true time, the
device's own stamp moves to `ts_original` and `clock` to 'corrected'. A result the device corrected before
sending arrives so.

Two back ends with one shape: SQLite (a file, the default) and PostgreSQL (`postgresql://...`, psycopg 3).
A write is one transaction: the results (duplicates ignored by the primary key) and the stats messages;
the caller acknowledges the MQTT messages only after it returned, so a crash between the two costs a
redelivery, which the primary key absorbs, never a lost row.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from edged.core.errors import IngestDataError, IngestError
from edged.fleet import quarantinedb


class ResultRow(NamedTuple):
    """One result as the database keeps it."""

    device: str
    pipeline: str
    seq: int
    ts: float
    body: str  # the result message, JSON
    ts_original: float | None = None  # the device's own stamp when its clock was not synchronized
    clock: str | None = None  # None: synchronized; 'unsynced' (not corrected yet) or 'corrected'
    clock_boot: str | None = None  # what corrects it: the device's boot id and CLOCK_BOOTTIME at capture
    clock_mono: float | None = None


SQLITE_INSERT = (
    "INSERT OR IGNORE INTO results (device, pipeline, seq, ts, body, ts_original, clock, clock_boot, clock_mono) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
# columns a database from an earlier version gets added at start: (table, column, type)
ADDED_COLUMNS = (("results", "ts_original", "DOUBLE PRECISION"), ("results", "clock", "TEXT"),
                 ("results", "clock_boot", "TEXT"), ("results", "clock_mono", "DOUBLE PRECISION"),
                 ("replay_ranges", "client", "TEXT"))  # fmt: skip
SCHEMA_LOCK = 0x6564_6765  # PostgreSQL advisory lock: one ingest at a time creates or upgrades the schema


class CorrectionRow(NamedTuple):
    """A device's clock correction: in boot `boot`, CLOCK_BOOTTIME `mono` was wall time `mono + offset`."""

    device: str
    boot: str
    mono: float
    offset: float


class StatsRow(NamedTuple):
    """A device's stats message (the latest one is kept)."""

    device: str
    ts: float
    body: str


@dataclass(frozen=True)
class Stream:
    """What the database holds of one (device, pipeline)."""

    device: str
    pipeline: str
    first: int
    last: int
    count: int

    @property
    def missing(self) -> int:
        """Seqs between the first and the last row that are not there."""
        return self.last - self.first + 1 - self.count


class GapRow(NamedTuple):
    """A device declared seqs `first`..`last` of one stream uncertain after an unclean stop (gaps topic)."""

    device: str
    pipeline: str
    first: int
    last: int
    body: str  # the gap message, JSON


class QuarantineRow(NamedTuple):
    """A message the ingest refused to land: kept with why, for an operator to look at (never retried)."""

    received: float  # when it arrived (epoch s)
    topic: str
    device: str | None  # the device its topic names (None where the topic names none)
    reason: str  # a short key: too_deep, not_json, out_of_range, identity_mismatch, db_refused, ...
    detail: str  # what was wrong, one line
    size: int  # the message's length in bytes
    payload: bytes  # its first QUARANTINE_KEEP_BYTES bytes, as they came


class ReplayRow(NamedTuple):
    """A range the ingest asked a device for, or one the device said is gone (replayer.py)."""

    device: str
    pipeline: str
    first: int
    last: int
    outcome: str  # asked | gone
    ts: float


QUARANTINE_KEEP_BYTES = 65_536  # of each refused message (its length is kept whole in `size`)


class Gap(NamedTuple):
    """Seqs `first`..`last` of one stream are missing."""

    device: str
    pipeline: str
    first: int
    last: int


SCHEMA = (
    "CREATE TABLE IF NOT EXISTS results (device TEXT NOT NULL, pipeline TEXT NOT NULL, seq BIGINT NOT NULL, "
    "ts DOUBLE PRECISION NOT NULL, body {json} NOT NULL, PRIMARY KEY (device, pipeline, seq))",
    # the corrections of devices' clocks (clock messages), and the results waiting for one
    "CREATE TABLE IF NOT EXISTS clock_corrections (device TEXT NOT NULL, boot TEXT NOT NULL, "
    "mono DOUBLE PRECISION NOT NULL, wall_offset DOUBLE PRECISION NOT NULL, PRIMARY KEY (device, boot, mono))",
    "CREATE TABLE IF NOT EXISTS device_stats (device TEXT PRIMARY KEY, ts DOUBLE PRECISION NOT NULL, "
    "body {json} NOT NULL)",
    "CREATE TABLE IF NOT EXISTS declared_gaps (device TEXT NOT NULL, pipeline TEXT NOT NULL, first BIGINT NOT NULL, "
    "last BIGINT NOT NULL, body {json} NOT NULL, PRIMARY KEY (device, pipeline, first, last))",
    "CREATE TABLE IF NOT EXISTS quarantine (received DOUBLE PRECISION NOT NULL, topic TEXT NOT NULL, device TEXT, "
    "reason TEXT NOT NULL, detail TEXT NOT NULL, size BIGINT NOT NULL, payload {blob} NOT NULL)",
    # the replayer's record (replayer.py): ranges asked for (by which ingest), ranges the device said are gone
    "CREATE TABLE IF NOT EXISTS replay_ranges (device TEXT NOT NULL, pipeline TEXT NOT NULL, first BIGINT NOT NULL, "
    "last BIGINT NOT NULL, outcome TEXT NOT NULL, ts DOUBLE PRECISION NOT NULL, client TEXT)",
    quarantinedb.SCHEMA,  # what the quarantine's bounds took out, per device
)
# after the columns are there (a database from before they were gets them added: `_add_clock_columns`)
INDEXES = (
    "CREATE INDEX IF NOT EXISTS results_unsynced ON results (device, clock_boot, clock_mono) WHERE clock = 'unsynced'",
    "CREATE INDEX IF NOT EXISTS replay_ranges_stream ON replay_ranges (device, pipeline)",
)
INSERT_REPLAY = "INSERT INTO replay_ranges (device, pipeline, first, last, outcome, ts) VALUES ({p})"
# a clock message is the device's whole list for the boots it names: it replaces what was kept of them (so a
# later, consistent message undoes a forged one), and the rows of those boots are corrected again from it
FORGET_CORRECTIONS = "DELETE FROM clock_corrections WHERE device = {p} AND boot = {p}"
INSERT_CORRECTION = "INSERT INTO clock_corrections VALUES ({p}, {p}, {p}, {p}) ON CONFLICT DO NOTHING"
# a result takes the first correction of its boot at or after its capture; what the device stamped stays in
# ts_original (set once: a second correction starts from the device's own stamp, not from the first correction)
CORRECT = (
    "UPDATE results SET ts_original = COALESCE(ts_original, ts), ts = clock_mono + (SELECT c.wall_offset FROM "
    "clock_corrections c WHERE c.device = results.device AND c.boot = results.clock_boot AND c.mono >= "
    "results.clock_mono ORDER BY c.mono LIMIT 1), clock = 'corrected' WHERE device = {p} AND clock_boot = {p} AND "
    "clock IN ('unsynced', 'corrected') AND clock_mono IS NOT NULL AND EXISTS (SELECT 1 FROM clock_corrections c "
    "WHERE c.device = results.device AND c.boot = results.clock_boot AND c.mono >= results.clock_mono)"
)
CLOCKS = "SELECT device, clock, COUNT(*) FROM results WHERE clock IS NOT NULL GROUP BY 1, 2 ORDER BY 1, 2"
# rows that arrived in a range asked for (recovered by a replay), and the seqs devices said are gone, per device
RECOVERED = (
    "SELECT device, COUNT(*) FROM (SELECT DISTINCT r.device, r.pipeline, r.seq FROM replay_ranges a JOIN results r "
    "ON r.device = a.device AND r.pipeline = a.pipeline AND r.seq BETWEEN a.first AND a.last "
    "WHERE a.outcome = 'asked') AS x GROUP BY device"
)
GONE = (
    "SELECT device, SUM(last - first + 1) FROM (SELECT DISTINCT device, pipeline, first, last FROM replay_ranges "
    "WHERE outcome = 'gone') AS g GROUP BY device"
)
QUARANTINED = "SELECT COALESCE(device, ''), reason, COUNT(*) FROM quarantine GROUP BY 1, 2 ORDER BY 1, 2"
DECLARED = "SELECT device, pipeline, first, last FROM declared_gaps ORDER BY 1, 2, 3"
STREAMS = "SELECT device, pipeline, MIN(seq), MAX(seq), COUNT(*) FROM results GROUP BY device, pipeline ORDER BY 1, 2"
# every missing range, from the rows themselves (the report is computed, never a counter that can drift)
GAPS = (
    "SELECT device, pipeline, prev + 1, seq - 1 FROM (SELECT device, pipeline, seq, "
    "LAG(seq) OVER (PARTITION BY device, pipeline ORDER BY seq) AS prev FROM results) AS g "
    "WHERE seq > prev + 1 ORDER BY 1, 2, 3"
)


@dataclass
class IngestBatch:
    """What one transaction of the ingest writes."""

    rows: list[ResultRow] = field(default_factory=list)  # results (a key already there is ignored)
    stats: list[StatsRow] = field(default_factory=list)  # upserted: the newest per device wins
    gaps: list[GapRow] = field(default_factory=list)  # gaps the devices declared
    quarantine: list[QuarantineRow] = field(default_factory=list)  # messages refused, kept for a look
    replays: list[ReplayRow] = field(default_factory=list)  # what was asked for again, what was gone
    corrections: list[CorrectionRow] = field(default_factory=list)  # applied to the rows they correct
    quarantine_rows: int = 1000  # refused messages kept per device at most (quarantinedb.py)
    quarantine_bytes: int = 64 * 2**20  # ... and their bytes in all


class Database(Protocol):
    """What the ingest needs of a database."""

    url: str

    def write(self, batch: IngestBatch) -> int:
        """Insert the rows, declared gaps (existing keys ignored), quarantined messages, replay records and clock
        corrections (applied to the rows they correct), and upsert the stats in one transaction; rows inserted.
        IngestDataError when the database refuses the data itself (retrying the same batch cannot help),
        IngestError when it is away."""

    def quarantined(self) -> dict[str, dict[str, int]]:
        """Quarantined messages per device ('' for a topic that names none), by reason."""

    def replays(self) -> dict[str, dict[str, int]]:
        """Per device: results recovered by a replay request, seqs the device said are gone."""

    def streams(self) -> list[Stream]:
        """Per (device, pipeline): first and last seq, rows held."""

    def gaps(self) -> list[Gap]:
        """Every missing seq range between a stream's first and last row."""

    def declared(self) -> list[Gap]:
        """The seq ranges devices declared uncertain after an unclean stop."""

    def device_stats(self) -> dict[str, dict[str, Any]]:
        """The last stats message of each device."""

    def clocks(self) -> dict[str, dict[str, int]]:
        """Per device: results stamped while its clock was not synchronized, 'unsynced' (no correction yet)
        and 'corrected'."""

    def count(self) -> int:
        """Rows in the results table."""

    def close(self) -> None:
        """Close the connection."""


def _quarantine_dict(rows: list[tuple[Any, ...]], dropped: list[tuple[Any, ...]]) -> dict[str, dict[str, int]]:
    """Per device: the refused messages kept, by reason, and `dropped_oldest`: those the bounds took out."""
    out: dict[str, dict[str, int]] = {}
    for device, reason, count in rows:
        out.setdefault(str(device), {})[str(reason)] = int(count)
    for device, count in dropped:
        out.setdefault(str(device), {})["dropped_oldest"] = int(count)
    return out


def _replay_dict(recovered: list[tuple[Any, ...]], gone: list[tuple[Any, ...]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for device, count in recovered:
        out.setdefault(str(device), {"recovered": 0, "gone": 0})["recovered"] = int(count)
    for device, count in gone:
        out.setdefault(str(device), {"recovered": 0, "gone": 0})["gone"] = int(count)
    return out


def _touched(rows: list[ResultRow], corrections: list[CorrectionRow]) -> set[tuple[str, str]]:
    """The (device, boot) pairs whose rows a write may correct."""
    return {(r.device, r.clock_boot) for r in rows if r.clock == "unsynced" and r.clock_boot is not None} | {
        (c.device, c.boot) for c in corrections
    }


def _clock_dict(rows: list[tuple[Any, ...]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for device, clock, count in rows:
        out.setdefault(str(device), {"unsynced": 0, "corrected": 0})[str(clock)] = int(count)
    return out


def _stats_dict(rows: list[tuple[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {}
    for device, body in rows:
        out[device] = body if isinstance(body, dict) else json.loads(body)
    return out


class SqliteDatabase:
    """Results in an SQLite file (WAL; FULL sync: an acknowledged message's row survives a power cut)."""

    def __init__(self, path: Path) -> None:
        self.url = str(path)
        try:
            self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=FULL")
            self.conn.execute("PRAGMA busy_timeout=10000")
            self.conn.execute("BEGIN IMMEDIATE")  # two ingests starting together: one creates, the other waits
            for statement in SCHEMA:
                self.conn.execute(statement.format(json="TEXT", blob="BLOB"))
            for table, column, kind in ADDED_COLUMNS:
                have = {row[1] for row in self.conn.execute(f"PRAGMA table_info({table})")}
                if column not in have:  # a database from an earlier version
                    self.conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
            for statement in INDEXES:
                self.conn.execute(statement)
            self.conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise IngestError(f"cannot open {path}: {exc}") from exc

    def write(self, batch: IngestBatch) -> int:
        conn, b = self.conn, batch
        try:
            conn.execute("BEGIN IMMEDIATE")
            before = conn.total_changes
            conn.executemany(SQLITE_INSERT, b.rows)
            inserted = conn.total_changes - before
            conn.executemany(FORGET_CORRECTIONS.format(p="?"), {(c.device, c.boot) for c in b.corrections})
            conn.executemany(INSERT_CORRECTION.format(p="?"), b.corrections)
            conn.executemany(CORRECT.replace("{p}", "?"), _touched(b.rows, b.corrections))
            conn.executemany("INSERT OR IGNORE INTO declared_gaps VALUES (?, ?, ?, ?, ?)", b.gaps)
            conn.executemany("INSERT INTO quarantine VALUES (?, ?, ?, ?, ?, ?, ?)", b.quarantine)
            if b.quarantine:
                quarantinedb.trim(lambda sql, args: conn.execute(sql, args).fetchall(), "?", ("rowid", "?"),
                                  {q.device for q in b.quarantine}, b.quarantine_rows, b.quarantine_bytes)  # fmt: skip
            conn.executemany(INSERT_REPLAY.format(p="?, ?, ?, ?, ?, ?"), b.replays)
            conn.executemany(
                "INSERT INTO device_stats VALUES (?, ?, ?) ON CONFLICT (device) DO UPDATE "
                "SET ts = excluded.ts, body = excluded.body WHERE excluded.ts >= device_stats.ts",
                b.stats,
            )
            conn.execute("COMMIT")
        except (sqlite3.Error, OverflowError, ValueError) as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            data = isinstance(exc, OverflowError | ValueError | sqlite3.DataError | sqlite3.IntegrityError)
            raise (IngestDataError if data else IngestError)(f"{self.url}: {exc}") from exc
        return inserted

    def quarantined(self) -> dict[str, dict[str, int]]:
        return _quarantine_dict(self.conn.execute(QUARANTINED).fetchall(),
                                self.conn.execute(quarantinedb.DROPPED).fetchall())  # fmt: skip

    def replays(self) -> dict[str, dict[str, int]]:
        return _replay_dict(self.conn.execute(RECOVERED).fetchall(), self.conn.execute(GONE).fetchall())

    def streams(self) -> list[Stream]:
        return [Stream(*row) for row in self.conn.execute(STREAMS)]

    def gaps(self) -> list[Gap]:
        return [Gap(*row) for row in self.conn.execute(GAPS)]

    def declared(self) -> list[Gap]:
        return [Gap(*row) for row in self.conn.execute(DECLARED)]

    def device_stats(self) -> dict[str, dict[str, Any]]:
        return _stats_dict(self.conn.execute("SELECT device, body FROM device_stats").fetchall())

    def clocks(self) -> dict[str, dict[str, int]]:
        return _clock_dict(self.conn.execute(CLOCKS).fetchall())

    def count(self) -> int:
        return int(self.conn.execute("SELECT COUNT(*) FROM results").fetchone()[0])

    def close(self) -> None:
        self.conn.close()


class PostgresDatabase:
    """Results in PostgreSQL (psycopg 3): per batch one COPY and one INSERT, in one transaction."""

    # COPY into a temporary table, then one INSERT ... ON CONFLICT: COPY is psycopg's fastest path (about
    # twice the rows/s of INSERT ... SELECT FROM unnest(arrays), whose array quoting runs in Python)
    INCOMING = (
        "CREATE TEMPORARY TABLE IF NOT EXISTS incoming (device TEXT, pipeline TEXT, seq BIGINT, "
        "ts DOUBLE PRECISION, body TEXT, ts_original DOUBLE PRECISION, clock TEXT, clock_boot TEXT, "
        "clock_mono DOUBLE PRECISION) ON COMMIT DELETE ROWS"
    )
    INSERT = (
        "INSERT INTO results (device, pipeline, seq, ts, body, ts_original, clock, clock_boot, clock_mono) "
        "SELECT device, pipeline, seq, ts, body::jsonb, ts_original, clock, clock_boot, clock_mono FROM incoming "
        "ON CONFLICT DO NOTHING"
    )
    INSERT_GAP = "INSERT INTO declared_gaps VALUES (%s, %s, %s, %s, %s::jsonb) ON CONFLICT DO NOTHING"
    INSERT_QUARANTINE = "INSERT INTO quarantine VALUES (%s, %s, %s, %s, %s, %s, %s)"
    UPSERT_STATS = (
        "INSERT INTO device_stats VALUES (%s, %s, %s::jsonb) ON CONFLICT (device) DO UPDATE "
        "SET ts = excluded.ts, body = excluded.body WHERE excluded.ts >= device_stats.ts"
    )

    def __init__(self, url: str) -> None:
        try:
            import psycopg  # noqa: PLC0415  (the postgresql extra; SQLite needs nothing)
        except ImportError as exc:
            raise IngestError("PostgreSQL needs psycopg: pip install 'edged[postgresql]'") from exc
        self.url = url
        self._psycopg = psycopg
        self.conn: Any = None
        self._connect()

    def _connect(self) -> None:
        psycopg = self._psycopg
        try:
            self.conn = psycopg.connect(self.url, connect_timeout=10)
            with self.conn.transaction():
                # CREATE TABLE IF NOT EXISTS is not safe against itself: two ingests starting together on a fresh
                # database could both create a table's type (pg_type_typname_nsp_index); one at a time
                self.conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
                for statement in SCHEMA:
                    self.conn.execute(statement.format(json="JSONB", blob="BYTEA"))
                for table, column, kind in ADDED_COLUMNS:  # a database from an earlier version gets them
                    self.conn.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} {kind}")
                for statement in INDEXES:
                    self.conn.execute(statement)
                self.conn.execute(self.INCOMING)
        except psycopg.Error as exc:
            self.conn = None
            raise IngestError(f"cannot open the PostgreSQL database: {_safe(exc)}") from exc

    def write(self, batch: IngestBatch) -> int:
        psycopg, b = self._psycopg, batch
        try:
            if self.conn is None or self.conn.closed:
                self._connect()  # the server restarted: a fresh connection, the batch again
            with self.conn.transaction():
                inserted = 0
                if b.rows:
                    with self.conn.cursor() as cur:
                        with cur.copy("COPY incoming FROM STDIN") as copy:
                            for row in b.rows:
                                copy.write_row(row)
                        inserted = cur.execute(self.INSERT).rowcount
                for stat in b.stats:
                    self.conn.execute(self.UPSERT_STATS, stat)
                for gap in b.gaps:
                    self.conn.execute(self.INSERT_GAP, gap)
                _pg_quarantine(self.conn, self.INSERT_QUARANTINE, b)
                for replay in b.replays:
                    self.conn.execute(INSERT_REPLAY.format(p="%s, %s, %s, %s, %s, %s"), replay)
                self._correct(b.rows, b.corrections)
        except (psycopg.DataError, psycopg.IntegrityError, OverflowError, ValueError) as exc:
            # the server refused the data (a NUL in jsonb, a number out of range): the connection is fine, and
            # the same batch would be refused again; the ingest isolates the message and quarantines it
            raise IngestDataError(f"PostgreSQL refused the data: {_safe(exc)}") from exc
        except psycopg.Error as exc:
            self._drop_connection()
            raise IngestError(f"PostgreSQL: {_safe(exc)}") from exc
        return int(inserted)

    def _correct(self, rows: list[ResultRow], corrections: list[CorrectionRow]) -> None:
        """Store the corrections (each message replacing its boots' lists) and apply them to the rows they
        correct (in the open transaction)."""
        for pair in {(c.device, c.boot) for c in corrections}:
            self.conn.execute(FORGET_CORRECTIONS.format(p="%s"), pair)
        for correction in corrections:
            self.conn.execute(INSERT_CORRECTION.format(p="%s"), correction)
        for pair in _touched(rows, corrections):
            self.conn.execute(CORRECT.replace("{p}", "%s"), pair)

    def quarantined(self) -> dict[str, dict[str, int]]:
        return _quarantine_dict(self._query(QUARANTINED), self._query(quarantinedb.DROPPED))

    def replays(self) -> dict[str, dict[str, int]]:
        return _replay_dict(self._query(RECOVERED), self._query(GONE))

    def _drop_connection(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(self._psycopg.Error):
                self.conn.close()
        self.conn = None

    def _query(self, sql: str) -> list[tuple[Any, ...]]:
        if self.conn is None or self.conn.closed:
            self._connect()
        with self.conn.transaction():
            return list(self.conn.execute(sql).fetchall())

    def streams(self) -> list[Stream]:
        return [Stream(*row) for row in self._query(STREAMS)]

    def gaps(self) -> list[Gap]:
        return [Gap(*row) for row in self._query(GAPS)]

    def declared(self) -> list[Gap]:
        return [Gap(*row) for row in self._query(DECLARED)]

    def device_stats(self) -> dict[str, dict[str, Any]]:
        return _stats_dict([(d, b) for d, b in self._query("SELECT device, body FROM device_stats")])

    def clocks(self) -> dict[str, dict[str, int]]:
        return _clock_dict(self._query(CLOCKS))

    def count(self) -> int:
        return int(self._query("SELECT COUNT(*) FROM results")[0][0])

    def close(self) -> None:
        self._drop_connection()


def _pg_quarantine(conn: Any, insert: str, b: IngestBatch) -> None:
    """PostgreSQL: the refused messages, within the quarantine's bounds (in the open transaction)."""
    for refused in b.quarantine:
        conn.execute(insert, refused)
    if not b.quarantine:
        return

    def run(sql: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        cur = conn.execute(sql, args)
        return list(cur.fetchall()) if cur.description is not None else []

    quarantinedb.trim(run, "%s", ("ctid", "%s::tid"), {q.device for q in b.quarantine}, b.quarantine_rows,
                      b.quarantine_bytes)  # fmt: skip


def _safe(exc: Exception) -> str:
    """The first line of a driver error (never the connection string: it may hold a password)."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def open_database(url: str) -> Database:
    """`postgresql://...` (or `postgres://`) opens PostgreSQL; anything else is an SQLite file path."""
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresDatabase(url)
    path = Path(url.removeprefix("sqlite:///").removeprefix("sqlite://"))
    path.parent.mkdir(parents=True, exist_ok=True)
    return SqliteDatabase(path)
