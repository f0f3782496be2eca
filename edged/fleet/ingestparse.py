"""What `edged ingest` believes of a message, and what it refuses: the parsing at its boundary.

Anyone who can publish on the broker can send the ingest any bytes, so each message is read at bounded cost
(core/safejson.py: size, nesting, finite numbers, no NUL) and checked field by field: a seq within SQLite's
and PostgreSQL's 64-bit integer, a finite `ts` of this era, short names. A message that fails is not a row:
it is a `RefusedError` with a reason key, and the ingest puts it in the quarantine table and acknowledges it.

**Identity comes from the topic, not the payload.** The broker's ACLs let a device publish only under its own
topics (docs/security.md), so the topic says who sent a message; the payload only claims it. The topic
filters name the device and the pipeline with `+` levels, in that order (`edged/+/+/results`); a payload whose
`device` or `pipeline` differs from its topic's is refused (`identity_mismatch`), so a device cannot write
rows, stats or gaps for another.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from edged.core.errors import InputError
from edged.core.safejson import loads
from edged.core.streams import EVENTS, events_key
from edged.fleet.ingestdb import CorrectionRow, GapRow, ResultRow, StatsRow

MAX_MESSAGE_BYTES = 8 << 20  # a batch of results with masks fits; larger is refused (`too_large`)
MAX_NAME = 256  # characters of a device or pipeline name
SEQ_MAX = 2**63 - 1  # BIGINT: SQLite's and PostgreSQL's integer
TS_MAX = 1e11  # seconds since 1970: the year 5138; beyond is not a clock
BATCH_MAX = 10_000  # results in one array message
BOOT_MAX = 64  # characters of a boot id (a UUID is 36)
CORRECTIONS_MAX = 64  # corrections in one clock message (a device keeps 16)
EARLIEST_TS = 1_577_836_800.0  # 2020-01-01: a correction that puts a capture before this is no correction
FUTURE_S = 86_400.0  # ... nor one that puts it more than a day past the ingest's now


class RefusedError(ValueError):
    """A message the ingest does not land: `reason` is the quarantine's key, the message says why."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


@dataclass(frozen=True)
class Identity:
    """Who sent a message, by its topic (None where the filter names no such level)."""

    device: str | None
    pipeline: str | None


def topic_identity(topic_filter: str, topic: str) -> Identity:
    """The device and pipeline of `topic` at the `+` levels of `topic_filter` (first the device, then the
    pipeline)."""
    levels = topic.split("/")
    wild = [levels[i] for i, part in enumerate(topic_filter.split("/")) if part == "+" and i < len(levels)]
    return Identity(wild[0] if wild else None, wild[1] if len(wild) > 1 else None)


def wildcard_levels(topic_filter: str) -> int:
    """How many `+` levels a filter has."""
    return topic_filter.split("/").count("+")


def _load(payload: bytes, what: str) -> object:
    try:
        return loads(payload, max_bytes=MAX_MESSAGE_BYTES, what=what)
    except InputError as exc:
        raise RefusedError(exc.reason, str(exc)) from None


def _name(value: object, field: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME:
        raise RefusedError("malformed", f"{field} must be a string of 1 to {MAX_NAME} characters")
    return value


def _seq(value: object, field: str = "seq") -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= SEQ_MAX:
        raise RefusedError("out_of_range", f"{field} must be an integer from 1 to 2^63-1")
    return value


def _ts(value: object) -> float:
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not (math.isfinite(value) and 0 <= value < TS_MAX)
    ):
        raise RefusedError("out_of_range", "ts must be a number of seconds since 1970, finite and before 5138")
    return float(value)


def _same(claimed: str, sent: str | None, field: str) -> None:
    if sent is not None and claimed != sent:
        raise RefusedError(
            "identity_mismatch", f"the payload's {field} {claimed[:64]!r} is not its topic's {sent[:64]!r}"
        )


def parse_results(payload: bytes, sender: Identity) -> list[ResultRow]:
    """The result rows of one message (a JSON object, or an array with `mqtt.batch` > 1)."""
    data = _load(payload, "result message")
    single = not isinstance(data, list)
    items = [data] if single else data
    if not isinstance(items, list) or not 0 < len(items) <= BATCH_MAX:
        raise RefusedError("malformed", f"a result message is an object or an array of 1 to {BATCH_MAX}")
    rows = []
    for item in items:
        if not isinstance(item, dict):
            raise RefusedError("malformed", "a result must be a JSON object")
        device, pipeline = _name(item.get("device"), "device"), _name(item.get("pipeline"), "pipeline")
        _same(device, sender.device, "device")
        _same(pipeline, sender.pipeline, "pipeline")
        seq, ts = _seq(item.get("seq")), _ts(item.get("ts"))
        body = payload.decode("utf-8") if single else json.dumps(item, separators=(",", ":"))  # as sent
        if item.get("stream") == EVENTS:  # a pipeline's events have their own seq: keyed as the spool keys them
            pipeline = events_key(pipeline)
        rows.append(ResultRow(device, pipeline, seq, ts, body, *_clock(item.get("clock"))))
    return rows


def _boot(value: object, field: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= BOOT_MAX:
        raise RefusedError("malformed", f"{field} must be a string of 1 to {BOOT_MAX} characters")
    return value


def _seconds(value: object, field: str, low: float = 0.0) -> float:
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not (math.isfinite(value) and low <= value < TS_MAX)
    ):
        raise RefusedError("out_of_range", f"{field} must be a finite number of seconds")
    return float(value)


def _clock(clock: object) -> tuple[float | None, str | None, str | None, float | None]:
    """(ts_original, clock, clock_boot, clock_mono) of a result's `clock` object (core/clock.py): all None for
    a result stamped by a synchronized clock."""
    if clock is None:
        return None, None, None, None
    if not isinstance(clock, dict):
        raise RefusedError("malformed", "clock must be an object")
    if clock.get("synced") is not False:
        return None, None, None, None
    boot, mono = _boot(clock.get("boot"), "clock.boot"), _seconds(clock.get("mono"), "clock.mono")
    if clock.get("corrected") is True:
        return _ts(clock.get("ts_original")), "corrected", boot, mono
    return None, "unsynced", boot, mono


def parse_clock(payload: bytes, sender: Identity, now: float) -> list[CorrectionRow]:
    """A device's clock message: the corrections of the times it stamped while not synchronized. Empty (a
    retained message cleared): nothing, ignored. A correction that puts its moment before 2020 or more than a day
    after `now` is refused (`implausible`): one forged message must not move a device's rows to 1979."""
    if not payload:
        return []
    data = _load(payload, "clock message")
    corrections = data.get("corrections") if isinstance(data, dict) else None
    if not isinstance(data, dict) or not isinstance(corrections, list) or len(corrections) > CORRECTIONS_MAX:
        raise RefusedError("malformed", f"a clock message is a JSON object with at most {CORRECTIONS_MAX} corrections")
    device = _name(data.get("device"), "device")
    _same(device, sender.device, "device")
    rows = []
    for c in corrections:
        if not isinstance(c, dict):
            raise RefusedError("malformed", "a correction is an object with boot, mono and offset")
        boot, mono = _boot(c.get("boot"), "boot"), _seconds(c.get("mono"), "mono")
        offset = _seconds(c.get("offset"), "offset", -TS_MAX)
        if not EARLIEST_TS <= mono + offset <= now + FUTURE_S:
            raise RefusedError("implausible", f"a correction puts boot {boot[:16]}'s moment {mono:.0f} s at "
                               f"{mono + offset:.0f} (epoch s): before 2020 or more than a day from now")  # fmt: skip
        rows.append(CorrectionRow(device, boot, mono, offset))
    return rows


def parse_gap(payload: bytes, sender: Identity) -> GapRow:
    """A gap message: a seq range of one stream that a device skipped after an unclean stop."""
    data = _load(payload, "gap message")
    gap = data.get("gap") if isinstance(data, dict) else None
    if not isinstance(data, dict) or not isinstance(gap, dict):
        raise RefusedError("malformed", "a gap message is a JSON object with a device, a pipeline and a gap")
    device, pipeline = _name(data.get("device"), "device"), _name(data.get("pipeline"), "pipeline")
    _same(device, sender.device, "device")
    _same(pipeline, sender.pipeline, "pipeline")
    first, last = _seq(gap.get("first"), "gap.first"), _seq(gap.get("last"), "gap.last")
    if first > last:
        raise RefusedError("malformed", "a gap's first seq is after its last")
    key = events_key(pipeline) if data.get("stream") == EVENTS else pipeline
    return GapRow(device, key, first, last, payload.decode("utf-8"))


def parse_stats(payload: bytes, sender: Identity, now: float) -> StatsRow:
    """A device's stats message (`ts` missing: the time it arrived)."""
    data = _load(payload, "stats message")
    if not isinstance(data, dict):
        raise RefusedError("malformed", "a stats message is a JSON object with a device")
    device = _name(data.get("device"), "device")
    _same(device, sender.device, "device")
    ts = data.get("ts")
    return StatsRow(device, now if ts is None else _ts(ts), payload.decode("utf-8"))
