"""The announcement of a seq gap an unclean stop left (docs/mqtt.md, "Gaps"): its topic (`mqtt.gaps_topic`,
per pipeline) and payload (pipeline/message.py's format). The spool sends it like a result
(`Spool.announce_gaps`), so that the gap counts as settled only once the announcement is stored or delivered."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from edged.pipeline.message import gap_message
from edged.store.seqlease import SeqGap
from edged.uplink.topics import Topics


def gap_announcer(topics: Topics) -> Callable[[SeqGap], tuple[str, bytes]]:
    """What `Spool.announce_gaps` calls for each gap: (topic, payload)."""

    def announce(gap: SeqGap) -> tuple[str, bytes]:
        pipeline = gap.stream.partition("/")[0]
        body = gap_message(topics.device_id, gap.stream, first=gap.first, last=gap.last, used_to=gap.used_to,
                           ts=time.time())  # fmt: skip
        return topics.gaps(pipeline), json.dumps(body, separators=(",", ":")).encode()

    return announce
