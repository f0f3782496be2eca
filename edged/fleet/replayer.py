"""The ingest's side of replay (docs/mqtt.md, "Replay"): find the seqs that did not arrive and ask the device.

A broker may acknowledge a result and lose it (a crash, a bridge, a failed cluster node). The ingest follows
each stream's seqs as rows are written: a seq past the highest one seen opens a missing range, a row inside
one closes it. A range still missing after `replay_after_s` (a redelivery in flight, or a device's own replay,
may fill it meanwhile) is asked for on the device's request topic, at most MAX_SEQS seqs and MAX_RANGES ranges
a request, one request per stream at a time; unanswered or still missing, it is asked again every RETRY_S, up
to TRIES times. The device sends what its window holds again and answers with what is gone; gone ranges are
written to the database (`replay_ranges`, with the ranges asked), so the report tells recovered from lost.

At steady state (no seq missing) this costs a dictionary update per row and nothing on the air: no
acknowledgements per message, no polling. Seqs before the first one a stream showed this ingest are not asked
for (it may have joined late); a loss at the very end of a stream shows once the next result arrives.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from edged.core.threads import Supervised
from edged.fleet.ingestdb import Gap, ReplayRow, Stream

log = logging.getLogger(__name__)

MAX_SEQS = 5000  # seqs one request asks for at most (the device refuses more)
MAX_RANGES = 64
RETRY_S = 30.0  # a range still missing this long after it was asked for is asked again ...
TRIES = 3  # ... this many times at most
TRACKED_MAX = 256  # missing ranges followed per stream; beyond, the oldest are given up (counted)

Key = tuple[str, str]  # (device, stream)


@dataclass
class Missing:
    """Seqs `first`..`last` of one stream have not arrived."""

    first: int
    last: int
    since: float  # monotonic: when it was seen missing
    asked: float | None = None
    tries: int = 0


@dataclass
class Counts:
    """What the replayer did."""

    asked: int = 0  # seqs asked for (each time)
    requests: int = 0
    recovered: int = 0  # seqs that arrived after they were asked for
    gone: int = 0  # seqs the device no longer had
    given_up: int = 0  # seqs asked TRIES times without an answer, or beyond TRACKED_MAX
    refused: dict[str, int] = field(default_factory=dict)  # the device's refusals, by reason


class Replayer:
    """Follows seqs, asks for the missing ones on its own thread (`edged-ingest-replay`)."""

    def __init__(
        self, client_id: str, request_topic: str, publish: Callable[[str, bytes], object], after_s: float
    ) -> None:
        self.client_id = client_id
        self.request_topic = request_topic  # a template with {device_id}
        self.publish = publish
        self.after_s = after_s
        self.counts = Counts()
        self._cond = threading.Condition()
        self._top: dict[Key, int] = {}
        self._missing: dict[Key, list[Missing]] = {}
        self._log: list[ReplayRow] = []
        self._ids = 0
        self._stopping = False
        self.thread = Supervised("edged-ingest-replay", target=self._loop)

    # -- what the writer tells it (edged-ingest-db thread) ---------------------------------------------

    def seed(self, streams: Iterable[Stream], gaps: Iterable[Gap]) -> None:
        """At start: each stream's highest seq, and the gaps the database already has (asked for again)."""
        now = time.monotonic()
        with self._cond:
            for s in streams:
                self._top[(s.device, s.pipeline)] = s.last
            for g in gaps:
                self._track((g.device, g.pipeline), Missing(g.first, g.last, now))
            self._cond.notify_all()

    def note(self, rows: Iterable[tuple[str, str, int]]) -> None:
        """Rows just written: advance each stream, open and close missing ranges."""
        now = time.monotonic()
        opened = False
        with self._cond:
            for device, stream, seq in rows:
                key = (device, stream)
                top = self._top.get(key)
                if top is None or seq == top + 1:
                    self._top[key] = seq if top is None else max(top, seq)
                elif seq > top + 1:
                    self._track(key, Missing(top + 1, seq - 1, now))
                    self._top[key] = seq
                    opened = True
                elif key in self._missing:
                    self._fill(key, seq)
            if opened:
                self._cond.notify_all()

    def answered(self, device: str, body: dict[str, Any]) -> None:
        """A device's answer to a request of ours: gone ranges are written down and no longer asked for."""
        rid, stream = body.get("id"), body.get("pipeline")
        if not isinstance(rid, str) or not rid.startswith(f"{self.client_id}-") or not isinstance(stream, str):
            return  # another ingest's, or a refusal without our id
        refused = body.get("refused")
        with self._cond:
            if isinstance(refused, str):
                self.counts.refused[refused[:32]] = self.counts.refused.get(refused[:32], 0) + 1
                return  # asked again at the next retry
            for first, last in _pairs(body.get("gone")):
                self._log.append(ReplayRow(device, stream, first, last, "gone", time.time()))
                self.counts.gone += self._drop((device, stream), first, last)

    def take_log(self) -> list[ReplayRow]:
        """The ranges asked for and found gone since the last call (the writer writes them)."""
        with self._cond:
            out, self._log = self._log, []
            return out

    def snapshot(self) -> dict[str, Any]:
        """The counters, and the seqs missing now."""
        with self._cond:
            c = self.counts
            missing = sum(m.last - m.first + 1 for ms in self._missing.values() for m in ms)
            return {"asked": c.asked, "requests": c.requests, "recovered": c.recovered, "gone": c.gone,
                    "given_up": c.given_up, "refused": dict(c.refused), "missing_now": missing}  # fmt: skip

    # -- the thread --------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start asking."""
        self.thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop asking."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self.thread.is_alive():
            self.thread.join(timeout)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and (wait := self._next_due_s()) != 0.0:
                    self._cond.wait(wait)  # None: asleep until a range opens
                if self._stopping:
                    return
                requests = self._due_requests()
            for topic, payload in requests:
                self.publish(topic, payload)

    def _next_due_s(self) -> float | None:
        now = time.monotonic()
        due = [
            (m.since + self.after_s) if m.asked is None else (m.asked + RETRY_S)
            for ms in self._missing.values()
            for m in ms
            if m.tries < TRIES
        ]
        return max(0.0, min(due) - now) if due else None

    def _due_requests(self) -> list[tuple[str, bytes]]:
        now, out = time.monotonic(), []
        for (device, stream), ms in self._missing.items():
            due = [m for m in ms if m.tries < TRIES and now >= ((m.since + self.after_s) if m.asked is None
                                                                  else (m.asked + RETRY_S))]  # fmt: skip
            ranges: list[list[int]] = []
            budget = MAX_SEQS
            for m in due[:MAX_RANGES]:
                last = min(m.last, m.first + budget - 1)
                ranges.append([m.first, last])
                budget -= last - m.first + 1
                m.asked, m.tries = now, m.tries + 1
                self._log.append(ReplayRow(device, stream, m.first, last, "asked", time.time()))
                if budget <= 0:
                    break
            if not ranges:
                continue
            self._ids += 1
            body = {"v": 1, "id": f"{self.client_id}-{self._ids}", "pipeline": stream, "ranges": ranges}
            self.counts.requests += 1
            self.counts.asked += sum(b - a + 1 for a, b in ranges)
            topic = self.request_topic.replace("{device_id}", device) + "/request"
            out.append((topic, json.dumps(body, separators=(",", ":")).encode("utf-8")))
        for key in [k for k, ms in self._missing.items() if all(m.tries >= TRIES for m in ms)]:
            for m in self._missing.pop(key):
                self.counts.given_up += m.last - m.first + 1
        return out

    # -- ranges (with the lock held) ---------------------------------------------------------------------

    def _track(self, key: Key, missing: Missing) -> None:
        ms = self._missing.setdefault(key, [])
        ms.append(missing)
        ms.sort(key=lambda m: m.first)
        while len(ms) > TRACKED_MAX:
            old = ms.pop(0)
            self.counts.given_up += old.last - old.first + 1

    def _fill(self, key: Key, seq: int) -> None:
        ms = self._missing[key]
        for i, m in enumerate(ms):
            if m.first <= seq <= m.last:
                if m.asked is not None:
                    self.counts.recovered += 1
                parts = [Missing(a, b, m.since, m.asked, m.tries) for a, b in ((m.first, seq - 1), (seq + 1, m.last))]
                ms[i : i + 1] = [p for p in parts if p.first <= p.last]
                break
        if not ms:
            del self._missing[key]

    def _drop(self, key: Key, first: int, last: int) -> int:
        """Stop following first..last of a stream; how many seqs were followed."""
        ms = self._missing.get(key, [])
        dropped, kept = 0, []
        for m in ms:
            lo, hi = max(m.first, first), min(m.last, last)
            if lo > hi:
                kept.append(m)
                continue
            dropped += hi - lo + 1
            kept += [Missing(a, b, m.since, m.asked, m.tries) for a, b in ((m.first, lo - 1), (hi + 1, m.last))
                     if a <= b]  # fmt: skip
        if kept:
            self._missing[key] = kept
        else:
            self._missing.pop(key, None)
        return dropped


def _pairs(value: object) -> list[tuple[int, int]]:
    """[[first, last], ...] from a device's answer, sane ones only."""
    if not isinstance(value, list):
        return []
    return [
        (p[0], p[1])
        for p in value[:1000]
        if isinstance(p, list) and len(p) == 2 and all(type(x) is int for x in p) and 1 <= p[0] <= p[1]
    ]
