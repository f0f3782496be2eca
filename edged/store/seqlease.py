"""Sequence numbers that are never handed out twice: leased ahead in ranges, the lease kept in an fsync'd file.

A result can reach the broker before its commit (the spool publishes from memory), and a commit can be
lost (kill -9 before it, or a power cut with `sync: normal`). So the database alone cannot say which seqs
were used. Before a number is handed out, the end of its lease range is made durable in `<spool>.seqfloor`
(`durable.write_atomic`: temporary file, fsync, rename, folder fsync).

The lease is sized to last about `LEASE_S` seconds at the pipeline's own rate (between `LEASE_MIN` and
`LEASE_MAX` seqs): one small write every ~10 s per busy pipeline, and a crash leaves at most ~10 s of seqs
whose fate is unknown. Each write also records the *settled* mark of every pipeline (the spool's answer:
every seq up to it is committed, acknowledged by the broker, or counted as dropped), so the next start
knows where certainty ends even when the database saw no commit for hours (online, nothing is written).

At every start the file is read:
- after a clean stop it holds the exact last seq of each pipeline: numbering continues without a gap;
- after an unclean stop (kill -9, power cut, OOM) numbering continues after the lease end. The skipped
  range (settled mark + 1 .. lease end) is a gap whose seqs are *uncertain*: each was published from memory
  before the stop, lost with the uncommitted window, or never used (`used_to` says up to where they were
  certainly handed out). A gap is never a reuse, and its seqs are not counted as dropped.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edged.core.durable import read_json, write_atomic

log = logging.getLogger(__name__)

LEASE_S = 10.0  # a lease lasts about this long at the pipeline's rate
LEASE_MIN = 16  # seqs: the first lease of a pipeline, and the least a busy one gets
LEASE_MAX = 1000  # seqs: a crash leaves at most this many uncertain per pipeline (the old fixed lease)

Settled = Callable[[], dict[str, int]]


@dataclass(frozen=True)
class SeqGap:
    """Seqs `first`..`last` of `pipeline` were skipped after an unclean stop; `first`..`used_to` were
    certainly handed out (sent from memory before the stop, or lost), the rest perhaps never used."""

    pipeline: str
    first: int
    last: int
    used_to: int = 0

    @property
    def size(self) -> int:
        """How many seqs the gap holds."""
        return self.last - self.first + 1


def _ints(value: Any) -> dict[str, int]:
    return {str(k): int(v) for k, v in value.items()} if isinstance(value, dict) else {}


class SeqAllocator:
    """Per-pipeline sequence numbers (1, 2, ...), increasing across restarts, crashes and power cuts."""

    def __init__(self, path: Path, committed: dict[str, int], settled: Settled | None = None) -> None:
        """`committed`: the settled mark per pipeline that the database shows (its own view, maybe rolled back);
        `settled()`: the spool's settled marks now (None: not trusted across a power cut, `sync: normal`)."""
        self.path = path
        self._lock = threading.Lock()
        self._unclean = False
        self._settled = settled
        self.error: str | None = None
        saved = self._read()
        clean = bool(saved.get("clean"))
        last, leases = _ints(saved.get("last")), _ints(saved.get("lease"))
        marks = _ints(saved.get("settled"))
        self.clean_start = clean
        self.gaps: list[SeqGap] = []
        self._last: dict[str, int] = {}
        self._known: dict[str, int] = {}  # settled before this start: what the next file says until we know more
        for p in set(committed) | set(last) | set(leases):
            if clean:
                known = top = max(committed.get(p, 0), last.get(p, 0))
            else:
                known = max(committed.get(p, 0), marks.get(p, 0))
                top = max(known, leases.get(p, 0), last.get(p, 0))
            if top > known:
                self.gaps.append(SeqGap(p, known + 1, top, max(known, min(last.get(p, 0), top))))
            self._last[p] = top
            self._known[p] = known
        self._lease: dict[str, int] = dict(self._last)  # nothing of a new lease is handed out yet
        self._handed: dict[str, int] = dict(self._known)  # certainly handed out (the file's `last` while running)
        self._size: dict[str, int] = {}
        self._granted: dict[str, float] = {}
        if self.gaps:
            log.warning(
                "spool: unclean stop before this start; seq continues after the lease, uncertain: %s",
                ", ".join(f"{g.pipeline} {g.first}..{g.last}" for g in self.gaps),
            )
        self._write(clean=False, marks=self._known)  # from now on a crash is an unclean stop

    def _read(self) -> dict[str, Any]:
        data = read_json(self.path, "spool seq lease")
        if not isinstance(data, dict) or "lease" not in data:
            # absent, torn, or the floor file of an edged that committed before publishing: the database decides
            return {}
        return data

    def next(self, pipeline: str) -> int:
        """The next seq of `pipeline`; its lease is on disk before it is returned."""
        with self._lock:
            value = self._last.get(pipeline, 0) + 1
            if value > self._lease.get(pipeline, 0):
                self._lease[pipeline] = value + self._grant(pipeline) - 1
                self._write(clean=False)
            elif self.error is not None:
                self._write(clean=False)  # the last try failed (a full disk?): until it works, at every seq
            self._last[pipeline] = self._handed[pipeline] = value
            return value

    def _grant(self, pipeline: str) -> int:
        """The next lease's size: the last one's, scaled to last LEASE_S at the rate it was used up."""
        now = time.monotonic()
        size, since = self._size.get(pipeline, LEASE_MIN), self._granted.get(pipeline)
        if since is not None:
            size = round(size * LEASE_S / max(now - since, 1e-3))
        size = min(LEASE_MAX, max(LEASE_MIN, size))
        self._size[pipeline], self._granted[pipeline] = size, now
        return size

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
            self._handed = dict(self._last)  # exact now: the next start continues after it, gap or not
            self._write(clean=True, marks=self._last)

    def _write(self, *, clean: bool, marks: dict[str, int] | None = None) -> None:
        if marks is None:
            marks = self._settled() if self._settled is not None else {}
            marks = {p: max(v, self._known.get(p, 0)) for p, v in {**self._known, **marks}.items()}
        body = {"v": 3, "clean": clean, "last": self._handed, "lease": self._lease, "settled": marks}
        try:
            write_atomic(self.path, json.dumps(body).encode("utf-8"))
        except OSError as exc:
            # results keep flowing (a full disk must not stop them); status shows that seqs are at risk
            if self.error is None:
                log.error("spool: cannot persist the seq lease in %s: %s", self.path, exc)  # noqa: TRY400
            self.error = f"cannot persist the seq lease: {exc.strerror or exc}"
        else:
            self.error = None
