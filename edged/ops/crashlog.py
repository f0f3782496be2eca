"""What a native crash leaves behind: `<state_dir>/last-crash.txt`.

A crash inside native code (ONNX Runtime dying on a model: SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL) ends the
process before any Python code can run; Python's faulthandler still writes every thread's stack to a file it
was given. The daemon gives it this one at each start, so the next start knows whether the last run ended in a
crash (and where: the stacks name the model's loading or its run), as opposed to a power cut, a SIGKILL or an
OOM kill, which leave the file empty. Only a crash counts against a model on trial (pipeline/lastgood.py): a
device that loses power during its first minute must not set a good model aside. The report of the last crash is
kept as `last-crash.prev.txt` for the operator, and said in the journal.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import sys
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)

CRASH_FILE = "last-crash.txt"
KEPT_FILE = "last-crash.prev.txt"
_ARMED: list[IO[str]] = []  # the open file faulthandler writes to (kept open while the daemon runs)


def arm(state_dir: Path) -> str | None:
    """From now on a fatal signal's report goes to `<state_dir>/last-crash.txt`; what the previous run's crash
    left there (its first line: the signal), or None when it did not crash."""
    path = state_dir / CRASH_FILE
    previous: str | None = None
    with contextlib.suppress(OSError):
        text = path.read_text(encoding="utf-8", errors="replace")
        if text.strip():
            previous = text.strip().splitlines()[0]
            path.replace(state_dir / KEPT_FILE)
            log.error("the last run of edged crashed (%s); its report is in %s", previous, state_dir / KEPT_FILE)
    try:
        out = path.open("w", encoding="utf-8")  # its loss is harmless: an empty file says "no crash"
    except OSError as exc:
        log.warning("cannot write %s (%s): a crash will not be recognized at the next start", path, exc)
        return previous
    disarm()
    faulthandler.enable(file=out, all_threads=True)
    _ARMED.append(out)
    return previous


def disarm() -> None:
    """A clean stop: fatal signals report to stderr again (as PYTHONFAULTHANDLER would have them)."""
    while _ARMED:
        out = _ARMED.pop()
        faulthandler.disable()
        with contextlib.suppress(OSError):
            out.close()
    if sys.stderr is not None and sys.flags.dev_mode is False:
        with contextlib.suppress(Exception):
            faulthandler.enable(file=sys.stderr, all_threads=True)
