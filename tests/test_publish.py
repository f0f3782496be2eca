"""Edge filtering (publish: every | on_change | interval) and snapshots, in-process with real models."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from conftest import base_config
from detect_models import make_detector

from edged.config import config_from_dict
from edged.core.errors import ConfigError
from edged.daemon import Daemon
from edged.pipeline.resultfilter import EveryConfig, IntervalConfig, OnChangeConfig, make_filter, signature


def rows(state_dir: Path) -> list[dict[str, Any]]:
    with sqlite3.connect(state_dir / "spool.db") as conn:
        return [json.loads(p) for (p,) in conn.execute("SELECT payload FROM results ORDER BY id")]


def blocks_video(path: Path, pattern: list[tuple[int, int]], size: tuple[int, int] = (128, 64)) -> Path:
    """MJPG video of (frames, grey level) blocks: white frames show the detector's boxes, black none."""
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), 20.0, size)
    assert writer.isOpened()
    for count, level in pattern:
        for _ in range(count):
            writer.write(np.full((size[1], size[0], 3), level, np.uint8))
    writer.release()
    return path


def det(*labels: str) -> dict[str, Any]:
    return {"detections": [{"label": x, "index": 0, "score": 0.9, "box": [0, 0, 1, 1]} for x in labels]}


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_on_change_publishes_when_the_labels_or_a_count_change() -> None:
    f = make_filter(OnChangeConfig(mode="on_change"))
    frames = [det("car"), det("car"), det("car", "car"), det("car", "car"), det(), det(), det("dog"), det("car")]
    assert [f.decide(r)[0] for r in frames] == [True, False, True, False, True, False, True, True]
    assert signature(det("dog", "car", "car")) == (("car", 2), ("dog", 1))
    assert signature({"top": [{"label": "7", "score": 0.9}]}) == "7"


def test_interval_and_the_on_change_heartbeat_follow_the_clock() -> None:
    clock = FakeClock()
    interval = make_filter(IntervalConfig(mode="interval", interval_s=2), clock)
    beat = make_filter(OnChangeConfig(mode="on_change", interval_s=3), clock)
    got: list[tuple[bool, bool]] = []
    for t in (0.0, 1.0, 1.9, 2.0, 3.5, 4.1, 5.0):
        clock.now = t
        got.append((interval.decide(det("car"))[0], beat.decide(det("car"))[0]))
    assert [g[0] for g in got] == [True, False, False, True, False, True, False]
    assert [g[1] for g in got] == [True, False, False, False, True, False, False]
    every = make_filter(EveryConfig())
    assert all(every.decide(det("car"))[0] for _ in range(3))


def test_interval_needs_seconds() -> None:
    with pytest.raises(ConfigError, match=r"publish.interval_s=<missing>: required key is missing"):
        config_from_dict({"pipelines": [{"name": "p", "source": {"type": "camera", "uri": 0},
                          "model": {"path": __file__}, "publish": {"mode": "interval"}}]})  # fmt: skip


def test_on_change_in_the_daemon_counts_every_frame_and_numbers_only_published_results(tmp_path: Path) -> None:
    video = blocks_video(tmp_path / "v.avi", [(10, 255), (10, 0), (10, 255), (5, 0)])
    model = make_detector(tmp_path / "det.onnx", "yolov8", resize="letterbox")
    cfg = base_config(tmp_path, model, str(video))
    p = cfg["pipelines"][0]
    p["postprocess"] = {"type": "detect"}
    p["preprocess"] = {"pad_value": 0}  # black bars: a black frame then scores 0 everywhere
    p["publish"] = {"mode": "on_change"}
    p["snapshot"] = {"enabled": True, "on": "change", "max_files": 2, "crop": False}
    daemon = Daemon(config_from_dict(cfg))
    daemon.start()
    daemon.wait()  # the file ends: stop_at_end
    snap = daemon.report.snapshot()
    daemon.stop()
    (status,) = snap["pipelines"]
    assert status["frames"] == 35  # every frame ran and is counted
    assert status["suppressed"] == 31
    msgs = rows(tmp_path / "state")
    assert [m["seq"] for m in msgs] == [1, 2, 3, 4]  # seq counts published results only: no gaps
    assert [m["frame"] for m in msgs] == [0, 10, 20, 30]
    assert [len(m["result"]["detections"]) for m in msgs] == [4, 0, 4, 0]
    person = msgs[0]["result"]["detections"][0]
    assert person["label"] == "person"
    assert person["box"] == pytest.approx([48.0, 24.0, 80.0, 40.0], abs=0.5)  # through a JPEG-decoded frame
    assert msgs[0]["result"]["frame"] == {"w": 128, "h": 64}
    # a snapshot per published change, at most 2 kept (oldest removed), referenced by relative path
    paths = [m["snapshot"] for m in msgs]
    assert paths[0] == "snapshots/cam0/cam0-000000001.jpg"
    kept = sorted(p.name for p in (tmp_path / "state" / "snapshots" / "cam0").iterdir())
    assert kept == ["cam0-000000003.jpg", "cam0-000000004.jpg"]
    image = cv2.imread(str(tmp_path / "state" / paths[2]))
    assert image is not None
    assert image.shape == (64, 128, 3)


def test_snapshot_crop_on_detection(tmp_path: Path) -> None:
    video = blocks_video(tmp_path / "v.avi", [(3, 255), (2, 0)])
    model = make_detector(tmp_path / "det.onnx", "yolov5", resize="letterbox")
    cfg = base_config(tmp_path, model, str(video))
    p = cfg["pipelines"][0]
    p["postprocess"] = {"type": "detect"}
    p["preprocess"] = {"pad_value": 0}  # black bars: a black frame then scores 0 everywhere
    p["snapshot"] = {"enabled": True, "on": "detection", "crop": True, "jpeg_quality": 70}
    daemon = Daemon(config_from_dict(cfg))
    daemon.start()
    daemon.wait()
    daemon.stop()
    msgs = rows(tmp_path / "state")
    assert [("snapshot" in m) for m in msgs] == [True, True, True, False, False]  # only frames with detections
    crop = cv2.imread(str(tmp_path / "state" / msgs[0]["snapshot"]))
    assert crop is not None
    assert crop.shape[:2] == (16, 32)  # the person's box, 32 x 16 frame pixels
