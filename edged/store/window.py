"""The replay window: results the broker acknowledged, kept a while for a consumer's replay request.

A PUBACK is the broker's word, held in its memory: a broker that crashes (or a bridge, or a cluster node)
loses what it acknowledged and nothing on the device knows (docs/mqtt.md: "Replay"). So an acknowledged result
is not forgotten at once: it stays in the window for `spool.replay_window` (1 h) and within
`spool.replay_max_bytes` (16 MiB, memory and disk together), oldest first out, and a consumer that finds seqs
missing can ask for them again (uplink/replay.py answers).

Where it is kept decides what it costs the flash (docs/store-and-forward.md, "Bytes written"):

- **In memory** (`RecentlySent`): a result the broker acknowledged before its commit was due (a healthy online
  device: nearly every result). It is written nowhere while the daemon runs, so online replay costs the flash
  nothing; compressed in blocks, a full window of 16 MiB of results takes about 2 MiB of memory. A clean stop
  writes what the memory holds into the `sent` table (one transaction), so a restart keeps the window.
- **On disk** (the `sent` table): a result acknowledged after its commit (drained after an outage). Its row is
  on disk already; it moves to the table in the same transaction that deletes it, and the outage paid for it.

What a crash of the device costs: the results in memory (delivered once, acknowledged) leave the window; a
broker that lost them in the same moment cannot have them again, and a request for them is answered `gone`.

A result sent again on request (`Outbox.add_again`) never re-enters the window: a consumer that asks for the
same seqs over and over cannot push out results that nobody asked for.
"""

from __future__ import annotations

import pickle
import sqlite3
import zlib
from collections import deque
from dataclasses import dataclass

from edged.store import spooldb
from edged.store.settings import SpoolConfig
from edged.store.spooldb import Row

BLOCK_ROWS = 64  # acknowledged rows compressed together (JSON results compress ~10x in blocks of this size)


@dataclass(frozen=True, slots=True)
class _Block:
    """Rows acknowledged one after the other, pickled and compressed together (edged's own bytes only)."""

    data: bytes
    spans: dict[str, tuple[int, int]]  # per stream: the lowest and highest seq inside
    rows: int
    payload: int  # payload bytes inside (what `replay_max_bytes` counts)
    last_clock: float  # the spool clock of the last acknowledgement inside

    @classmethod
    def of(cls, rows: list[Row]) -> _Block:
        spans: dict[str, tuple[int, int]] = {}
        for r in rows:
            low, high = spans.get(r.stream, (r.seq, r.seq))
            spans[r.stream] = (min(low, r.seq), max(high, r.seq))
        data = zlib.compress(pickle.dumps([tuple(r) for r in rows], protocol=pickle.HIGHEST_PROTOCOL), 1)
        return cls(data, spans, len(rows), sum(len(r.payload) for r in rows), rows[-1].clock)

    def unpack(self) -> list[Row]:
        return [Row(*r) for r in pickle.loads(zlib.decompress(self.data))]  # noqa: S301  (written above)


class RecentlySent:
    """The window's part in memory: acknowledged rows in the order they were acknowledged, each with `clock`
    set to the spool clock of its acknowledgement; the newest up to BLOCK_ROWS as they are, the others
    compressed in blocks (a full 16 MiB window of results takes about 2 MiB). Not thread-safe: the spool's lock.

    A request reads the blocks whose seqs overlap it; the oldest block goes first when the window is past
    `window_s` or its bytes. A seq acknowledged twice (rare: a result is sent again on request only, and that
    never enters the window) is kept twice, the newer wins, and counts twice toward the bytes."""

    def __init__(self, window_s: float, max_bytes: int) -> None:
        self.window_s = window_s
        self.max_bytes = max_bytes
        self.limit = max_bytes  # max_bytes less what the table holds (ReplayWindow keeps it so)
        self.bytes = 0  # payload bytes held
        self._rows = 0
        self._blocks: deque[_Block] = deque()
        self._open: list[Row] = []

    def __len__(self) -> int:
        return self._rows

    @property
    def memory_bytes(self) -> int:
        """What the window's memory takes for the payloads: the compressed blocks and the open rows."""
        return sum(len(b.data) for b in self._blocks) + sum(len(r.payload) for r in self._open)

    def add(self, row: Row, clock: float) -> None:
        """`row` was acknowledged at spool clock `clock`: the newest entry."""
        self._open.append(row._replace(id=0, clock=clock))
        self._rows += 1
        self.bytes += len(row.payload)
        if len(self._open) >= BLOCK_ROWS:
            self._blocks.append(_Block.of(self._open))
            self._open = []
        self.trim(clock)

    def trim(self, clock: float) -> None:
        """The oldest go: those acknowledged more than `window_s` ago, then any beyond the byte limit (whole
        blocks; the open rows one by one once no block is left)."""
        oldest = clock - self.window_s
        blocks = self._blocks
        while blocks and (blocks[0].last_clock < oldest or self.bytes > self.limit):
            gone = blocks.popleft()
            self._rows -= gone.rows
            self.bytes -= gone.payload
        while self._open and not blocks and (self._open[0].clock < oldest or self.bytes > self.limit):
            gone_row = self._open.pop(0)
            self._rows -= 1
            self.bytes -= len(gone_row.payload)

    def rows(self, stream: str, first: int, last: int) -> list[Row]:
        """The rows of one stream with first <= seq <= last, by seq."""
        found: dict[int, Row] = {}
        for block in self._blocks:
            span = block.spans.get(stream)
            if span is not None and span[0] <= last and first <= span[1]:
                found |= {r.seq: r for r in block.unpack() if r.stream == stream and first <= r.seq <= last}
        found |= {r.seq: r for r in self._open if r.stream == stream and first <= r.seq <= last}
        return [found[s] for s in sorted(found)]

    def span(self, stream: str) -> tuple[int, int] | None:
        """The lowest and highest seq of one stream held here."""
        spans = [b.spans[stream] for b in self._blocks if stream in b.spans]
        spans += [(r.seq, r.seq) for r in self._open if r.stream == stream]
        return (min(a for a, _ in spans), max(b for _, b in spans)) if spans else None

    def take_all(self) -> list[Row]:
        """Everything, oldest first, emptied (a clean stop writes it to the table)."""
        out = [r for b in self._blocks for r in b.unpack()] + self._open
        self._blocks.clear()
        self._open = []
        self._rows = self.bytes = 0
        return out


class ReplayWindow:
    """The window's policy and size: the part in memory, and the table's rows and payload bytes as the last
    commit left them."""

    def __init__(self, cfg: SpoolConfig, conn: sqlite3.Connection) -> None:
        self.window_s = cfg.replay_window
        self.max_bytes = cfg.replay_max_bytes
        self.rows, self.bytes = spooldb.sent_size(conn)
        self.recent = RecentlySent(self.window_s, self.max_bytes)
        self.recent.limit = max(0, self.max_bytes - self.bytes)
        self._after: tuple[int, int] | None = None  # the counts once the open commit is done (`settle`)

    @property
    def enabled(self) -> bool:
        """Whether acknowledged results are kept at all."""
        return self.max_bytes > 0

    def write(self, conn: sqlite3.Connection, acked: list[int], sent: list[Row], clock: float) -> None:
        """In the commit's transaction, before `acked` rows are deleted from `results`: copy them (acknowledged
        after their commit) into the table, and `sent` (the memory's rows, at a clean stop) with their own
        acknowledgement clocks."""
        if not self.enabled:
            return
        spooldb.copy_to_sent(conn, acked, clock)
        spooldb.insert_sent(conn, sent)

    def trim(self, conn: sqlite3.Connection, clock: float, added_rows: int, added_bytes: int) -> None:
        """After the table got `added_*` (same transaction): its oldest go, by age and then by size (the memory's
        bytes counted in). The counts are kept, not recounted (a replaced seq counts twice until the next start:
        the cap errs on the safe side)."""
        if not self.enabled:
            return
        rows, size = self.rows + added_rows, self.bytes + added_bytes
        over = max(0, size + self.recent.bytes - self.max_bytes)
        trimmed, freed = spooldb.trim_sent(conn, clock - self.window_s, min(over, size))
        self._after = max(0, rows - trimmed), max(0, size - freed)

    def settle(self) -> None:
        """The commit is done: its counts become the window's (under the spool's lock)."""
        if self._after is not None:
            self.rows, self.bytes = self._after
            self._after = None
            self.recent.limit = max(0, self.max_bytes - self.bytes)

    def recount(self, conn: sqlite3.Connection) -> None:
        """After a rolled-back commit: the counts from the table."""
        self.rows, self.bytes = spooldb.sent_size(conn)
        self._after = None
        self.recent.limit = max(0, self.max_bytes - self.bytes)

    def oldest_clock(self, clock: float) -> float:
        """The spool clock before which nothing is in the window any more (the table is trimmed at commits)."""
        return clock - self.window_s

    def snapshot(self, due: list[Row] | None = None) -> dict[str, float | int]:
        """The `spool.replay_window` entry of the status JSON: what a replay request can get, memory and table
        (`due`: the memory's rows in the writer's open commit at a clean stop)."""
        due = due or []
        recent = self.recent
        rows = self.rows + len(recent) + len(due)
        size = self.bytes + recent.bytes + sum(len(r.payload) for r in due)
        return {"rows": rows, "bytes": size, "max_bytes": self.max_bytes, "window_s": self.window_s,
                "memory_rows": len(recent), "memory_bytes": recent.bytes,
                "memory_compressed_bytes": recent.memory_bytes}  # fmt: skip
