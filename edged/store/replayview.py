"""The replay window as the uplink asks for it (store/outlet.py `ReplaySource`): results the broker
acknowledged, looked up by stream and seq wherever they are (in the window's memory, in its table, in the
writer's open commit at a clean stop, or committed with their delete due), and handed to the uplink again."""

from __future__ import annotations

from edged.store import spooldb
from edged.store.ledger import Ledger
from edged.store.spooldb import Reader, Row
from edged.store.window import ReplayWindow


class ReplayView:
    """Reads the window for replay requests and sends its results again."""

    def __init__(self, ledger: Ledger, reader: Reader, window: ReplayWindow) -> None:
        self.ledger = ledger
        self.reader = reader
        self.window = window
        self.replayed = 0  # results sent again from the window on a consumer's request

    def window_rows(self, pipeline: str, first: int, last: int, limit: int) -> tuple[list[Row], list[int]]:
        """(results of one stream with first <= seq <= last the broker acknowledged, by seq, at most `limit`;
        the seqs among them still waiting for their first delivery)."""
        led = self.ledger
        since = self.window.oldest_clock(led.clock())
        with self.reader.use() as conn:
            kept = spooldb.sent_rows(conn, pipeline, first, last, limit, since)
            stored = spooldb.stream_rows(conn, pipeline, first, last, limit)
        with led.cond:
            box = led.outbox
            self.window.recent.trim(led.clock())
            kept += [r for r in stored if r.id in box.acked]
            kept += [r for r in led.window_due(pipeline) if first <= r.seq <= last]
            kept += self.window.recent.rows(pipeline, first, last)
            waiting = [r.seq for r in stored if r.id not in box.acked and r.id not in box.dead]
            waiting += [r.seq for r in box.pending.values()
                        if r.stream == pipeline and first <= r.seq <= last and r.id not in box.replays]  # fmt: skip
        unique = {r.seq: r for r in kept}
        return [unique[s] for s in sorted(unique)][:limit], sorted(set(waiting) - set(unique))

    def window_span(self, pipeline: str) -> list[int] | None:
        """[lowest, highest] seq of one stream in the replay window, or None."""
        led = self.ledger
        since = self.window.oldest_clock(led.clock())
        with self.reader.use() as conn:
            span = spooldb.sent_span(conn, pipeline, since)
        with led.cond:  # and in memory, in the open commit, or committed with their delete due
            seqs = [r.seq for r in led.window_due(pipeline)] + (list(span) if span else [])
            recent = self.window.recent.span(pipeline)
            seqs += list(recent) if recent else []
            acked = list(led.outbox.acked)
        if acked:
            with self.reader.use() as conn:
                stored = spooldb.acked_span(conn, pipeline, acked)
            seqs += list(stored) if stored else []
        return [min(seqs), max(seqs)] if seqs else None

    def send_again(self, rows: list[Row]) -> int:
        """Hand results from the window to the uplink again (never blocks: a replay is bounded by its
        request); how many. They do not enter the window again when acknowledged."""
        led = self.ledger
        with led.cond:
            if led.closing:
                return 0
            count = led.outbox.add_again(rows)
            self.replayed += count
            led.changes += count
            led.cond.notify_all()
        led.notify()
        return count
