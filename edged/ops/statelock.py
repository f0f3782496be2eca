"""One daemon per state_dir: an exclusive flock on `state_dir/edged.lock`, held for the daemon's life.

Two daemons sharing a state_dir would hand out the same seqs and take over each other's MQTT client id.
The status-socket probe does not catch it when their sockets differ, so the lock is taken before the
spool, the socket or anything else is opened. The kernel drops it when the process ends, however it ends
(kill -9 included): a stale lock file never blocks a restart. The file holds the holder's pid, for the
message only.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from edged.core.errors import EdgedError

LOCK_NAME = "edged.lock"


class StateLock:
    """Hold the lock; `release()` (or process exit) lets the next daemon in."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / LOCK_NAME
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o640)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            who = f" (pid {holder})" if holder else ""
            raise EdgedError(
                f"another edged{who} is running with state_dir {state_dir}; one state_dir per daemon"
            ) from None
        except OSError:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd: int | None = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)  # closing the descriptor drops the flock


def _read_pid(fd: int) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(os.pread(fd, 32, 0).decode().strip() or 0) or None
    return None
