"""How far the ingest believes a stream's seq can jump (ingest.py refuses a result beyond it).

A result whose seq is more than SEQ_JUMP_MAX past both what its device last said it numbered (its stats
message's `spool.seqs`: per stream, the highest seq handed to a result) and the highest seq of its stream this
ingest wrote is not believed: one forged seq near 2^63 must not become the stream's top (the replayer would ask
for 3 x 5,000 bogus seqs and never see a later real loss) nor 9.2e18 missing seqs in the report. A device that
was offline for long and dropped results on purpose jumps by what it dropped: a million is 28 hours of drops at
10 results a second, and its stats message (sent first on every connection) raises the bound anyway. A stream
neither names yet (new to this ingest) is believed.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterable

from edged.fleet.ingestdb import ResultRow, StatsRow

SEQ_JUMP_MAX = 1_000_000
STREAMS_KEPT = 100_000  # streams whose tops are kept (the least recently seen go)

Key = tuple[str, str]  # (device, stream)


def reported_seqs(body: str) -> dict[str, int]:
    """A stats message's `spool.seqs` (stream -> the highest seq handed out), sane entries only."""
    try:
        data = json.loads(body)
    except ValueError:
        return {}
    spool = data.get("spool") if isinstance(data, dict) else None
    seqs = spool.get("seqs") if isinstance(spool, dict) else None
    if not isinstance(seqs, dict):
        return {}
    return {str(k)[:256]: v for k, v in list(seqs.items())[:256] if type(v) is int and 0 <= v < 2**63}


class SeqBounds:
    """The tops a jump is measured from (the ingest's writer thread only)."""

    def __init__(self) -> None:
        self._reported: OrderedDict[Key, int] = OrderedDict()
        self._written: OrderedDict[Key, int] = OrderedDict()

    def note_stats(self, stats: Iterable[StatsRow]) -> None:
        """Stats messages just read: their devices' `spool.seqs`."""
        for stat in stats:
            for stream, seq in reported_seqs(stat.body).items():
                _keep(self._reported, (stat.device, stream), seq)

    def note_written(self, rows: Iterable[ResultRow]) -> None:
        """Rows just written."""
        for row in rows:
            key = (row.device, row.pipeline)
            _keep(self._written, key, max(row.seq, self._written.get(key, 0)))

    def implausible(self, row: ResultRow) -> str | None:
        """Why `row`'s seq is not believed, or None."""
        key = (row.device, row.pipeline)
        known = [t for t in (self._reported.get(key), self._written.get(key)) if t is not None]
        if not known or row.seq <= max(known) + SEQ_JUMP_MAX:
            return None
        return (f"seq {row.seq} of {row.pipeline} is more than {SEQ_JUMP_MAX} past {max(known)}, the highest its "
                "device reported numbering or this ingest wrote")  # fmt: skip


def _keep(tops: OrderedDict[Key, int], key: Key, seq: int) -> None:
    tops[key] = seq
    tops.move_to_end(key)
    while len(tops) > STREAMS_KEPT:
        tops.popitem(last=False)
