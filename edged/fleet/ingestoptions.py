"""What `edged ingest` is told (its flags) and what it counts: shared by the ingest's MQTT side
(ingestlink.py) and its writer (ingest.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class IngestOptions:
    """Where to read from and how (the `edged ingest` flags)."""

    host: str = "localhost"
    port: int = 1883
    protocol: str = "5"  # "3.1.1" for a broker without MQTT 5: a persistent session, no shared subscriptions
    group: str = "edged-ingest"  # shared-subscription group; "" subscribes plainly (one ingest only)
    client_id: str = "edged-ingest"  # stable: the broker keeps this session while the ingest is away
    results_topic: str = "edged/+/+/results"
    events_topic: str = "edged/+/+/events"  # a tracking pipeline's events: rows keyed "<pipeline>/events"
    stats_topic: str = "edged/+/stats"
    gaps_topic: str = "edged/+/+/gaps"  # seq ranges a device declared uncertain after an unclean stop
    clock_topic: str = "edged/+/clock"  # corrections of times stamped while a device's clock was not synchronized
    replay_topic: str = "edged/{device_id}/replay"  # ask devices for missing seqs (replayer.py); "" never asks
    replay_after_s: float = 5.0  # a seq missing this long is asked for
    quarantine_rows: int = 1000  # refused messages kept per device at most (the oldest go first, counted)
    quarantine_bytes: int = 64 * 2**20  # their stored bytes in all at most
    batch: int = 1000  # results per transaction at most
    flush_s: float = 0.25  # a partial batch waits at most this long for more (a database likes big ones)
    receive_max: int = 4000  # unacknowledged messages the broker may send (MQTT 5 Receive Maximum)
    session_expiry_s: int = 86_400  # how long the broker keeps the session (and queues) while we are away
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    insecure: bool = False
    username: str | None = None
    password_file: Path | None = None


@dataclass
class IngestCounters:
    """What the ingest did (logged every few seconds, returned by `Ingest.counters()`)."""

    messages: int = 0
    results: int = 0
    inserted: int = 0
    duplicates: int = 0
    malformed: int = 0  # quarantined, all reasons
    quarantined: dict[str, int] = field(default_factory=dict)  # by reason
    quarantine_skipped: int = 0  # refused faster than QUARANTINE_PER_S for their device: counted, not stored
    stats: int = 0
    db_errors: int = 0
    connects: int = 0
    last_error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
