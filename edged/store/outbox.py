"""Where every result stands between the model and the broker's PUBACK: the one owner of acknowledgement state.

A result is `pending` (in memory, not committed yet) from `add` until the writer committed it or the
broker acknowledged it, whichever comes first. A result acknowledged while pending is never written to
the database (a healthy online device writes next to nothing); one still unacknowledged when its commit
is due is written, and deleted when its PUBACK comes. Row ids are handed out here, in append order, so a
result keeps its id from the model to the delete and the publisher sees one id-ordered stream, whether a
row is still in memory or already on disk.

Not thread-safe by itself: the spool calls it with its lock held.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from edged.store.spooldb import Row
from edged.store.window import RecentlySent


@dataclass
class Batch:
    """What one commit writes: new rows, deletes, refusal counts, dead letters."""

    rows: list[Row] = field(default_factory=list)
    acks: list[int] = field(default_factory=list)
    tries: dict[int, int] = field(default_factory=dict)  # committed row id -> refusals so far
    dead: dict[int, str] = field(default_factory=dict)  # committed row id -> reason
    dead_rows: list[tuple[Row, str]] = field(default_factory=list)  # never committed, dead on arrival
    sent: list[Row] = field(default_factory=list)  # the replay window's memory, into its table (a clean stop)
    window_acks: list[int] = field(default_factory=list)  # of `acks`, those that go to the window (not replays)

    def __bool__(self) -> bool:
        return bool(self.rows or self.acks or self.tries or self.dead or self.dead_rows or self.sent)


class Outbox:
    """Pending results, acknowledged-but-not-deleted rows, refusals and dead letters."""

    def __init__(self, next_id: int, dead_letter_after: int, recent: RecentlySent | None = None) -> None:
        """`recent`: the replay window's memory (None: acknowledged results are not kept)."""
        self.next_id = next_id
        self.dead_letter_after = dead_letter_after
        self.pending: dict[int, Row] = {}  # id order = append order
        self.writing_upto = 0  # pending ids <= this are in the writer's open transaction
        self.committed_max = next_id - 1  # every committed id is <= this
        self.acked: set[int] = set()  # committed (or being written) and acknowledged: delete due
        self.acked_max = 0  # at least the highest id in `acked` (0 when it is empty)
        self._acks: list[int] = []
        self._tries: dict[int, int] = {}  # refusals per row id (committed or pending)
        self._tries_due: dict[int, int] = {}
        self.dead: dict[int, str] = {}  # refused dead_letter_after times: never sent again
        self._dead_due: dict[int, str] = {}
        self.acked_pending = 0  # results acknowledged before their commit (never written)
        self.recent = recent  # acknowledged before their commit: the replay window holds them in memory
        self.replays: set[int] = set()  # ids of results sent again on request: they never re-enter the window
        self.sent_due: list[Row] = []  # the window's memory, taken for the table at a clean stop (`flush_recent`)

    # -- producers -------------------------------------------------------------------------------------

    def add(self, row: Row) -> None:
        """A new result; `row.id` must be `take_id()`'s."""
        self.pending[row.id] = row

    def take_id(self) -> int:
        """The id of the next result."""
        value = self.next_id
        self.next_id += 1
        return value

    def unacked_pending(self) -> int:
        """Results in memory only, not acknowledged (what a kill -9 would lose now)."""
        return len(self.pending)

    def oldest_pending(self) -> Row | None:
        """The oldest result not committed yet."""
        return next(iter(self.pending.values()), None)

    # -- publisher -------------------------------------------------------------------------------------

    def live_after(self, after_id: int, limit: int) -> list[Row]:
        """Pending rows with id > after_id, oldest first (not dead)."""
        out: list[Row] = []
        for row_id in reversed(self.pending):  # the cursor is usually near the newest end
            if row_id <= after_id:
                break
            out.append(self.pending[row_id])
        out.reverse()
        if self.dead:
            out = [r for r in out if r.id not in self.dead]
        return out[:limit]

    def skip_after(self, after_id: int) -> set[int]:
        """Committed ids past the cursor that must not be sent (acknowledged, dead). While draining every
        acknowledged row is behind the cursor: then nothing is scanned."""
        skip = {i for i in self.acked if i > after_id} if self.acked_max > after_id else set()
        return skip | {i for i in self.dead if i > after_id} if self.dead else skip

    def ack(self, row_ids: Iterable[int], clock: float = 0.0) -> None:
        """The broker acknowledged these rows (at spool clock `clock`)."""
        for row_id in row_ids:
            if row_id in self.dead:
                continue  # acknowledged after all, but already set aside: it stays a dead letter
            row = self.pending.pop(row_id, None)
            if row is not None and row_id > self.writing_upto:
                self.acked_pending += 1  # delivered before its commit: only the replay window gets it
                if row_id in self.replays:
                    self.replays.discard(row_id)  # sent again on request: it is in the window already
                elif self.recent is not None:
                    self.recent.add(row, clock)
                continue
            if row_id not in self.acked:
                self.acked.add(row_id)
                self._acks.append(row_id)
                self.acked_max = max(self.acked_max, row_id)

    def refuse(self, row_id: int, reason: str, *, final: bool = False) -> bool:
        """The broker refused a row (`final`: it can never be sent); True when that made it a dead letter
        (counted now, written next commit)."""
        if row_id in self.dead or row_id in self.acked:
            return False
        tries = self._tries.get(row_id, 0) + 1
        if final:
            tries = max(tries, self.dead_letter_after)
        self._tries[row_id] = tries
        if tries < self.dead_letter_after:
            if row_id not in self.pending or row_id <= self.writing_upto:
                self._tries_due[row_id] = tries
            return False
        self.dead[row_id] = reason
        self._tries_due.pop(row_id, None)
        self._dead_due[row_id] = reason
        return True

    def note_tries(self, rows: Iterable[Row]) -> None:
        """Remember the refusals a committed row brought from the database (before a restart)."""
        for row in rows:
            if row.tries and row.id not in self._tries:
                self._tries[row.id] = row.tries

    # -- writer ----------------------------------------------------------------------------------------

    def take_batch(self, batch_max: int) -> Batch:
        """Everything the next commit writes; the rows stay pending (and sendable) until `committed`."""
        batch = Batch()
        for row_id, row in self.pending.items():
            if len(batch.rows) + len(batch.dead_rows) >= batch_max:
                break
            if row_id <= self.writing_upto:
                continue
            if row_id in self._dead_due:
                batch.dead_rows.append((row._replace(tries=self._tries[row_id]), self._dead_due.pop(row_id)))
            else:
                batch.rows.append(row._replace(tries=self._tries.get(row_id, 0)))
            self.writing_upto = row_id
        batch.acks, self._acks = self._acks, []
        batch.window_acks = [i for i in batch.acks if i not in self.replays] if self.replays else batch.acks
        batch.sent, self.sent_due = self.sent_due, []
        batch.tries, self._tries_due = self._tries_due, {}
        batch.dead = {i: r for i, r in self._dead_due.items() if i not in self.pending}
        for row_id in batch.dead:
            del self._dead_due[row_id]
        return batch

    def committed(self, batch: Batch) -> None:
        """The batch is in the database: its rows leave memory, its deletes are done."""
        for row in batch.rows:
            self.pending.pop(row.id, None)
        for row, _ in batch.dead_rows:
            self.pending.pop(row.id, None)
        self.committed_max = max(self.committed_max, self.writing_upto)
        self.acked.difference_update(batch.acks)
        if not self.acked:
            self.acked_max = 0
        for row_id in batch.acks:
            self._tries.pop(row_id, None)
            self.replays.discard(row_id)
        for row_id in [*batch.dead, *(row.id for row, _ in batch.dead_rows)]:
            self._tries.pop(row_id, None)
            self.dead.pop(row_id, None)  # out of `results` now: nothing left to skip
            self.replays.discard(row_id)

    def add_again(self, rows: Iterable[Row]) -> int:
        """Results from the replay window, sent again under new ids (a consumer asked for them); how many."""
        count = 0
        for row in rows:
            row_id = self.take_id()
            self.pending[row_id] = row._replace(id=row_id, tries=0)
            self.replays.add(row_id)
            count += 1
        return count

    def flush_recent(self) -> None:
        """A clean stop: the window's memory goes into the next commit (the table keeps it for the next start)."""
        if self.recent is not None and len(self.recent):
            self.sent_due += self.recent.take_all()

    def has_due(self) -> bool:
        """Deletes, refusal counts or dead letters wait for a commit."""
        return bool(self._acks or self._tries_due or self._dead_due)
