"""Disk headroom for the spool: free space, and a ballast file released when the disk fills.

SQLite cannot delete rows or checkpoint its WAL on a full disk: deleting needs a little space first. The
ballast is a file of real blocks that edged gives back to the filesystem when a write fails for lack of
space, so the spool can still evict; it is made again once space has returned.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged process may still write on the filesystem holding `path`."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


class Ballast:
    """A file of `size` bytes of allocated blocks next to the spool."""

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self.size = size

    @property
    def present(self) -> bool:
        """Whether the ballast currently holds its blocks."""
        try:
            return self.size > 0 and self.path.stat().st_size >= self.size
        except FileNotFoundError:
            return False

    def ensure(self, reserve: int) -> bool:
        """Make the ballast if there is room for it plus `reserve`; True when it is in place.

        Not fsync'd: a ballast lost or short after a power cut is harmless, `present` sees it and the next
        start makes it again."""
        if self.size <= 0 or self.present:
            return self.present
        if free_bytes(self.path.parent) < self.size + reserve:
            return False
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.posix_fallocate(fd, 0, self.size)  # real blocks, not a sparse file
            finally:
                os.close(fd)
        except OSError as exc:
            log.warning("spool: cannot create ballast file %s: %s", self.path, exc)
            self.release()
            return False
        return True

    def release(self) -> bool:
        """Give the blocks back; True when there was something to release."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            return False
        return True
