"""Capacity you can see (store/capacity.py): how long the spool would hold an outage at the current rate, in
status while online, and degraded with a reason below spool.min_capacity."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
from conftest import Broker, StartDaemon, base_config, make_tiny_model, make_video, wait_for, write_config

from edged.store.capacity import IntakeRate, capacity_s, describe


def test_the_capacity_reads_in_words_and_is_unknown_until_measured() -> None:
    assert describe(3 * 86400 + 4 * 3600 + 59) == "3 d 4 h"
    assert describe(2 * 3600 + 5 * 60) == "2 h 5 min"
    assert describe(12 * 60 + 3) == "12 min"
    assert describe(40) == "40 s"
    assert describe(None) == "unknown"
    assert capacity_s(1000, None) is None  # no rate: unknown, never a guess
    assert capacity_s(1000, 10.0) == 100.0
    rate = IntakeRate()
    rate.note(300)
    assert rate.bytes_per_s() is None  # one result in the first seconds says nothing yet


@pytest.mark.integration
@pytest.mark.parametrize(("max_bytes", "degraded"), [(64 * 1024, True), (256 * 2**20, False)])
def test_a_spool_that_cannot_hold_an_hour_says_so_while_online(
    tmp_path: Path, broker: Broker, start_daemon: StartDaemon, max_bytes: int, degraded: bool
) -> None:
    model, video = make_tiny_model(tmp_path / "tiny.onnx"), make_video(tmp_path / "v.mp4", 30)
    cfg: dict[str, Any] = base_config(tmp_path, model, str(video), broker=broker, fps=30, loop=True,
                                      stop_at_end=False)  # fmt: skip
    cfg["spool"]["max_bytes"] = max_bytes
    daemon = start_daemon(write_config(tmp_path / "edged.yaml", cfg))
    snap = wait_for(lambda: (s := daemon.status()) and s["spool"]["capacity_s"] is not None and s, 60, "a rate")
    assert snap["mqtt"]["connected"]  # online: the broker takes every result, the spool holds none
    assert snap["spool"]["intake_bytes_per_s"] > 0
    reasons = [r for r in snap["reasons"] if r.startswith("the spool holds only ~")]
    if degraded:  # 64 KiB at ~30 results/s: well under a minute
        assert snap["spool"]["capacity_s"] < 3600
        assert snap["state"] == "degraded"
        assert reasons
        assert reasons[0].endswith("(spool.min_capacity 1 h 0 min): raise spool.max_bytes or free disk space")
    else:
        assert snap["spool"]["capacity_s"] > 3600
        assert not reasons
    code, err = daemon.stop(signal.SIGTERM)
    assert code == 0, err[-2000:]
