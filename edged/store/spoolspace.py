"""How many payload bytes the spool may hold: `max_bytes`, lowered to what the disk really has room for.

What SQLite holds but can reuse (pages on its freelist after a backlog drained) counts as room: SQLite
does not give deleted pages back to the filesystem by itself, so counting only the filesystem's free
space would leave a spool that was full once with no capacity at all. The reserve kept free on the
filesystem is `min_free_bytes`, or half of what there is when the disk is smaller than twice that (a
warning at start and in status names the effective bound): the spool never falls to zero capacity while
the disk has room, and live results keep flowing to a connected broker whatever the bound.
"""

from __future__ import annotations

import logging
from pathlib import Path

from edged.store.diskspace import Ballast, free_bytes
from edged.store.settings import SpoolConfig

log = logging.getLogger(__name__)


class SpaceGuard:
    """The spool's capacity, asked at every commit (statvfs costs microseconds), and its ballast file."""

    def __init__(self, spool_path: Path, limits: SpoolConfig) -> None:
        self.dir = spool_path.parent
        self.limits = limits
        self.ballast = Ballast(spool_path.with_name(spool_path.name + ".ballast"), limits.ballast_bytes)
        self.cap = limits.max_bytes
        self.reserve = limits.min_free_bytes
        self.warning: str | None = None
        self.ballast.ensure(limits.min_free_bytes)

    def capacity(self, stored: int, reusable: int) -> int:
        """Payload bytes the spool may hold now; `stored` it holds, `reusable` SQLite could reuse."""
        try:
            free = free_bytes(self.dir)
        except OSError:
            return self.cap
        size = self.limits.ballast_bytes
        wanted = size and not self.ballast.present and free > 3 * size + self.limits.min_free_bytes
        if wanted and self.ballast.ensure(self.limits.min_free_bytes):
            log.info("spool: disk space is back; ballast file restored")
            free -= size
        room = stored + reusable + free
        reserve = self.limits.min_free_bytes
        if room < 2 * reserve:
            reserve = room // 2
        self.cap = max(0, min(self.limits.max_bytes, room - reserve))
        self._note_small_disk(reserve, free)
        return self.cap

    def room(self, stored: int, reusable: int, free: int) -> int:
        """Payload bytes the spool could hold with `free` bytes free on the disk (a pure estimate: no ballast
        restored, no warning noted), for status between commits."""
        room = stored + reusable + free
        reserve = self.limits.min_free_bytes if room >= 2 * self.limits.min_free_bytes else room // 2
        return max(0, min(self.limits.max_bytes, room - reserve))

    def _note_small_disk(self, reserve: int, free: int) -> None:
        if reserve >= self.limits.min_free_bytes:
            if self.warning is not None:
                log.info("spool: the disk has room for min_free_bytes again")
            self.warning = None
            self.reserve = reserve
            return
        warning = (
            f"disk too small for spool.min_free_bytes={_mib(self.limits.min_free_bytes)} "
            f"({_mib(free)} free): keeping {_mib(reserve)} free, spool bound {_mib(self.cap)}"
        )
        if self.warning is None:
            log.warning("spool: %s", warning)
        self.warning = warning
        self.reserve = reserve

    def on_disk_full(self) -> None:
        """SQLite hit a full disk: release the ballast so the next try can delete and checkpoint."""
        if self.ballast.release():
            log.error("spool: disk full; released the %d-byte ballast to keep working", self.limits.ballast_bytes)


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"
