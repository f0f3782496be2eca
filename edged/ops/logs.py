"""Logging set-up: stderr (journald adds time and unit), the journal with structured fields when
systemd-python is there, and a filter that rate-limits a line that keeps repeating."""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
import time

BURST = 3  # identical lines let through per period ...
PERIOD_S = 60.0  # ... then one line per period, saying how many were suppressed


class RepeatFilter(logging.Filter):
    """Lets `burst` records with the same (logger, level, message template) through per `period`.

    The next record let through after a quiet spell says how many similar ones were suppressed.
    """

    def __init__(self, burst: int = BURST, period: float = PERIOD_S) -> None:
        super().__init__()
        self.burst = burst
        self.period = period
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, int, str], tuple[float, int, int]] = {}  # start, count, suppressed

    def filter(self, record: logging.LogRecord) -> bool:
        """True to emit the record (possibly annotated), False to suppress it."""
        key = (record.name, record.levelno, str(record.msg))
        now = time.monotonic()
        with self._lock:
            start, count, suppressed = self._seen.get(key, (now, 0, 0))
            if now - start >= self.period:
                start, count = now, 0
            count += 1
            if count > self.burst:
                self._seen[key] = (start, count, suppressed + 1)
                return False
            self._seen[key] = (start, count, 0)
            if len(self._seen) > 1000:  # bounded memory: forget the oldest keys
                for old in sorted(self._seen, key=lambda k: self._seen[k][0])[:500]:
                    del self._seen[old]
        if suppressed:
            record.msg = f"{record.msg} ({suppressed} similar message(s) suppressed)"
        return True


def journal_handler() -> logging.Handler | None:
    """A JournalHandler when our stderr is the journal and systemd-python is installed, else None."""
    stream = os.environ.get("JOURNAL_STREAM")
    if not stream:
        return None
    try:
        dev, ino = (int(x) for x in stream.split(":"))
        st = os.fstat(sys.stderr.fileno())
    except (ValueError, OSError):
        return None
    if (st.st_dev, st.st_ino) != (dev, ino):
        return None
    try:
        journal = importlib.import_module("systemd.journal")
    except ImportError:
        return None
    handler: logging.Handler = journal.JournalHandler(SYSLOG_IDENTIFIER="edged")
    return handler


def setup_logging(level: int) -> None:
    """stderr, or the journal with fields (PIPELINE, SEQ, PROVIDER passed as `extra`), rate-limited."""
    handler = journal_handler()
    if handler is None:
        handler = logging.StreamHandler(sys.stderr)
        fmt = "%(levelname)s %(name)s: %(message)s"
        if sys.stderr.isatty():
            fmt = "%(asctime)s " + fmt
        handler.setFormatter(logging.Formatter(fmt))
    handler.addFilter(RepeatFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
