"""What the spool holds in memory, under one condition: every part of the spool (the producers' side, the
writer thread, the replay view, the status) reads and changes it only with `cond` held.

Kept apart so that each of those parts is its own small object over one shared state, not a method group of
one large class."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from edged.store.eviction import Totals
from edged.store.outbox import Outbox
from edged.store.spooldb import Row


class Ledger:
    """The outbox, the totals, per seq stream the highest seq appended (and a cap while a gap is not announced
    yet), the counters that wake the uplink and the writer, and the spool clock."""

    def __init__(self, outbox: Outbox, totals: Totals, appended: dict[str, int], caps: dict[str, int],
                 clock_base: float) -> None:  # fmt: skip
        self.cond = threading.Condition()
        self.outbox = outbox
        self.n = totals
        self.appended = appended
        self.caps = caps
        self.changes = 0  # moves whenever `fetch` may return something new
        self.closing = False
        self.meta_dirty = False  # counts or gaps changed without a row: the next commit saves them
        self.sending_to_window: list[Row] = []  # the window's memory in the writer's open commit (a clean stop)
        self.listeners: list[Callable[[], None]] = []
        self._clock_base = clock_base
        self._mono0 = time.monotonic()

    def clock(self) -> float:
        """The spool clock: seconds edged has been running, accumulated across restarts."""
        return self._clock_base + (time.monotonic() - self._mono0)

    def notify(self) -> None:
        """Tell the uplink there is something new to fetch (without `cond` held)."""
        for callback in self.listeners:
            callback()

    def marks(self, unsettled: Iterable[Row]) -> dict[str, int]:
        """Per seq stream, the highest seq up to which none of `unsettled` lies (with `cond` held)."""
        marks = dict(self.appended)
        for key, cap in self.caps.items():
            marks[key] = min(marks.get(key, cap), cap)
        for row in unsettled:
            if row.seq - 1 < marks.get(row.stream, row.seq):
                marks[row.stream] = row.seq - 1
        return marks

    def settled(self) -> dict[str, int]:
        """Per seq stream, the highest seq up to which every seq is committed, acknowledged by the broker or
        counted as dropped: what a crash cannot make uncertain."""
        with self.cond:
            return self.marks(self.outbox.pending.values())

    def depth(self) -> int:
        """Results not acknowledged yet, committed and pending (with `cond` held)."""
        return self.n.depth - len(self.outbox.acked) + self.outbox.unacked_pending()

    def window_due(self, stream: str) -> list[Row]:
        """A stream's acknowledged rows on their way from the window's memory to its table at a clean stop:
        taken for the commit, or in the writer's open commit (with `cond` held)."""
        return [r for r in (*self.outbox.sent_due, *self.sending_to_window) if r.stream == stream]
