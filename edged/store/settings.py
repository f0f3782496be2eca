"""The store's config section: `spool`, the durable queue under state_dir."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from edged.core.settings import Duration, Size, Strict


class SpoolConfig(Strict):
    """The durable queue (SQLite, WAL) under state_dir."""

    sync: Literal["normal", "full"] = Field(
        "full",
        description="full: one fsync per group commit, so every result status calls stored survives a power "
        "cut; normal: survives a crash of edged but a power cut can take back every commit since the last "
        "checkpoint (saves one fsync per batch_ms while offline; for disks with power-loss protection).",
    )
    batch_max: int = Field(
        128, ge=1, le=10000, description="Commit once this many unacknowledged results wait in memory ..."
    )
    batch_ms: int = Field(
        1000,
        ge=0,
        le=60000,
        description="... or once the oldest has waited this many milliseconds, first wins. A result the broker "
        "acknowledged before then is never written; kill -9 loses at most this window of unacknowledged results.",
    )
    max_bytes: Size = Field(
        256 * 2**20,
        description="Stored payload bytes at most (never more than the disk holds); bytes, or 256MB / 256MiB.",
    )
    max_age: Duration = Field(
        7 * 86400.0, description="TTL: older results are dropped (counted); seconds, or 45s / 30m / 12h / 7d."
    )
    on_full: Literal["drop_oldest", "drop_newest"] = Field("drop_oldest", description="What gives way when full.")
    min_free_bytes: Size = Field(64 * 2**20, description="Free space the spool leaves on the filesystem.")
    ballast_bytes: Size = Field(16 * 2**20, description="Ballast released on a full disk so SQLite can evict.")
    min_capacity: Duration = Field(
        3600.0,
        description="Status is degraded while the spool could hold less than this much outage at the current "
        "rate (free disk, max_bytes and the bytes per result: spool.capacity_s), online or not.",
    )
    replay_window: Duration = Field(
        3600.0,
        description="How long a result the broker acknowledged stays in the spool for a consumer's replay request "
        "(docs/mqtt.md: a broker that crashes loses what it acknowledged); seconds, or 45s / 30m / 12h.",
    )
    replay_max_bytes: Size = Field(
        16 * 2**20,
        description="... and at most this many payload bytes of them (oldest go first); 0 keeps none (no replay).",
    )
