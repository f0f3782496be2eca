"""Opening a spool that a crash or a power cut may have left behind.

A small spool, or one not closed cleanly, gets SQLite's integrity check before anything is read; a large one
closed cleanly is opened at once and checked in the background while results flow (a million rows take
seconds; spool.py runs that check). A file that fails is moved aside (spooldb.open_checked): edged starts on a
new one, its seqs continue past the damaged file's, and the damaged file's unsent results are counted as
dropped (`quarantined`), never silently gone.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from edged.core.errors import SpoolError
from edged.core.threads import Supervised
from edged.store import spooldb
from edged.store.policy import Durability

log = logging.getLogger(__name__)


class Counts(Protocol):
    """The spool's drop counters."""

    def count(self, reason: str, rows: int) -> None:
        """Count `rows` results dropped for `reason`."""
        ...


def floor_path(path: Path) -> Path:
    """The seq lease file beside the spool (seqlease.py)."""
    return path.with_name(path.name + ".seqfloor")


def was_clean(path: Path) -> bool:
    """Whether the spool at `path` was closed cleanly (its seq lease says so)."""
    try:
        return bool(json.loads(floor_path(path).read_text(encoding="utf-8")).get("clean"))
    except (OSError, ValueError, AttributeError):
        return False


def open_spool(path: Path, policy: Durability) -> tuple[sqlite3.Connection, Path | None, dict[str, Any], bool]:
    """(the writer's connection, where a damaged file was moved or None, the stored state, whether the
    integrity check is still to run in the background)."""
    try:
        size = path.stat().st_size
    except OSError:
        size = 0
    inline = policy.check_before_start(size, clean=was_clean(path))
    conn, moved = spooldb.open_checked(path, policy, check=inline)
    try:
        return conn, moved, spooldb.load_state(conn), not inline
    except (sqlite3.DatabaseError, TypeError, ValueError) as exc:
        if inline:
            raise SpoolError(f"cannot read spool {path}: {exc}") from exc
        conn.close()  # unreadable after all: the full check decides
        conn, moved = spooldb.open_checked(path, policy, check=True)
        return conn, moved, spooldb.load_state(conn), False


def count_quarantined(damaged: Path, counts: Counts, committed: dict[str, int]) -> None:
    """After a damaged file was moved aside: seqs continue past its own (`committed` raised in place), its
    unsent rows and its drop counters are counted."""
    seqs, unsent, dropped = spooldb.salvage(damaged)
    for pipeline, top in seqs.items():
        committed[pipeline] = max(committed.get(pipeline, 0), top)
    for reason, n in dropped.items():
        counts.count(reason, n)
    counts.count("quarantined", unsent)
    log.warning(
        "spool: %d unsent result(s) stay in %s (counted as dropped: quarantined); seq continues from %s",
        unsent, damaged, committed or "1",
    )  # fmt: skip


class BackgroundCheck(Supervised):
    """SQLite's quick_check on its own connection while the daemon runs (a large spool closed cleanly).

    Damage is reported (`damage`, a status error) and `on_damage` runs (the spool leaves its seq lease
    unclean), so that the next start checks before it opens and moves the file aside."""

    def __init__(self, path: Path, policy: Durability, on_damage: Callable[[], None]) -> None:
        super().__init__("edged-spool-check")
        self.path = path
        self.policy = policy
        self.on_damage = on_damage
        self.damage: str | None = None
        self._conn: sqlite3.Connection | None = None
        self._stopping = False

    def body(self) -> None:
        started = time.monotonic()
        try:
            conn = spooldb.connect(self.path, self.policy)
            self._conn = conn  # stop() interrupts it
            try:
                problem = spooldb.integrity_problem(conn)
            finally:
                self._conn = None
                conn.close()
        except sqlite3.Error as exc:
            if self._stopping:
                return
            problem = str(exc)
        if problem is None:
            log.info("spool: integrity check passed (%.1f s, in the background)", time.monotonic() - started)
            return
        self.damage = f"spool damaged ({problem}); restart edged to move it aside"
        self.on_damage()
        log.critical("SPOOL DAMAGED: %s failed its integrity check: %s", self.path, problem)

    def stop(self, timeout: float = 5.0) -> None:
        """Interrupt a check under way (it runs again at the next start if still needed) and join it."""
        self._stopping = True
        conn = self._conn
        if conn is not None:
            conn.interrupt()
        if self.is_alive():
            self.join(timeout=timeout)
