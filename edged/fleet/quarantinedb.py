"""The quarantine's bounds (ingestdb.py writes it): what the ingest refused is kept for an operator to look at,
but a client that floods the broker with junk must not fill the database or slow the real results.

- At most `--quarantine-rows` (1,000) refused messages per device (the device their topic names; one bucket
  for topics that name none) and `--quarantine-bytes` (64 MiB) of them in all: the oldest go first, and what
  went is counted per device in `quarantine_dropped` (`edged ingest --report` shows it).
- Per device at most QUARANTINE_PER_S refused messages a second are written at all (ingest.py); the others
  are counted (`quarantine_skipped`) and acknowledged like the rest, so a junk flood costs the database a
  bounded trickle and real results land at their speed.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

QUARANTINE_PER_S = 10.0  # refused messages of one device written per second at most ...
QUARANTINE_BURST = 100.0  # ... after a burst of this many
TRIM_WALK = 500  # rows one step of the byte trim reads

SCHEMA = ("CREATE TABLE IF NOT EXISTS quarantine_dropped (device TEXT NOT NULL PRIMARY KEY, "
          "dropped BIGINT NOT NULL)")  # fmt: skip
DROPPED = "SELECT device, dropped FROM quarantine_dropped"

Run = Callable[[str, tuple[Any, ...]], list[tuple[Any, ...]]]  # (SQL, parameters) -> rows, in the open transaction


def _where(device: str | None) -> str:
    return "device IS NULL" if device is None else "device = {p}"


def trim(  # noqa: PLR0917  (one transaction's bounds)
    run: Run, p: str, address: tuple[str, str], devices: set[str | None], max_rows: int, max_bytes: int
) -> dict[str, int]:
    """Delete the oldest refused messages beyond the bounds (for the devices that just got some, and in all);
    how many went per device ('' for topics that name none). `p` is the dialect's placeholder, `address` its
    row address and that address's placeholder (SQLite's rowid, PostgreSQL's ctid)."""
    rowid, rowid_p = address
    dropped: dict[str, int] = {}
    for device in devices:
        args: tuple[Any, ...] = () if device is None else (device,)
        where = _where(device).format(p=p)
        (count,) = run(f"SELECT COUNT(*) FROM quarantine WHERE {where}", args)[0]  # noqa: S608  (our SQL)
        if int(count) > max_rows:
            over = int(count) - max_rows
            run(f"DELETE FROM quarantine WHERE {rowid} IN (SELECT {rowid} FROM quarantine WHERE {where} "  # noqa: S608
                f"ORDER BY received LIMIT {p})", (*args, over))  # fmt: skip
            dropped[device or ""] = dropped.get(device or "", 0) + over
    (total,) = run("SELECT COALESCE(SUM(LENGTH(payload)), 0) FROM quarantine", ())[0]
    excess = int(total) - max_bytes
    while excess > 0:
        oldest = run(f"SELECT {rowid}, device, LENGTH(payload) FROM quarantine ORDER BY received LIMIT {p}",  # noqa: S608
                     (TRIM_WALK,))  # fmt: skip
        if not oldest:
            break
        gone = []
        for where_row, device, size in oldest:
            gone.append(where_row)
            dropped[device or ""] = dropped.get(device or "", 0) + 1
            excess -= int(size)
            if excess <= 0:
                break
        for where_row in gone:
            run(f"DELETE FROM quarantine WHERE {rowid} = {rowid_p}", (where_row,))  # noqa: S608
    for device, n in dropped.items():
        run(f"INSERT INTO quarantine_dropped VALUES ({p}, {p}) ON CONFLICT (device) DO UPDATE "  # noqa: S608
            "SET dropped = quarantine_dropped.dropped + excluded.dropped", (device, n))  # fmt: skip
    return dropped


class QuarantineGate:
    """Whether a refused message of a device is written now (QUARANTINE_PER_S a second per device, after a burst
    of QUARANTINE_BURST), or only counted. Devices' buckets are bounded (the least recently refused go)."""

    DEVICES_KEPT = 10_000

    def __init__(self) -> None:
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # device -> (tokens, when)

    def admit(self, device: str | None) -> bool:
        key = device or ""
        now = time.monotonic()
        tokens, when = self._buckets.pop(key, (QUARANTINE_BURST, now))
        tokens = min(QUARANTINE_BURST, tokens + (now - when) * QUARANTINE_PER_S)
        ok = tokens >= 1.0
        self._buckets[key] = (tokens - 1.0 if ok else tokens, now)
        while len(self._buckets) > self.DEVICES_KEPT:
            self._buckets.popitem(last=False)
        return ok
