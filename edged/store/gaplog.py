"""The seq gaps of unclean stops that status shows (`spool.seq_gaps`): the last GAPS_KEPT, persisted."""

from __future__ import annotations

import time
from typing import Any

from edged.store.seqlease import SeqGap

GAPS_KEPT = 20


class GapLog:
    """The recent gaps, as the status JSON shows them."""

    def __init__(self, entries: list[dict[str, Any]]) -> None:
        self.entries = entries  # saved with each commit

    def note(self, gaps: list[SeqGap]) -> int:
        """Log the gaps of this start; the seqs they make uncertain that no earlier gap counted (a gap
        declared again, by a second cut before the first was announced, is counted once)."""
        uncertain = 0
        for gap in gaps:
            self.entries.append({"pipeline": gap.stream, "first": gap.first, "last": gap.last,
                                 "used_to": gap.used_to, "ts": time.time()})  # fmt: skip
            overlap = sum(
                max(0, min(int(g["last"]), gap.last) - max(int(g["first"]), gap.first) + 1)
                for g in self.entries[:-1]
                if g["pipeline"] == gap.stream
            )
            uncertain += gap.size - overlap
        del self.entries[:-GAPS_KEPT]
        return uncertain
