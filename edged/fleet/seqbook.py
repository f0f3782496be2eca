"""What the ingest's replayer (replayer.py) knows of each stream: the top seq this ingest saw, the holes below
it that it did not see (not checked yet), the ranges it found missing from the database and asked for, and a
schedule of when each stream is due next (a heap: the replayer sleeps until the first entry is due).

Bounded: HOLES_MAX holes per stream (beyond, the oldest two merge: the check subtracts what the database has),
ASKED_MAX asked ranges per stream (beyond, the oldest are given up, counted), and streams with nothing to
follow are forgotten after IDLE_S without a row, or when more than STREAMS_MAX are followed (when one comes
back, the database says where it was: `resolve`). Not thread-safe: the replayer holds its lock.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from dataclasses import dataclass, field

HOLES_MAX = 256  # unchecked holes followed per stream; beyond, the oldest two are merged into one
ASKED_MAX = 256  # ranges asked for per stream; beyond, the oldest are given up (counted)
IDLE_S = 600.0  # a stream with nothing to follow and no row for this long is forgotten (the database has it)
STREAMS_MAX = 100_000  # streams followed at most; beyond, the least recently seen with nothing to follow go
CHECK_MAX = 2000  # streams one turn checks against the database
RETRY_S = 30.0  # a range still missing this long after it was asked for is asked again ...
TRIES = 3  # ... this many times at most

Key = tuple[str, str]  # (device, stream)
Ranges = list[tuple[int, int]]


@dataclass(slots=True)
class Missing:
    """Seqs `first`..`last` of one stream have not arrived here."""

    first: int
    last: int
    since: float  # monotonic: when it was seen missing
    asked: float | None = None
    tries: int = 0


@dataclass(slots=True)
class StreamState:
    """One stream as this ingest follows it."""

    top: int  # the highest seq seen
    seen: float  # monotonic: the last row
    holes: list[Missing] = field(default_factory=list)  # not seen here, not checked yet (sorted)
    asked: list[Missing] = field(default_factory=list)  # missing from the database, asked for (sorted)
    resolve: int | None = None  # new to this ingest at this seq: the database says what lies below ...
    born: float = 0.0  # ... after_s after this (monotonic: when this ingest first saw the stream)
    due: float | None = None  # when its entry in the schedule is due (None: not scheduled)

    def next_due(self, after_s: float) -> float | None:
        """When something of this stream is due next: its oldest hole, a retry, or the resolve."""
        times = [h.since + after_s for h in self.holes]
        times += [m.asked + RETRY_S for m in self.asked if m.asked is not None]
        if self.resolve is not None:
            times.append(self.born + after_s)
        return min(times) if times else None


@dataclass
class Counts:
    """What the replayer did."""

    asked: int = 0  # seqs asked for (each time)
    requests: int = 0
    recovered: int = 0  # seqs that arrived after they were asked for
    gone: int = 0  # seqs the device no longer had
    given_up: int = 0  # seqs asked TRIES times without them arriving, or beyond ASKED_MAX
    checked: int = 0  # seqs not seen here that another ingest had written (the check found them)
    claimed_elsewhere: int = 0  # seqs missing that another ingest had asked for already
    forgotten: int = 0  # idle streams forgotten (picked up again from the database when they return)
    check_errors: int = 0
    refused: dict[str, int] = field(default_factory=dict)  # the device's refusals, by reason
    foreign_answers: int = 0  # answers that match no outstanding request of ours (another ingest's, or forged)


@dataclass
class Turn:
    """What one turn of the replayer checks and asks, taken from the book."""

    resolve: list[tuple[str, str, int]] = field(default_factory=list)  # (device, stream, seq)
    holes: dict[Key, list[Missing]] = field(default_factory=dict)
    retries: dict[Key, list[Missing]] = field(default_factory=dict)


class SeqBook:
    """Every stream this ingest follows, and when each is due."""

    def __init__(self, after_s: float, *, resolving: bool) -> None:
        """`resolving`: a stream new to this ingest is looked up in the database (a shared state is there)."""
        self.after_s = after_s
        self.resolving = resolving
        self.counts = Counts()
        self.streams: OrderedDict[Key, StreamState] = OrderedDict()  # least recently seen first
        self._schedule: list[tuple[float, int, Key]] = []
        self._order = itertools.count()
        self._next_sweep: float | None = None

    def note(self, key: Key, seq: int, now: float) -> bool:
        """A row of `key` arrived here; True when that made something due earlier than before."""
        st = self.streams.get(key)
        if st is None:
            return self.reschedule(key, self.stream(key, seq, now, resolve=True))
        st.seen = now
        self.streams.move_to_end(key)
        if seq == st.top + 1:
            st.top = seq
        elif seq > st.top + 1:
            self.add_hole(st, Missing(st.top + 1, seq - 1, now))
            st.top = seq
            return self.reschedule(key, st)
        else:
            self._fill(st, seq)
        return False

    def stream(self, key: Key, seq: int, now: float, *, resolve: bool = False) -> StreamState:
        """The stream's state, made at `seq` when it is new here."""
        st = self.streams.get(key)
        if st is None:
            st = StreamState(top=seq, seen=now, resolve=seq if resolve and self.resolving else None, born=now)
            self.streams[key] = st
            if self._next_sweep is None:
                self._next_sweep = now + IDLE_S
            if len(self.streams) > STREAMS_MAX:
                self._forget(len(self.streams) - STREAMS_MAX)
        return st

    def reschedule(self, key: Key, st: StreamState) -> bool:
        """Put the stream in the schedule at its next due time; True when that is earlier than what was next."""
        due = st.next_due(self.after_s)
        if due is None or (st.due is not None and st.due <= due):
            return False
        st.due = due
        earlier = not self._schedule or due < self._schedule[0][0]
        heapq.heappush(self._schedule, (due, next(self._order), key))
        return earlier

    def add_hole(self, st: StreamState, hole: Missing) -> None:
        """A hole of one stream (kept sorted, at most HOLES_MAX)."""
        holes = st.holes
        holes.append(hole)
        if len(holes) > 1 and holes[-2].first > hole.first:
            holes.sort(key=lambda h: h.first)
        if len(holes) > HOLES_MAX:  # the oldest two as one: the check subtracts what is there
            a, b = holes[0], holes[1]
            holes[0:2] = [Missing(min(a.first, b.first), max(a.last, b.last), min(a.since, b.since))]

    def wait_s(self, now: float) -> float | None:
        """Seconds until the first entry is due, or the next sweep of idle streams (None: nothing followed)."""
        times = [self._schedule[0][0]] if self._schedule else []
        if self.streams and self._next_sweep is not None:
            times.append(self._next_sweep)
        return max(0.0, min(times) - now) if times else None

    def take_due(self, now: float) -> Turn:
        """Take what is due: streams to resolve, holes to check, asked ranges to retry (given up after TRIES)."""
        turn = Turn()
        self._sweep(now)
        while self._schedule and self._schedule[0][0] <= now and len(turn.holes) + len(turn.retries) < CHECK_MAX:
            due, _, key = heapq.heappop(self._schedule)
            st = self.streams.get(key)
            if st is None or st.due != due:
                continue  # forgotten, or rescheduled since
            st.due = None
            if st.resolve is not None and st.born + self.after_s <= now:
                turn.resolve.append((key[0], key[1], st.resolve))
                st.resolve = None
            ripe = [h for h in st.holes if h.since + self.after_s <= now]
            if ripe:
                st.holes = [h for h in st.holes if h.since + self.after_s > now]
                turn.holes[key] = ripe
            late = [m for m in st.asked if m.asked is not None and m.asked + RETRY_S <= now]
            if late:
                st.asked = [m for m in st.asked if not (m.asked is not None and m.asked + RETRY_S <= now)]
                retry = [m for m in late if m.tries < TRIES]
                self.counts.given_up += sum(m.last - m.first + 1 for m in late if m.tries >= TRIES)
                if retry:
                    turn.retries[key] = retry
            self.reschedule(key, st)
        return turn

    def put_back(self, turn: Turn) -> None:
        """A turn the database could not serve: its holes, retries and resolves wait for the next one."""
        for key, holes in turn.holes.items():
            if (st := self.streams.get(key)) is not None:
                for h in holes:
                    self.add_hole(st, h)
        for key, ms in turn.retries.items():
            if (st := self.streams.get(key)) is not None:
                st.asked = sorted(st.asked + ms, key=lambda m: m.first)
        for device, stream, seq in turn.resolve:
            if (st := self.streams.get((device, stream))) is not None:
                st.resolve = seq
        for key in {*turn.holes, *turn.retries, *((d, s) for d, s, _ in turn.resolve)}:
            if (st := self.streams.get(key)) is not None:
                self.reschedule(key, st)

    def asked(self, key: Key, ranges: Ranges, tries: int, now: float) -> None:
        """`ranges` of a stream were claimed and asked for (the `tries`-th time)."""
        st = self.streams.get(key)
        if st is None:
            return
        st.asked += [Missing(a, b, now, now, tries) for a, b in ranges]
        st.asked.sort(key=lambda m: m.first)
        while len(st.asked) > ASKED_MAX:
            old = st.asked.pop(0)
            self.counts.given_up += old.last - old.first + 1
        self.reschedule(key, st)

    def missing_now(self) -> int:
        """Seqs missing from the database and asked for, not arrived yet."""
        return sum(m.last - m.first + 1 for st in self.streams.values() for m in st.asked)

    def unchecked(self) -> int:
        """Seqs this ingest did not see that are not checked against the database yet (nor resolved)."""
        return sum(h.last - h.first + 1 for st in self.streams.values() for h in st.holes) + sum(
            1 for st in self.streams.values() if st.resolve is not None
        )

    def _fill(self, st: StreamState, seq: int) -> None:
        """A row below the top arrived: a hole or an asked range loses that seq."""
        for i, h in enumerate(st.holes):
            if h.first <= seq <= h.last:
                st.holes[i : i + 1] = split(h, seq)
                return
        for i, m in enumerate(st.asked):
            if m.first <= seq <= m.last:
                self.counts.recovered += 1
                st.asked[i : i + 1] = split(m, seq)
                return

    def _sweep(self, now: float) -> None:
        """Every IDLE_S: forget streams idle that long with nothing to follow (the database has them)."""
        if self._next_sweep is None or now < self._next_sweep:
            return
        self._next_sweep = now + IDLE_S
        idle = [k for k, st in self.streams.items() if _quiet(st) and st.seen + IDLE_S <= now]
        for key in idle:
            del self.streams[key]
        self.counts.forgotten += len(idle)

    def _forget(self, n: int) -> None:
        """The `n` least recently seen streams with nothing to follow go."""
        for key in [k for k, st in self.streams.items() if _quiet(st)][:n]:
            del self.streams[key]
            self.counts.forgotten += 1


def _quiet(st: StreamState) -> bool:
    return not st.holes and not st.asked and st.resolve is None and st.due is None


def split(m: Missing, seq: int) -> list[Missing]:
    """`m` without `seq` (0, 1 or 2 ranges)."""
    parts = [Missing(a, b, m.since, m.asked, m.tries) for a, b in ((m.first, seq - 1), (seq + 1, m.last))]
    return [p for p in parts if p.first <= p.last]


def drop(ms: list[Missing], first: int, last: int) -> int:
    """Stop following first..last among `ms` (in place); how many seqs were followed."""
    dropped, kept = 0, []
    for m in ms:
        lo, hi = max(m.first, first), min(m.last, last)
        if lo > hi:
            kept.append(m)
            continue
        dropped += hi - lo + 1
        kept += [Missing(a, b, m.since, m.asked, m.tries) for a, b in ((m.first, lo - 1), (hi + 1, m.last)) if a <= b]
    ms[:] = kept
    return dropped
