"""Sequence numbers that are never handed out twice: leased ahead in ranges, the lease kept in an fsync'd file.

A result can reach the broker before its commit (the spool publishes from memory), and a commit can be
lost (kill -9 before it, or a power cut that tears the WAL with `sync: normal`). So the database alone
cannot say which seqs were used. Before a number is handed out, the end of its lease range is made
durable in `<spool>.seqfloor` (written to a temporary file, fsync'd, renamed, directory fsync'd): one
small write per `LEASE` results per pipeline.

At every start the file is read:
- after a clean stop it holds the exact last seq of each pipeline: numbering continues without a gap;
- after an unclean stop (kill -9, power cut, OOM) numbering continues after the lease end. The skipped
  range (last committed seq + 1 .. lease end) is reported as a gap: those seqs were published from memory,
  lost with the uncommitted window, or never used. A gap is never a reuse.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

LEASE = 1000  # seqs per lease: at 30 results/s one fsync'd write every ~33 s; a crash skips at most this many


@dataclass(frozen=True)
class SeqGap:
    """Seqs `first`..`last` of `pipeline` were skipped after an unclean stop."""

    pipeline: str
    first: int
    last: int

    @property
    def size(self) -> int:
        """How many seqs the gap holds."""
        return self.last - self.first + 1


class SeqAllocator:
    """Per-pipeline sequence numbers (1, 2, ...), increasing across restarts, crashes and WAL loss."""

    def __init__(self, path: Path, committed: dict[str, int]) -> None:
        """`committed`: the highest seq per pipeline that the database shows (its own view, maybe rolled back)."""
        self.path = path
        self._lock = threading.Lock()
        self._unclean = False
        self.error: str | None = None
        saved = self._read()
        clean = bool(saved.get("clean"))
        last: dict[str, int] = {str(k): int(v) for k, v in saved.get("last", {}).items()}
        leases: dict[str, int] = {str(k): int(v) for k, v in saved.get("lease", {}).items()}
        self.clean_start = clean
        self.gaps: list[SeqGap] = []
        self._last: dict[str, int] = {}
        for p in set(committed) | set(last) | set(leases):
            known = max(committed.get(p, 0), last.get(p, 0))
            top = known if clean else max(known, leases.get(p, 0))
            if top > known:
                self.gaps.append(SeqGap(p, known + 1, top))
            self._last[p] = top
        self._lease: dict[str, int] = dict(self._last)  # nothing of a new lease is handed out yet
        if self.gaps:
            log.warning(
                "spool: unclean stop before this start; seq continues after the lease: %s",
                ", ".join(f"{g.pipeline} {g.first}..{g.last}" for g in self.gaps),
            )
        self._write(clean=False)  # from now on a crash is an unclean stop

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.error("spool: cannot read %s (%s); seq continues from the database", self.path, exc)  # noqa: TRY400
            return {}
        if isinstance(data, dict) and "lease" not in data:
            # the floor file of an edged that committed before publishing: the database's seqs are exact
            return {}
        return data if isinstance(data, dict) else {}

    def next(self, pipeline: str) -> int:
        """The next seq of `pipeline`; its lease is on disk before it is returned."""
        with self._lock:
            value = self._last.get(pipeline, 0) + 1
            if value > self._lease.get(pipeline, 0):
                self._lease[pipeline] = value + LEASE - 1
                self._write(clean=False)
            elif self.error is not None:
                self._write(clean=False)  # the last try failed (a full disk?): until it works, at every seq
            self._last[pipeline] = value
            return value

    def last(self) -> dict[str, int]:
        """The highest seq handed out per pipeline."""
        with self._lock:
            return dict(self._last)

    def retry(self) -> None:
        """Write the lease again if the last write failed (the spool calls this after a commit worked)."""
        with self._lock:
            if self.error is not None:
                self._write(clean=False)

    def keep_unclean(self) -> None:
        """The next start must treat this run as unclean (e.g. the database was found damaged)."""
        with self._lock:
            self._unclean = True

    def close(self) -> None:
        """A clean stop: record the exact last seqs, so the next start continues without a gap."""
        with self._lock:
            if self._unclean:
                return
            self._lease = dict(self._last)
            self._write(clean=True)

    def _write(self, *, clean: bool) -> None:
        body = json.dumps({"v": 2, "clean": clean, "last": self._last, "lease": self._lease})
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, body.encode("utf-8"))
                os.fsync(fd)
            finally:
                os.close(fd)
            tmp.replace(self.path)
            _fsync_dir(self.path.parent)
        except OSError as exc:
            # results keep flowing (a full disk must not stop them); status shows that seqs are at risk
            if self.error is None:
                log.error("spool: cannot persist the seq lease in %s: %s", self.path, exc)  # noqa: TRY400
            self.error = f"cannot persist the seq lease: {exc.strerror or exc}"
        else:
            self.error = None


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
