"""The ingest's side of replay (docs/mqtt.md, "Replay"): find the seqs no ingest has and ask the device.

A broker may acknowledge a result and lose it (a crash, a bridge, a failed cluster node). The ingest follows
each stream's seqs as rows are written (seqbook.py): a seq past the highest one seen opens a *hole*, a row
inside one fills it. A hole is only what this ingest did not see: with several ingests in one shared group most
holes are rows another ingest wrote. So a hole still open after `replay_after_s` is checked against the
database, the fleet's shared state (replaystate.py: one query for every stream due), and only the seqs no
ingest has are *claimed* (written down as asked, under a lock per stream, so two ingests never ask for the same
loss) and asked for on the device's request topic: at most MAX_SEQS seqs and MAX_RANGES ranges a request.
Still missing after RETRY_S, a range is claimed and asked for again, up to TRIES times. The device sends what
its window holds again and answers with what is gone; an answer counts only for a request of ours that is
still outstanding, from the device it went to, and only within what that request asked; gone ranges are
written to the database (`replay_ranges`), so the report tells recovered from lost.

Costs: with one ingest at steady state (no seq missing) a dictionary update per row and nothing else; with
several, one read per `replay_after_s` covering every stream with holes; nothing on the air unless a seq is
missing from the database. Seqs before the first one the database holds of a stream are not asked for (the
ingest may have joined late); a loss at the very end of a stream shows once the next result arrives.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

from edged.core.errors import IngestError
from edged.core.threads import Supervised
from edged.fleet.ingestdb import Gap, ReplayRow
from edged.fleet.replaystate import ReplayState, as_ranges, subtract
from edged.fleet.seqbook import RETRY_S, Key, Missing, Ranges, SeqBook, Turn, drop

log = logging.getLogger(__name__)

MAX_SEQS = 5000  # seqs one request asks for at most (the device refuses more)
MAX_RANGES = 64
OUTSTANDING_MAX = 4096  # requests whose answers are awaited; beyond, the oldest are forgotten

# (ranges to claim, the asked ranges among them that are retries)
Wanted = dict[Key, tuple[Ranges, list[Missing]]]


class Replayer:
    """Follows seqs, checks what it did not see against the database, asks for what no ingest has, on its own
    thread (`edged-ingest-replay`)."""

    def __init__(
        self,
        client_id: str,
        request_topic: str,
        publish: Callable[[str, bytes], object],
        after_s: float,
        state: ReplayState | None = None,
    ) -> None:
        """`state`: the shared database (None: this ingest's own view alone, for a test)."""
        self.client_id = client_id
        self.request_topic = request_topic  # a template with {device_id}
        self.publish = publish
        self.state = state
        self.book = SeqBook(after_s, resolving=state is not None)
        self.counts = self.book.counts
        self._cond = threading.Condition()
        self._outstanding: OrderedDict[str, tuple[Key, Ranges]] = OrderedDict()
        self._log: list[ReplayRow] = []
        self._ids = 0
        self._in_turn = 0  # unchecked seqs in the turn being checked now
        self._stopping = False
        self.thread = Supervised("edged-ingest-replay", target=self._loop)

    # -- what the writer tells it (edged-ingest-db thread) ---------------------------------------------

    def seed(self, gaps: Iterable[Gap]) -> None:
        """At start: the gaps the database already has, checked (and asked for) at once."""
        now = time.monotonic()
        book = self.book
        with self._cond:
            for g in gaps:
                key = (g.device, g.pipeline)
                st = book.stream(key, g.last + 1, now)
                book.add_hole(st, Missing(g.first, g.last, now - book.after_s))
                book.reschedule(key, st)
            self._cond.notify_all()

    def note(self, rows: Iterable[tuple[str, str, int]]) -> None:
        """Rows just written: advance each stream, open and fill holes."""
        now = time.monotonic()
        woke = False
        with self._cond:
            for device, stream, seq in rows:
                woke |= self.book.note((device, stream), seq, now)
            if woke:
                self._cond.notify_all()

    def answered(self, device: str, body: dict[str, Any]) -> None:
        """A device's answer: believed only for a request of ours still outstanding, from the device it went
        to, and only within the ranges it asked; gone ranges are written down and no longer asked for."""
        rid, stream = body.get("id"), body.get("pipeline")
        with self._cond:
            entry = self._outstanding.get(rid) if isinstance(rid, str) else None
            if entry is None or entry[0] != (device, stream) or not isinstance(rid, str):
                self.counts.foreign_answers += 1  # another ingest's, a refusal without an id, or forged
                return
            refused = body.get("refused")
            if isinstance(refused, str):
                self.counts.refused[refused[:32]] = self.counts.refused.get(refused[:32], 0) + 1
                return  # asked again at the next retry
            del self._outstanding[rid]
            key, asked = entry
            st = self.book.streams.get(key)
            for first, last in clip(_pairs(body.get("gone")), asked):
                self._log.append(ReplayRow(device, key[1], first, last, "gone", time.time()))
                self.counts.gone += drop(st.asked, first, last) if st is not None else 0

    def take_log(self) -> list[ReplayRow]:
        """The ranges found gone since the last call (the writer writes them; the claim writes asked ones)."""
        with self._cond:
            out, self._log = self._log, []
            return out

    def snapshot(self) -> dict[str, Any]:
        """The counters, and the seqs missing now (missing from the database, being asked for)."""
        with self._cond:
            c = self.counts
            return {"asked": c.asked, "requests": c.requests, "recovered": c.recovered, "gone": c.gone,
                    "given_up": c.given_up, "refused": dict(c.refused), "missing_now": self.book.missing_now(),
                    "unchecked": self.book.unchecked() + self._in_turn,
                    "checked": c.checked, "claimed_elsewhere": c.claimed_elsewhere,
                    "streams": len(self.book.streams), "forgotten": c.forgotten, "check_errors": c.check_errors,
                    "foreign_answers": c.foreign_answers}  # fmt: skip

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
                while not self._stopping and (wait := self.book.wait_s(time.monotonic())) != 0.0:
                    self._cond.wait(wait)  # None: asleep until a hole opens
                if self._stopping:
                    return
                turn = self.book.take_due(time.monotonic())
                self._in_turn = sum(h.last - h.first + 1 for hs in turn.holes.values() for h in hs) + len(turn.resolve)
            try:
                requests = self._claim(self._check(turn))
            except IngestError as exc:  # the database is away: the ranges go back, checked again later
                log.warning("ingest: cannot check missing seqs against the database: %s", exc)
                with self._cond:
                    self.book.put_back(turn)
                    self._in_turn = 0
                    self.counts.check_errors += 1
                    self._cond.wait(min(RETRY_S, max(1.0, self.book.after_s)))
                continue
            with self._cond:
                self._in_turn = 0
            for topic, payload in requests:
                self.publish(topic, payload)

    def _check(self, turn: Turn) -> Wanted:
        """What of the turn's holes no ingest wrote, and its retries (the database answers without the lock)."""
        state, book = self.state, self.book
        if turn.resolve and state is not None:
            tops = state.tops_below(turn.resolve)
            now = time.monotonic()
            for device, stream, seq in turn.resolve:
                below = tops.get((device, stream))
                if below is not None and below < seq - 1:  # lost while this ingest did not follow the stream
                    turn.holes.setdefault((device, stream), []).append(Missing(below + 1, seq - 1, now))
        spans = [(k[0], k[1], h.first, h.last) for k, hs in turn.holes.items() for h in hs]
        present = state.present(spans) if state is not None and spans else set()
        by_key: dict[Key, list[int]] = {}
        for device, stream, seq in present:
            by_key.setdefault((device, stream), []).append(seq)
        wanted: Wanted = {}
        for key, holes in turn.holes.items():
            found = as_ranges(sorted(set(by_key.get(key, ()))))
            missing = subtract([(h.first, h.last) for h in holes], found)
            with self._cond:
                book.counts.checked += sum(b - a + 1 for a, b in found)
            if missing:
                wanted[key] = (missing, [])
        for key, ms in turn.retries.items():
            ranges, old = wanted.get(key, ([], []))
            wanted[key] = (ranges + [(m.first, m.last) for m in ms], old + ms)
        return wanted

    def _claim(self, wanted: Wanted) -> list[tuple[str, bytes]]:
        """Claim each stream's missing ranges (one request's worth; the rest due again at once) and build the
        requests for what the claims gave this ingest."""
        out = []
        book = self.book
        for (device, stream), (candidates, retried) in wanted.items():
            ranges, rest = one_request(sorted(candidates))
            if self.state is not None:
                claimed, present = self.state.claim(device, stream, ranges, self.client_id, time.time(), RETRY_S)
            else:
                claimed, present = ranges, []
            now = time.monotonic()
            with self._cond:
                c = book.counts
                c.recovered += sum(1 for s in present if any(m.first <= s <= m.last for m in retried))
                c.claimed_elsewhere += sum(b - a + 1 for a, b in subtract(subtract(ranges, claimed),
                                                                          as_ranges(sorted(present))))  # fmt: skip
                st = book.streams.get((device, stream))
                if st is None:
                    continue
                for a, b in rest:
                    book.add_hole(st, Missing(a, b, now - book.after_s))
                tries = max((m.tries for m in retried), default=0) + 1
                if claimed:
                    out.append(self._request(device, stream, claimed))
                    book.asked((device, stream), claimed, tries, now)
                book.reschedule((device, stream), st)
        return out

    def _request(self, device: str, stream: str, ranges: Ranges) -> tuple[str, bytes]:
        """One request (with the lock), remembered until answered."""
        self._ids += 1
        rid = f"{self.client_id}-{self._ids}"
        body = {"v": 1, "id": rid, "pipeline": stream, "ranges": [list(r) for r in ranges]}
        self._outstanding[rid] = ((device, stream), ranges)
        while len(self._outstanding) > OUTSTANDING_MAX:
            self._outstanding.popitem(last=False)
        self.counts.requests += 1
        self.counts.asked += sum(b - a + 1 for a, b in ranges)
        topic = self.request_topic.replace("{device_id}", device) + "/request"
        return topic, json.dumps(body, separators=(",", ":")).encode("utf-8")


def one_request(ranges: Ranges) -> tuple[Ranges, Ranges]:
    """(what one request asks: MAX_RANGES ranges and MAX_SEQS seqs at most, the rest)."""
    out: Ranges = []
    budget = MAX_SEQS
    for i, (a, b) in enumerate(ranges):
        if len(out) == MAX_RANGES or budget == 0:
            return out, ranges[i:]
        last = min(b, a + budget - 1)
        out.append((a, last))
        budget -= last - a + 1
        if last < b:
            return out, [(last + 1, b), *ranges[i + 1 :]]
    return out, []


def clip(pairs: list[tuple[int, int]], asked: Ranges) -> Ranges:
    """What of `pairs` lies within the ranges a request asked for."""
    out: Ranges = []
    for a, b in pairs:
        for lo, hi in asked:
            x, y = max(a, lo), min(b, hi)
            if x <= y:
                out.append((x, y))
    return out


def _pairs(value: object) -> list[tuple[int, int]]:
    """[[first, last], ...] from a device's answer, sane ones only."""
    if not isinstance(value, list):
        return []
    return [
        (p[0], p[1])
        for p in value[:1000]
        if isinstance(p, list) and len(p) == 2 and all(type(x) is int for x in p) and 1 <= p[0] <= p[1]
    ]
