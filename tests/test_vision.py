"""Tracking and events end to end: the scene made by scripts/vision_scene.py (a real MJPG video and a
real ONNX detector) through a daemon, a real Mosquitto and a subscriber."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import vision_scene
from conftest import Broker, Subscribe, base_config, wait_for

from edged.config import config_from_dict
from edged.daemon import Daemon

pytestmark = pytest.mark.integration


def scene_config(tmp_path: Path, broker: Broker) -> dict[str, Any]:
    video, _ = vision_scene.write_scene(tmp_path, objects=3, seconds=14)
    model = vision_scene.make_detector(tmp_path / "detector.onnx")
    cfg = base_config(tmp_path, model, str(video), broker=broker, clock="video")
    cfg["pipelines"][0].update({
        "postprocess": {"type": "detect"},
        "tracking": {"enabled": True, "min_hits": 2, "max_age_s": 1},
        "zones": [{"name": "left", "points": [[0, 0], [0.5, 0], [0.5, 1], [0, 1]]}],
        "publish": {"mode": "events"},
        "snapshot": {"enabled": True},
    })  # fmt: skip
    return cfg


def run_video(cfg: dict[str, Any], events: Any, already: int) -> dict[str, Any]:
    """Run the daemon over the video; wait until the broker delivered all its events; its pipeline status."""
    daemon = Daemon(config_from_dict(cfg))
    daemon.start()
    try:
        daemon.wait()  # the file ends (stop_at_end)
        status = daemon.pipelines[0].stats.snapshot()
        wait_for(lambda: len(events()) >= already + status["events"], 30, "every event at the subscriber")
    finally:
        daemon.stop()
    return status


def test_events_go_to_their_topic_with_their_own_seq_and_results_stay_home(
    tmp_path: Path, broker: Broker, subscribe: Subscribe
) -> None:
    cfg = scene_config(tmp_path, broker)
    dev = cfg["device_id"]
    sub = subscribe(broker, f"edged/{dev}/#")

    def events() -> list[dict[str, Any]]:
        return [json.loads(p) for p, _ in sub.payloads(f"edged/{dev}/cam0/events")]

    status = run_video(cfg, events, 0)
    got = events()
    assert [e["seq"] for e in got] == list(range(1, len(got) + 1))  # its own seq, from 1, no gap
    assert {e["stream"] for e in got} == {"events"}
    kinds = [e["event"]["type"] for e in got]
    assert kinds.count("enter") == kinds.count("leave") == 3  # three objects crossed
    assert kinds.count("zone_enter") == kinds.count("zone_leave") == 3  # each crossed the left half
    assert sub.results() == []  # publish mode events: no per-frame results
    assert status["events"] == len(got)
    assert status["events_per_min"] == len(got)
    assert status["tracks"] == 0  # everyone left
    assert status["suppressed"] == status["frames"]
    leave = next(e for e in got if e["event"]["type"] == "leave")
    assert (tmp_path / "state" / leave["snapshot"]).is_file()  # the best frame of the track
    assert "_best_image" not in leave["event"]

    # aftermath: a restart on the same state continues the events' seq
    status = run_video(cfg, events, len(got))
    again = events()[len(got) :]
    assert [e["seq"] for e in again] == list(range(len(got) + 1, len(got) + 1 + len(again)))
    assert len(again) == status["events"]
