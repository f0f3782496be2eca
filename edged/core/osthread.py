"""Thread names the operating system sees (`top -H`, `ps -L`, /proc/<pid>/task/*/comm), and thread priorities.

Python names its threads only for itself; the kernel keeps calling every one of them `python`. Each edged
thread calls `name_os_thread()` first thing, so an operator can tell which thread burns CPU or wakes up.
Linux only (it writes /proc/self/task/<tid>/comm, 15 bytes at most); elsewhere, or when /proc is not there,
nothing happens.

Priorities: under CPU overload (more pipelines than the cores can run flat out) the kernel shares the CPU
between runnable threads, and the few that deliver results (the publisher, paho's network thread, the
spool writer) got too small a share: a daemon producing 1,000 results/s published 700/s and its backlog
grew without end. So the stages yield to the ones after them: capture threads (and their decoders) run at
nice +CAPTURE_NICE, inference at +INFERENCE_NICE, delivery at the unit's own priority. Work in progress is
finished before new work starts; when the CPU is short, frames are dropped at the source (counted), not
results at the end. With spare CPU, nice changes nothing. Measured by benchmarks/latency.py (live path).
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

COMM_MAX = 15  # the kernel's TASK_COMM_LEN is 16 including the NUL
CAPTURE_NICE = 10
INFERENCE_NICE = 5


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


def yield_cpu_to_delivery(step: int) -> None:
    """Raise the calling thread's nice value by `step` (Linux: nice is per thread, and threads it starts,
    such as FFmpeg's decoders, inherit it). Best effort: raising nice needs no privilege; elsewhere nothing.
    """
    tid = threading.get_native_id()
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + step))
