"""Thread names the operating system sees (`top -H`, `ps -L`, /proc/<pid>/task/*/comm).

Python names its threads only for itself; the kernel keeps calling every one of them `python`. Each edged
thread calls `name_os_thread()` first thing, so an operator can tell which thread burns CPU or wakes up.
Linux only (it writes /proc/thread-self/comm, 15 bytes at most); elsewhere, or when /proc is not there,
nothing happens.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

COMM_MAX = 15  # the kernel's TASK_COMM_LEN is 16 including the NUL


def comm_name(name: str) -> str:
    """What fits in the kernel's 15 bytes: the `edged-` prefix goes first (every thread here has it)."""
    short = name.removeprefix("edged-") if len(name) > COMM_MAX else name
    return short.encode("ascii", "replace")[:COMM_MAX].decode("ascii")


def name_os_thread(thread: threading.Thread | None = None) -> None:
    """Give `thread` (default: the calling one) its Python name at the OS level too."""
    thread = thread or threading.current_thread()
    tid = thread.native_id
    if tid is None:
        return
    with contextlib.suppress(OSError):
        Path(f"/proc/self/task/{tid}/comm").write_text(comm_name(thread.name), encoding="ascii")
