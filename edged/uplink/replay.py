"""Replay requests: a consumer that finds seqs missing asks the device to send them again (docs/mqtt.md, "Replay").

A broker acknowledges a result (PUBACK) and may still lose it: a crash, a bridge, a cluster node that fails.
The device keeps what it sent for a while (store/window.py); a consumer (`edged ingest`, or any subscriber)
publishes on `<mqtt.replay_topic>/request`

    {"v": 1, "id": "r-17", "pipeline": "cam0", "ranges": [[562, 580], [600, 600]]}

and the device sends those results again from its window, on their own topics with their own seqs and
payloads (the same bytes), and answers on `<mqtt.replay_topic>/answer`

    {"v": 1, "device": "pi-01", "id": "r-17", "pipeline": "cam0", "ts": ..., "replayed": [[562, 580]],
     "pending": [], "gone": [[600, 600]], "window": [410, 7001]}

`pending`: seqs still in the spool waiting for their first delivery (they come anyway); `gone`: seqs the
window does not hold (out of it, dropped or dead-lettered on the device, or never used: the
device's stats and gap messages tell which); `window`: the lowest and highest seq of the stream it holds.

`over_budget`: seqs the window holds but the hour's budget does not cover now (asked again later, they come).

The request is not signed: anyone on the broker who may publish there can ask, and all it can get is results
sent again to the topics they went to before (the same readers, the same bytes), within bounds: a request of
MAX_SEQS seqs at most (overlapping ranges merged first: 64 copies of one range cost one), REPLAY_PER_S results
a second, and `mqtt.replay_max_bytes_per_hour` bytes an hour, results sent again and answers together (32 MiB,
twice the default window: a broker crash that lost the whole window can have it back twice an hour). So the
worst an allowed requester can cause is that budget an hour, plus one refusal answer a second (the other
refusals are only counted). A result sent again never
re-enters the window (store/window.py). No command, no config, nothing else. A request that is malformed, too
large or over the rate is answered with `refused` and its reason, and counted.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from edged.core.errors import InputError
from edged.core.safejson import loads
from edged.core.settings import NAME_MAX
from edged.store.outlet import ReplaySource, Row
from edged.uplink.hooks import Hook, Incoming, Session
from edged.uplink.mqttclient import TokenBucket

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 4096
MAX_RANGES = 64
MAX_SEQS = 5000  # seqs one request may ask for
REPLAY_PER_S = 1000.0  # results sent again per second at most (a bucket of MAX_SEQS)
QUEUED_MAX = 32  # requests waiting for the edged-mqtt thread; beyond, the newest is refused
REFUSAL_ANSWER_S = 1.0  # refusals are answered at most once per this many seconds (the others only counted)
SEQ_MAX = 2**63 - 1

Ranges = list[list[int]]


def _ranges(seqs: list[int]) -> Ranges:
    """Sorted seqs -> [[first, last], ...]."""
    out: Ranges = []
    for seq in seqs:
        if out and seq == out[-1][1] + 1:
            out[-1][1] = seq
        else:
            out.append([seq, seq])
    return out


def merge(ranges: Ranges) -> Ranges:
    """Overlapping and adjacent ranges as one: [[5, 9], [1, 3], [4, 6]] -> [[1, 9]]."""
    out: Ranges = []
    for first, last in sorted(ranges):
        if out and first <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], last)
        else:
            out.append([first, last])
    return out


def parse_request(payload: bytes) -> tuple[str, str, Ranges]:
    """(id, stream, ranges) of a request; InputError naming what is wrong."""
    body = loads(payload, max_bytes=MAX_REQUEST_BYTES, what="replay request")
    if not isinstance(body, dict) or body.get("v") != 1:
        raise InputError("malformed", 'a replay request is {"v": 1, "id", "pipeline", "ranges": [[first, last]]}')
    rid, stream, ranges = body.get("id", ""), body.get("pipeline"), body.get("ranges")
    if not isinstance(rid, str) or len(rid) > 128:
        raise InputError("malformed", "id: a string of 128 characters at most")
    if not isinstance(stream, str) or not 0 < len(stream) <= 2 * NAME_MAX + 8:
        raise InputError("malformed", "pipeline: the stream's name (cam0, or cam0/events)")
    if not isinstance(ranges, list) or not 0 < len(ranges) <= MAX_RANGES:
        raise InputError("malformed", f"ranges: a list of 1 to {MAX_RANGES} [first, last] pairs")
    out: Ranges = []
    for pair in ranges:
        ok = isinstance(pair, list) and len(pair) == 2 and all(type(s) is int for s in pair)
        if not ok or not 1 <= pair[0] <= pair[1] <= SEQ_MAX:
            raise InputError("malformed", f"ranges: {str(pair)[:40]} is not [first, last] with 1 <= first <= last")
        out.append([pair[0], pair[1]])
    out = merge(out)
    if sum(b - a + 1 for a, b in out) > MAX_SEQS:
        raise InputError("too_large", f"ranges: more than {MAX_SEQS} seqs in one request")
    return rid, stream, out


def _request_id(payload: bytes) -> str | None:
    """The id of a request refused for its content, when it has a readable one (else None)."""
    try:
        body = loads(payload, max_bytes=MAX_REQUEST_BYTES, what="replay request")
    except InputError:
        return None
    rid = body.get("id") if isinstance(body, dict) else None
    return rid if isinstance(rid, str) and len(rid) <= 128 else None


class ReplayRequests(Hook):
    """Listens on the request topic (paho's thread: queue and wake), answers on the edged-mqtt thread."""

    def __init__(self, spool: ReplaySource, device_id: str, topic: str, bytes_per_hour: int) -> None:
        """`bytes_per_hour`: payload bytes sent again per hour at most (0: no hourly bound)."""
        self.spool = spool
        self.device_id = device_id
        self.request_topic = f"{topic}/request"
        self.answer_topic = f"{topic}/answer"
        self._lock = threading.Lock()
        self._queue: deque[bytes] = deque()
        self._wake: Callable[[], None] = lambda: None
        self._bucket = TokenBucket(REPLAY_PER_S, burst=float(MAX_SEQS))
        self._hourly = TokenBucket(bytes_per_hour / 3600.0, burst=float(bytes_per_hour))
        self._refusal_answered = -REFUSAL_ANSWER_S  # monotonic time of the last refusal answered
        self.counts = {"requests": 0, "replayed": 0, "replayed_bytes": 0, "gone": 0, "over_budget": 0,
                       "refused": 0, "unanswered": 0}  # fmt: skip

    def bind(self, wake: Callable[[], None]) -> None:
        """Keep the publisher's wake-up."""
        self._wake = wake

    def connected(self, session: Session) -> None:
        """Listen for requests on every connection."""
        session.subscribe([self.request_topic], self._granted, self.message, on="replay")

    def _granted(self, ok: bool | None) -> None:
        if ok is False:  # None: the connection went (nothing was refused)
            log.warning("mqtt: no replay on this connection: the broker refused %s", self.request_topic)

    def message(self, message: Incoming) -> None:
        """Queue it (bounded: a flood costs a refusal count, nothing else)."""
        with self._lock:
            if len(self._queue) >= QUEUED_MAX:
                self.counts["refused"] += 1
                return
            self._queue.append(bytes(message.payload[: MAX_REQUEST_BYTES + 1]))
        self._wake()

    def turn(self, session: Session) -> float | None:
        """Answer what waits."""
        while True:
            with self._lock:
                if not self._queue:
                    return None
                payload = self._queue.popleft()
            answer = self.answer(payload)
            encoded = json.dumps(answer, separators=(",", ":")).encode("utf-8")
            if "refused" in answer:
                now = time.monotonic()
                if now - self._refusal_answered < REFUSAL_ANSWER_S:
                    with self._lock:
                        self.counts["unanswered"] += 1  # counted, not answered: a flood gets one answer a second
                    continue
                self._refusal_answered = now
            else:
                self._hourly.take(len(encoded))  # an answer counts toward the hour's budget like a result
            session.publish(self.answer_topic, encoded)

    def answer(self, payload: bytes) -> dict[str, Any]:
        """Send again what the window holds of the request; the answer."""
        base: dict[str, Any] = {"v": 1, "device": self.device_id, "ts": round(time.time(), 3)}
        try:
            rid, stream, ranges = parse_request(payload)
        except InputError as exc:
            with self._lock:
                self.counts["refused"] += 1
            return {**base, "id": _request_id(payload), "refused": exc.reason, "detail": str(exc)}
        if self._hourly.rate and self._hourly.allow() <= 0:
            return self._over_budget(base, rid, stream, 0)
        wanted = sum(b - a + 1 for a, b in ranges)
        if not self._take(wanted):
            with self._lock:
                self.counts["refused"] += 1
            return {**base, "id": rid, "pipeline": stream, "refused": "busy",
                    "detail": f"at most {REPLAY_PER_S:.0f} results a second are sent again; ask later"}  # fmt: skip
        rows, waiting = [], []
        for first, last in ranges:
            got, pending = self.spool.window_rows(stream, first, last, last - first + 1)
            rows += got
            waiting += pending
        found = {r.seq for r in rows}
        rows, held = self._within_budget(rows)
        if not rows and held:
            return self._over_budget(base, rid, stream, len(held))
        self.spool.send_again(rows)
        sent = {r.seq for r in rows}
        known = found | set(waiting)
        gone = [s for a, b in ranges for s in range(a, b + 1) if s not in known]
        with self._lock:
            self.counts["requests"] += 1
            self.counts["replayed"] += len(rows)
            self.counts["replayed_bytes"] += sum(len(r.payload) for r in rows)
            self.counts["gone"] += len(gone)
            self.counts["over_budget"] += len(held)
        if rows or gone:
            log.info("replay %s: %s sent again %d result(s), %d gone", rid or "-", stream, len(rows), len(gone))
        answer = {**base, "id": rid, "pipeline": stream, "replayed": _ranges(sorted(sent)),
                  "pending": _ranges(sorted(set(waiting))), "gone": _ranges(gone),
                  "window": self.spool.window_span(stream)}  # fmt: skip
        if held:
            answer["over_budget"] = _ranges(sorted(held))
        return answer

    def _over_budget(self, base: dict[str, Any], rid: str, stream: str, held: int) -> dict[str, Any]:
        with self._lock:
            self.counts["refused"] += 1
            self.counts["over_budget"] += held
        return {**base, "id": rid, "pipeline": stream, "refused": "budget",
                "detail": f"{self._hourly.burst:.0f} bytes an hour are sent again at most "
                          "(mqtt.replay_max_bytes_per_hour); ask later"}  # fmt: skip

    def _within_budget(self, rows: list[Row]) -> tuple[list[Row], list[int]]:
        """The rows the hour's budget covers now, by seq (spent), and the seqs of the others."""
        allowed = self._hourly.allow()
        fits, spent = 0, 0
        for row in rows:
            if spent + len(row.payload) > allowed:
                break
            spent += len(row.payload)
            fits += 1
        self._hourly.take(spent)
        return rows[:fits], [r.seq for r in rows[fits:]]

    def _take(self, n: int) -> bool:
        if self._bucket.allow() < n:
            return False
        self._bucket.take(n)
        return True

    def snapshot(self) -> dict[str, int]:
        """Counters for the status JSON (`mqtt.replay`)."""
        with self._lock:
            return dict(self.counts)
