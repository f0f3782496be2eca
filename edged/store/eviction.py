"""What a commit keeps of the spool: results past their TTL go, `max_bytes` is kept with the `on_full`
policy, and free pages go back to the filesystem once a backlog drained. Every row that goes is counted by
its reason in the spool's totals (nothing disappears silently)."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from typing import Literal

from edged.store import spooldb
from edged.store.spooldb import Row

RECLAIM_MIN_BYTES = 8 * 2**20  # freelist bytes above which a commit gives pages back to the filesystem
RECLAIM_PAGES = 2048  # pages one commit gives back at most


@dataclass
class Totals:
    """The spool's running totals, as the last commit left them (persisted in its meta table)."""

    depth: int = 0
    bytes: int = 0
    dead_letters: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    uncertain: int = 0  # seqs of unclean-stop gaps: sent before the stop, lost, or never used (not drops)

    def copy(self) -> Totals:
        return Totals(self.depth, self.bytes, self.dead_letters, dict(self.dropped), self.uncertain)

    def count(self, reason: str, rows: int) -> None:
        if rows:
            self.dropped[reason] = self.dropped.get(reason, 0) + rows

    def drop(self, reason: str, rows: int, size: int) -> None:
        """Stored rows deleted by a policy."""
        self.count(reason, rows)
        self.depth -= rows
        self.bytes -= size


def expire(conn: sqlite3.Connection, n: Totals, cutoff: float, keep: set[int]) -> None:
    """Delete stored rows older than `cutoff` on the spool clock (`max_age_s`), except those in `keep`."""
    expired, size = spooldb.expire(conn, cutoff, keep)
    n.drop("expired", len(expired), size)


def make_room(
    conn: sqlite3.Connection,
    batch: list[Row],
    n: Totals,
    keep: set[int],
    *,
    cap: int,
    on_full: Literal["drop_oldest", "drop_newest"],
) -> list[Row]:
    """The rows of `batch` that fit under `cap` bytes with the `on_full` policy: `drop_oldest` evicts stored
    rows first (and the batch's own oldest when it alone is over the cap), `drop_newest` refuses what does
    not fit."""
    incoming = sum(len(r.payload) for r in batch)
    if n.bytes + incoming <= cap:
        return batch
    if on_full == "drop_oldest":
        ids, size = spooldb.evict_oldest(conn, n.bytes + incoming - cap, keep)
        n.drop("full_evicted_oldest", len(ids), size)
        admitted = list(batch)
        while admitted and n.bytes + sum(len(r.payload) for r in admitted) > cap:
            admitted.pop(0)  # the batch alone is over the cap: its oldest go too
            n.count("full_evicted_oldest", 1)
        return admitted
    admitted, room = [], cap - n.bytes
    for r in batch:
        if len(r.payload) <= room:
            admitted.append(r)
            room -= len(r.payload)
        else:
            n.count("full_rejected_newest", 1)
    return admitted


def maybe_reclaim(conn: sqlite3.Connection, stored: int) -> None:
    """After a backlog drained, give the file's free pages back to the filesystem (a little per commit).

    Only once the free pages outweigh what the file still holds: while a large backlog expires or
    drains, new rows reuse the pages old ones freed, and moving pages to shrink the file would cost
    writes (flash wear, and at a 1,000,000-row TTL the writer's time) for nothing."""
    _, reusable = spooldb.space(conn)
    if reusable >= RECLAIM_MIN_BYTES and reusable > stored:
        spooldb.reclaim(conn, RECLAIM_PAGES)
