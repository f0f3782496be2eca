"""Masks, zones, zone events and publish mode events on real polygons (OpenCV) and the real tracker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import base_config

from edged.config import config_from_dict
from edged.core.errors import ConfigError
from edged.pipeline.resultfilter import EventsConfig, EventsOnly
from edged.pipeline.scene import BEST_IMAGE, Scene, ZoneConfig
from edged.pipeline.tracking import TrackingConfig

IMAGE = np.zeros((240, 320, 3), np.uint8)
LEFT = ZoneConfig(name="left", points=[(0, 0), (160, 0), (160, 240), (0, 240)])
DRIVE = ZoneConfig(name="drive", points=[(0.5, 0.5), (1, 0.5), (1, 1), (0.5, 1)], labels=["car"])


def det(x: float, y: float, label: str = "car", score: float = 0.9) -> dict[str, Any]:
    return {"label": label, "score": score, "box": [x, y, x + 40, y + 40]}


def test_a_mask_drops_detections_by_their_bottom_centre() -> None:
    scene = Scene(masks=[[(0, 0), (320, 0), (320, 60), (0, 60)]], zones=[], tracking=TrackingConfig())
    result: dict[str, Any] = {"detections": [det(10, 0), det(10, 30), det(100, 100)]}  # bottom centres y = 40, 70, 140
    scene.mask(result, IMAGE)  # the workers mask before their turn (and before the crops' models)
    assert scene.update(result, 0.0, IMAGE) == []
    assert [d["box"][1] for d in result["detections"]] == [30, 100]
    assert result["masked"] == 1


def test_zones_count_per_label_and_honour_their_label_filter() -> None:
    scene = Scene(masks=[], zones=[LEFT, DRIVE], tracking=TrackingConfig())
    result: dict[str, Any] = {
        "detections": [det(10, 10), det(20, 100, "person"), det(200, 160), det(250, 150, "person")]
    }
    scene.update(result, 0.0, IMAGE)
    assert result["zones"] == {
        "left": {"count": 2, "labels": {"car": 1, "person": 1}},
        "drive": {"count": 1, "labels": {"car": 1}},  # the person at the bottom right is not a car
    }
    assert [d["zones"] for d in result["detections"]] == [["left"], ["left"], ["drive"], []]


def test_the_reference_point_decides_which_zone() -> None:
    top = ZoneConfig(name="top", points=[(0, 0), (320, 0), (320, 120), (0, 120)])
    box: dict[str, Any] = {"detections": [det(10, 90)]}  # spans y 90..130: centre 110 is inside, bottom 130 is not
    Scene(masks=[], zones=[top], tracking=TrackingConfig(), reference="center").update(box, 0.0, IMAGE)
    assert box["detections"][0]["zones"] == ["top"]
    box = {"detections": [det(10, 90)]}
    Scene(masks=[], zones=[top], tracking=TrackingConfig()).update(box, 0.0, IMAGE)
    assert box["detections"][0]["zones"] == []


def test_a_tracked_car_crossing_zones_gets_enter_zone_and_leave_events_in_order() -> None:
    scene = Scene(masks=[], zones=[LEFT], tracking=TrackingConfig(enabled=True, min_hits=2, max_age_s=0.3))
    events: list[dict[str, Any]] = []
    for i in range(15):  # drives right at 12 px a frame: its bottom centre leaves the left zone at frame 7
        events += scene.update({"detections": [det(60 + 12 * i, 100)]}, i * 0.1, IMAGE)
    for i in range(15, 20):  # gone
        events += scene.update({"detections": []}, i * 0.1, IMAGE)
    kinds = [(e["type"], e.get("zone")) for e in events]
    assert kinds == [("enter", None), ("zone_enter", "left"), ("zone_leave", "left"), ("leave", None)]
    assert events[2]["ts"] == 0.7  # the frame its bottom centre (x 60 + 20 + 12 * 7 = 164) left the zone
    assert events[3]["ts"] == 1.4  # the last sighting
    assert events[3][BEST_IMAGE] is IMAGE  # the best frame, for the leave event's snapshot
    assert scene.active_tracks == 0


def test_a_track_that_leaves_inside_a_zone_leaves_the_zone_first() -> None:
    scene = Scene(masks=[], zones=[LEFT], tracking=TrackingConfig(enabled=True, min_hits=1, max_age_s=0.2))
    events: list[dict[str, Any]] = []
    events += scene.update({"detections": [det(10, 10)]}, 0.0, IMAGE)
    for i in range(1, 5):
        events += scene.update({"detections": []}, i * 0.1, IMAGE)
    assert [e["type"] for e in events] == ["enter", "zone_enter", "zone_leave", "leave"]


def test_publish_mode_events_holds_results_back_but_for_the_summary() -> None:
    now = [0.0]
    quiet = EventsOnly(EventsConfig(mode="events"), lambda: now[0])
    summary = EventsOnly(EventsConfig(mode="events", summary_s=10), lambda: now[0])
    sent = []
    for t in range(25):
        now[0] = float(t)
        assert quiet.decide({"detections": []})[0] is False
        sent.append(summary.decide({"detections": []})[0])
    assert [t for t, s in enumerate(sent) if s] == [0, 10, 20]


@pytest.mark.parametrize(
    ("pipeline", "key", "message"),
    [
        ({"zones": [{"name": "z", "points": [[0, 0], [0.5, 0], [0, 0.5]]}]}, "pipelines[0]", "set a postprocess type"),
        ({"tracking": {"enabled": True}}, "pipelines[0]", "set a postprocess type that gives them"),
        ({"publish": {"mode": "events"}, "postprocess": {"type": "detect"}}, "pipelines[0]", "enable tracking"),
        (
            {"zones": [{"name": "z", "points": [[0, 0], [700, 0], [0, 10]]}], "frame_size": [640, 480]},
            "pipelines[0].zones",
            "zone 'z': point [700.0, 0.0] is outside the 640x480 frame",
        ),
        (
            {"zones": [{"name": "z", "points": [[0, 0], [0.5, 0], [0, 0.5]]}] * 2},
            "pipelines[0].zones",
            "zone 'z' is named twice",
        ),
        ({"masks": [[[0, 0], [1, 1], [1, 0], [0, 0.5]]]}, "pipelines[0].masks", "crosses itself"),
        (
            {"postprocess": {"type": "detect"}, "tracking": {"enabled": True, "max_age_s": 1},
             "motion": {"enabled": True, "keepalive_s": 2}},
            "pipelines[0]",
            "tracking.max_age_s (1) must exceed motion.keepalive_s (2)",
        ),
    ],
)  # fmt: skip
def test_bad_scene_settings_are_config_errors(
    tmp_path: Path, tiny_model: Path, pipeline: dict[str, Any], key: str, message: str
) -> None:
    cfg = base_config(tmp_path, tiny_model, "/dev/video9")
    cfg["pipelines"][0].update(pipeline)
    with pytest.raises(ConfigError) as err:
        config_from_dict(cfg)
    assert message in str(err.value)
    assert key in str(err.value)
