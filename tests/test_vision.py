"""Tracking and events end to end: the scene made by scripts/vision_scene.py (a real MJPG video and a
real ONNX detector) through a daemon, a real Mosquitto and a subscriber."""

from __future__ import annotations

import json
import time
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


def rows_by_stream(url: str) -> dict[str, int]:
    import sqlite3

    with sqlite3.connect(url) as conn:
        return dict(conn.execute("SELECT pipeline, COUNT(*) FROM results GROUP BY pipeline").fetchall())


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


@pytest.mark.timeout(360)  # the scene's video twice, in-process: ~45 s idle, ~2 min beside stress-ng --cpu 2
def test_events_go_to_their_topic_with_their_own_seq_and_results_stay_home(
    tmp_path: Path, broker: Broker, subscribe: Subscribe
) -> None:
    from edged.fleet.ingest import Ingest, IngestOptions
    from edged.fleet.ingestdb import open_database
    from edged.fleet.report import build_report

    cfg = scene_config(tmp_path, broker)
    dev = cfg["device_id"]
    sub = subscribe(broker, f"edged/{dev}/#")
    url = str(tmp_path / "ingest.db")
    opts = IngestOptions(host=broker.host, port=broker.port, client_id=f"ingest-{dev}", group="", session_expiry_s=60)
    ingest = Ingest(opts, open_database(url))
    ingest.start()

    def events() -> list[dict[str, Any]]:
        return [json.loads(p) for p, _ in sub.payloads(f"edged/{dev}/cam0/events")]

    started = time.monotonic()
    status = run_video(cfg, events, 0)
    took = time.monotonic() - started
    got = events()
    assert [e["seq"] for e in got] == list(range(1, len(got) + 1))  # its own seq, from 1, no gap
    assert {e["stream"] for e in got} == {"events"}
    kinds = [e["event"]["type"] for e in got]
    assert kinds.count("enter") == kinds.count("leave") == 3  # three objects crossed
    assert kinds.count("zone_enter") == kinds.count("zone_leave") == 3  # each crossed the left half
    assert sub.results() == []  # publish mode events: no per-frame results
    assert status["events"] == len(got)
    # a rate over the last minute: every event when the run took less (on a loaded machine it can take more)
    assert status["events_per_min"] == len(got) if took < 60 else 0 < status["events_per_min"] <= len(got)
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
    # and the consumer lands them once each, as their own stream beside the (absent) results
    total = len(got) + len(again)
    wait_for(lambda: rows_by_stream(url).get("cam0/events") == total, 30, "the events in the ingest database")
    report = build_report(ingest.db)
    ingest.stop()
    ingest.db.close()
    entry = next(d for d in report["devices"] if d["device"] == dev)
    assert (entry["missing"], entry["pipelines"][0]["pipeline"], entry["pipelines"][0]["last_seq"]) == (
        0, "cam0/events", total
    )  # fmt: skip


def crops_frame() -> Any:
    """A frame with a light-marked car and a dark-marked person, and their detections."""
    import numpy as np

    image = np.full((240, 320, 3), 120, np.uint8)
    dets = []
    for x, colour, mark, label in ((40, (40, 40, 220), 255, "car"), (200, (220, 60, 40), 0, "person")):
        image[100:140, x : x + 40] = colour
        image[115:125, x + 15 : x + 25] = mark
        dets.append({"label": label, "score": 0.8, "box": [x, 100.0, x + 40.0, 140.0]})
    return image, dets


@pytest.mark.parametrize("batch", ["batch", 1])
def test_a_second_model_classifies_each_crop_batched_when_it_can(tmp_path: Path, batch: int | str) -> None:
    from edged.model.settings import ModelConfig
    from edged.pipeline.secondary import SecondaryConfig, load_secondary

    path = vision_scene.make_mark_model(tmp_path / "marks.onnx", batch=batch)
    cfg = SecondaryConfig(name="mark", model=ModelConfig(path=path, providers=["CPUExecutionProvider"]))
    second = load_secondary(cfg, tmp_path)
    assert second.batched is (batch == "batch")
    image, dets = crops_frame()
    second.run(image, dets)
    assert [d["secondary"]["mark"]["top"][0]["label"] for d in dets] == ["light", "dark"]
    only = SecondaryConfig(name="mark", model=cfg.model, on=["person"])
    image, dets = crops_frame()
    load_secondary(only, tmp_path).run(image, dets)
    assert ["secondary" in d for d in dets] == [False, True]  # `on` picks the labels


def test_a_pipeline_attaches_the_second_models_results_and_times_them(tmp_path: Path) -> None:
    import numpy as np

    from edged.pipeline.tracking import iou

    video, truth_path = vision_scene.write_scene(tmp_path, objects=4, seconds=10)
    truth = json.loads(truth_path.read_text(encoding="utf-8"))
    model = vision_scene.make_detector(tmp_path / "detector.onnx")
    cfg = base_config(tmp_path, model, str(video))
    cfg["pipelines"][0]["postprocess"] = {"type": "detect"}
    cfg["pipelines"][0]["secondary"] = [{
        "name": "mark", "model": {"path": str(vision_scene.make_mark_model(tmp_path / "marks.onnx")),
                                  "providers": ["CPUExecutionProvider"]},
        "min_score": 0.3,
    }]  # fmt: skip
    daemon = Daemon(config_from_dict(cfg))
    daemon.start()
    daemon.wait()
    status = daemon.pipelines[0].stats.snapshot()
    daemon.stop()
    import sqlite3

    with sqlite3.connect(tmp_path / "state" / "spool.db") as conn:
        results = [json.loads(p) for (p,) in conn.execute("SELECT payload FROM results ORDER BY id")]
    checked = 0
    for m in results:
        assert "secondary" in m["latency_ms"]
        for obj in truth["objects"]:
            box = obj["boxes"].get(str(m["frame"]))
            if box is None or box[0] < 0 or box[2] > vision_scene.WIDTH:
                continue  # half out of the picture: its mark is not drawn
            for d in m["result"]["detections"]:
                if iou(np.asarray([box], float), np.asarray([d["box"]], float))[0, 0] >= 0.5:
                    assert d["secondary"]["mark"]["top"][0]["label"] == obj["mark"], (m["frame"], obj["id"])
                    checked += 1
    assert checked > 50
    assert "secondary" in status["latency_ms"]["stages"]


def test_a_second_model_that_does_not_fit_its_preprocess_is_a_check_config_error(tmp_path: Path) -> None:
    from conftest import write_config

    from edged.core.errors import ConfigError
    from edged.ops.checkconfig import check_config

    model = vision_scene.make_detector(tmp_path / "detector.onnx")
    cfg = base_config(tmp_path, model, "/dev/video9")
    cfg["pipelines"][0]["postprocess"] = {"type": "detect"}
    marks = vision_scene.make_mark_model(tmp_path / "marks.onnx")
    cfg["pipelines"][0]["secondary"] = [
        {"name": "mark", "model": {"path": str(marks)}, "preprocess": {"size": [16, 16]}}
    ]
    with pytest.raises(ConfigError) as err:
        check_config(write_config(tmp_path / "edged.yaml", cfg))
    assert "pipelines[0].secondary[0].preprocess" in str(err.value)
    assert "preprocessing produces [1, 3, 16, 16]" in str(err.value)
    cfg["pipelines"][0]["postprocess"] = {"type": "classify"}
    with pytest.raises(ConfigError) as err:
        config_from_dict(cfg)
    assert "secondary work on detections: set a postprocess type that gives them" in str(err.value)
