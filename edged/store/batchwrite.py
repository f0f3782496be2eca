"""One commit of the spool writer, as one SQLite transaction: acknowledged rows moved to the replay window
(window.py), refusals and dead letters recorded, the TTL and the capacity applied (eviction.py), the batch
inserted, and the seq marks and totals saved with it, so that what a crash leaves is always one consistent
state."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

from edged.store import spooldb
from edged.store.eviction import Totals, expire, make_room, maybe_reclaim
from edged.store.outbox import Batch
from edged.store.settings import SpoolConfig
from edged.store.spoolspace import SpaceGuard
from edged.store.window import ReplayWindow


@dataclass(frozen=True)
class BatchWriter:
    """What every commit of one spool writes with: its config (TTL, capacity, `on_full`), its disk guard, the
    replay window, and how many refusals make a dead letter."""

    cfg: SpoolConfig
    space: SpaceGuard
    window: ReplayWindow
    dead_letter_after: int

    def write(
        self,
        conn: sqlite3.Connection,
        before: Totals,
        batch: Batch,
        *,
        keep: set[int],
        marks: dict[str, int],
        clock: float,
        gaps: list[dict[str, Any]],
    ) -> Totals:
        """Commit `batch`; the totals after it. `keep`: acknowledged rows whose delete is in this batch (never
        evicted or expired first); `marks`: the seqs this commit makes settled; `gaps`: the seq gaps status
        shows. On an error the transaction is left open for the caller to roll back."""
        n = before.copy()
        spooldb.begin(conn)
        self.window.write(conn, batch.window_acks, batch.sent, clock)  # acknowledged: kept a while for a replay request
        rows, size = spooldb.delete_ids(conn, batch.acks)
        n.depth, n.bytes = n.depth - rows, n.bytes - size
        copied = rows if len(batch.window_acks) == len(batch.acks) else min(rows, len(batch.window_acks))
        self.window.trim(conn, clock, copied + len(batch.sent), size + sum(len(r.payload) for r in batch.sent))
        spooldb.save_tries(conn, batch.tries)
        if batch.dead:
            moved = spooldb.move_to_dead_letters(conn, batch.dead, self.dead_letter_after)
            rows, size = spooldb.delete_ids(conn, moved)
            n.depth, n.bytes, n.dead_letters = n.depth - rows, n.bytes - size, n.dead_letters + rows
        if batch.dead_rows:
            spooldb.insert_dead(conn, batch.dead_rows)
            n.dead_letters += len(batch.dead_rows)
        expire(conn, n, clock - self.cfg.max_age, keep)
        _, reusable = spooldb.space(conn)
        cap = self.space.capacity(n.bytes, reusable)
        admitted = make_room(conn, batch.rows, n, keep, cap=cap, on_full=self.cfg.on_full)
        spooldb.insert(conn, admitted)
        n.depth += len(admitted)
        n.bytes += sum(len(r.payload) for r in admitted)
        spooldb.save_seqs(conn, marks)  # settled once this commits: stored, acknowledged or counted as dropped
        meta = {
            "clock": clock,
            "dropped": n.dropped,
            "counts": [n.depth, n.bytes, n.dead_letters],
            "seq_gaps": gaps,
            "uncertain": n.uncertain,
        }
        spooldb.save_meta(conn, meta)
        maybe_reclaim(conn, n.bytes)
        spooldb.commit(conn)
        return n
