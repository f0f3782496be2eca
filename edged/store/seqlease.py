"""Sequence numbers that are never handed out twice: leased ahead in ranges, the lease kept in an fsync'd file.

A result can reach the broker before its commit (the spool publishes from memory), and a commit can be
lost (kill -9 before it, or a power cut with `sync: normal`). So the database alone cannot say which seqs
were used. Before a number is handed out, the end of its lease range is made durable in `<spool>.seqfloor`
(`durable.write_atomic`: temporary file, fsync, rename, folder fsync).

The lease is sized to last about `LEASE_S` seconds at the pipeline's own rate (between `LEASE_MIN` and
`LEASE_MAX` seqs): one small write every ~10 s per busy pipeline, and a crash leaves at most ~10 s of seqs
whose fate is unknown. It is renewed ahead, on a thread of its own, once half of it is used: on slow flash
(an SD card's fsync takes 20-50 ms) the inference threads never wait for it. Each write also records the
*settled* mark of every pipeline (the spool's answer: every seq up to it is committed, acknowledged by the
broker, or counted as dropped), so the next start knows where certainty ends even when the database saw no
commit for hours (online, nothing is written).

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
from edged.core.threads import DeathHook, Supervised

log = logging.getLogger(__name__)

LEASE_S = 10.0  # a lease lasts about this long at the pipeline's rate
LEASE_MIN = 64  # seqs: the first lease of a pipeline (2 s at 30/s: renewed ahead in time), the least one gets
LEASE_MAX = 1000  # seqs: a crash leaves at most this many uncertain per pipeline (the old fixed lease)

Settled = Callable[[], dict[str, int]]


@dataclass(frozen=True)
class SeqGap:
    """Seqs `first`..`last` of `stream` were skipped after an unclean stop; `first`..`used_to` were
    certainly handed out (sent from memory before the stop, or lost), the rest perhaps never used."""

    stream: str  # the seq stream: a pipeline's results or events (`cam0/results`); status calls it `pipeline`
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
        if saved.get("torn"):  # no lease known: skip the most one could have held, never reuse
            leases = {p: v + LEASE_MAX for p, v in committed.items()}
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
                ", ".join(f"{g.stream} {g.first}..{g.last}" for g in self.gaps),
            )
        self._closing = False
        self._wanted: set[str] = set()
        self._wake = threading.Condition(self._lock)
        self._io = threading.Lock()  # one file write at a time, each with the newest state
        self.renewer: Supervised | None = None  # the edged-seq-lease thread, once started
        self._save(self._body(clean=False, lease=self._lease, marks=self._known))  # a crash now is unclean

    def _read(self) -> dict[str, Any]:
        data = read_json(self.path, "spool seq lease")
        if data is None and self.path.exists():
            return {"torn": True}  # written atomically, so only by hand or a disk that lies: assume the worst
        if not isinstance(data, dict) or "lease" not in data:
            # absent, or the floor file of an edged that committed before publishing: the database decides
            return {}
        return data

    def next(self, pipeline: str) -> int:
        """The next seq of `pipeline`; its lease is on disk before it is returned.

        The lease is renewed ahead, on the `edged-seq-lease` thread once half of it is used: the caller (an
        inference thread) waits for the disk only when the renewal did not keep up, or when no renewer runs."""
        tried = False
        while True:
            with self._lock:
                value = self._last.get(pipeline, 0) + 1
                lease = self._lease.get(pipeline, 0)
                if value <= lease and (self.error is None or tried):
                    self._last[pipeline] = self._handed[pipeline] = value
                    if lease - value < self._size.get(pipeline, LEASE_MIN) // 2 and self.renewer is not None:
                        self._wanted.add(pipeline)
                        self._wake.notify()
                    return value
            # exhausted, or the last write failed (a full disk?): write now, then hand out (retried at every seq
            # until a write works again)
            self._extend({pipeline})
            tried = True

    def start(self, on_death: DeathHook | None = None) -> None:
        """Renew leases ahead on a thread of their own from now on (`close` stops it)."""
        self.renewer = Supervised("edged-seq-lease", target=self._renew_loop, on_death=on_death)
        self.renewer.start()

    def _renew_loop(self) -> None:
        while True:
            with self._lock:
                while not self._wanted and not self._closing:
                    self._wake.wait()
                if self._closing:
                    return
                wanted, self._wanted = self._wanted, set()
            self._extend(wanted)

    def _extend(self, pipelines: set[str]) -> None:
        """Grant each of `pipelines` a further lease (if it still needs one) and make it durable. Writes are
        serialized and each one holds the newest state, so the file never goes back."""
        with self._io:
            with self._lock:
                lease = dict(self._lease)
                for p in pipelines:
                    left = lease.get(p, 0) - self._last.get(p, 0)
                    if left <= self._size.get(p, LEASE_MIN) // 2:
                        # at most one lease ahead of what is handed out: a crash leaves at most that uncertain
                        lease[p] = max(lease.get(p, 0), self._last.get(p, 0) + self._grant(p))
                body = self._body(clean=False, lease=lease)
            self._save(body)
            with self._lock:
                # on a failed write the lease is taken all the same: results keep flowing (a full disk must
                # not stop them) and status says that seqs are at risk until a write works again
                for p, end in lease.items():
                    self._lease[p] = max(self._lease.get(p, 0), end)

    def _grant(self, pipeline: str) -> int:
        """The next lease's size: the last one's, scaled to last LEASE_S at the rate it was used up (a lease
        renewed at half time is extended by half of it: the scale is the same)."""
        now = time.monotonic()
        size, since = self._size.get(pipeline, LEASE_MIN), self._granted.get(pipeline)
        if since is not None:  # at least a second measured: a burst at start-up does not make a huge lease
            size = round(size * LEASE_S / max(now - since, 1.0))
        size = min(LEASE_MAX, max(LEASE_MIN, size))
        self._size[pipeline], self._granted[pipeline] = size, now
        return size

    def last(self) -> dict[str, int]:
        """The highest seq handed out per pipeline."""
        with self._lock:
            return dict(self._last)

    def retry(self) -> None:
        """Write the lease again if the last write failed (the spool calls this after a commit worked)."""
        if self.error is not None:
            self._extend(set())

    def keep_unclean(self) -> None:
        """The next start must treat this run as unclean (e.g. the database was found damaged)."""
        with self._lock:
            self._unclean = True

    def close(self) -> None:
        """Stop the renewer; a clean stop: record the exact last seqs, so the next start continues without a gap."""
        with self._lock:
            self._closing = True
            self._wake.notify_all()
        if self.renewer is not None:
            self.renewer.join(timeout=30)
        with self._io:
            with self._lock:
                if self._unclean:
                    return
                self._lease = dict(self._last)
                self._handed = dict(self._last)  # exact now: the next start continues after it, gap or not
                body = self._body(clean=True, lease=self._lease, marks=self._last)
            self._save(body)

    def _body(self, *, clean: bool, lease: dict[str, int], marks: dict[str, int] | None = None) -> bytes:
        """The file's content (called with the lock held)."""
        if marks is None:
            marks = self._settled() if self._settled is not None else {}
            marks = {p: max(v, self._known.get(p, 0)) for p, v in {**self._known, **marks}.items()}
        body = {"v": 3, "clean": clean, "last": self._handed, "lease": lease, "settled": marks}
        return json.dumps(body).encode("utf-8")

    def _save(self, body: bytes) -> None:
        """Write the file durably (called with the io lock held, not the state lock: an fsync takes a while)."""
        try:
            write_atomic(self.path, body)
        except OSError as exc:
            if self.error is None:
                log.error("spool: cannot persist the seq lease in %s: %s", self.path, exc)  # noqa: TRY400
            error: str | None = f"cannot persist the seq lease: {exc.strerror or exc}"
        else:
            error = None
        with self._lock:
            self.error = error
