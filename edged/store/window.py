"""The replay window: results the broker acknowledged, kept in the spool (`sent` table) for a while.

A PUBACK is the broker's word, held in its memory: a broker that crashes (or a bridge, or a cluster node)
loses what it acknowledged and nothing on the device knows (docs/mqtt.md: "Replay"). So an acknowledged result
is not forgotten at once: it moves to the window, where it stays for `spool.replay_window` (1 h) and within
`spool.replay_max_bytes` (16 MiB), oldest first out, and a consumer that finds seqs missing can ask for them
again (uplink/replay.py answers). Results acknowledged before their commit (a healthy online device) reach the
window in lazy batches (policy.py: SENT_FLUSH_S, SENT_BATCH); the window is best effort across a power cut
(a result in it was delivered once already).
"""

from __future__ import annotations

import sqlite3

from edged.store import spooldb
from edged.store.settings import SpoolConfig
from edged.store.spooldb import Row


class ReplayWindow:
    """The window's policy and size (rows and payload bytes, as the last commit left them)."""

    def __init__(self, cfg: SpoolConfig, conn: sqlite3.Connection) -> None:
        self.window_s = cfg.replay_window
        self.max_bytes = cfg.replay_max_bytes
        self.rows, self.bytes = spooldb.sent_size(conn)
        self._after: tuple[int, int] | None = None  # the counts once the open commit is done (`settle`)

    @property
    def enabled(self) -> bool:
        """Whether acknowledged results are kept at all."""
        return self.max_bytes > 0

    def write(self, conn: sqlite3.Connection, acked: list[int], sent: list[Row], clock: float) -> None:
        """In the commit's transaction, before `acked` rows are deleted from `results`: copy them and the rows
        acknowledged before their commit into the window, then trim it by age and size."""
        if not self.enabled:
            return
        spooldb.copy_to_sent(conn, acked, clock)
        spooldb.insert_sent(conn, sent, clock)

    def trim(self, conn: sqlite3.Connection, clock: float, added_rows: int, added_bytes: int) -> None:
        """After the window got `added_*` (same transaction): the oldest go, by age and then by size. The counts
        are kept, not recounted (a replaced seq counts twice until the next start: the cap errs on the safe
        side)."""
        if not self.enabled:
            return
        rows, size = self.rows + added_rows, self.bytes + added_bytes
        trimmed, freed = spooldb.trim_sent(conn, clock - self.window_s, max(0, size - self.max_bytes))
        self._after = max(0, rows - trimmed), max(0, size - freed)

    def settle(self) -> None:
        """The commit is done: its counts become the window's, in the same step (under the spool's lock) as its
        rows stop being counted as on their way (`snapshot`'s `due`), so status never counts them twice."""
        if self._after is not None:
            self.rows, self.bytes = self._after
            self._after = None

    def recount(self, conn: sqlite3.Connection) -> None:
        """After a rolled-back commit: the counts from the table."""
        self.rows, self.bytes = spooldb.sent_size(conn)
        self._after = None

    def snapshot(self, due: list[Row] | None = None) -> dict[str, float | int]:
        """The `spool.replay_window` entry of the status JSON: what a replay request can get, the acknowledged
        results on their way to the window (`due`: in memory, or in the writer's open commit) counted in."""
        due = due or []
        rows, size = self.rows + len(due), self.bytes + sum(len(r.payload) for r in due)
        return {"rows": rows, "bytes": size, "max_bytes": self.max_bytes, "window_s": self.window_s}
