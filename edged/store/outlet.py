"""What the uplink may ask of the store, as protocols (the spool is the one implementation): the uplink types
against these, never against `Spool`, so another store, or another uplink, meets at this line."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from edged.store.spooldb import Row

__all__ = ["Outlet", "ReplaySource", "Row"]


class Outlet(Protocol):
    """Rows to send, oldest first, and what became of each: acknowledged or refused."""

    @property
    def depth(self) -> int:
        """Results not acknowledged yet."""
        ...

    def on_change(self, callback: Callable[[], None]) -> None:
        """Call `callback` (cheap, non-blocking) whenever there is something new to fetch."""
        ...

    def changes(self) -> int:
        """A counter that moves whenever `fetch` may return something new."""
        ...

    def fetch(self, after_id: int, limit: int) -> list[Row]:
        """Rows with id > after_id, oldest first, at most `limit`."""
        ...

    def ttl_offset(self) -> float:
        """Seconds a row has left to live: `row.clock + ttl_offset()`."""
        ...

    def ack(self, row_ids: list[int]) -> None:
        """The broker acknowledged these rows."""
        ...

    def refuse(self, row_id: int, reason: str, *, final: bool = False) -> bool:
        """The broker refused this row; True when that made it a dead letter."""
        ...


class ReplaySource(Protocol):
    """The replay window: results the broker acknowledged, for a consumer that asks for them again."""

    def window_rows(self, pipeline: str, first: int, last: int, limit: int) -> tuple[list[Row], list[int]]:
        """(acknowledged results of one stream with first <= seq <= last, at most `limit`; the seqs still
        waiting for their first delivery)."""
        ...

    def send_again(self, rows: list[Row]) -> int:
        """Hand these results to the uplink again; how many."""
        ...

    def window_span(self, pipeline: str) -> list[int] | None:
        """[lowest, highest] seq of one stream in the window, or None."""
        ...
