"""Polygons (masks, zones) and the motion gate, on real OpenCV frames made here."""

from __future__ import annotations

import itertools
import json
import sqlite3
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt
import pytest
from conftest import base_config

from edged.capture.motion import MotionConfig, MotionGate
from edged.config import config_from_dict
from edged.core.errors import ConfigError
from edged.core.geometry import Polygon, polygon_problem, reference_point
from edged.daemon import Daemon

W, H = 320, 240


def scene(rng: np.random.Generator, square_x: int | None = None, brightness: int = 120) -> npt.NDArray[np.uint8]:
    """A textured static background with camera noise, and optionally a 40x40 dark square at x."""
    base = np.full((H, W, 3), brightness, np.uint8)
    base[::16, :, :] = brightness + 40  # texture: lines that never move
    noise = rng.integers(-6, 7, size=base.shape)
    frame: npt.NDArray[np.uint8] = np.clip(base.astype(np.int16) + noise, 0, 255).astype(np.uint8)
    if square_x is not None:
        frame[100:140, square_x : square_x + 40] = 20
    return frame


@pytest.mark.parametrize(
    ("points", "frame", "problem"),
    [
        ([(0.1, 0.1), (0.9, 0.1), (0.9, 0.9)], None, None),
        ([(0, 0), (100, 0), (100, 100)], (320, 240), None),
        ([(0, 0), (400, 0), (100, 100)], (320, 240), "outside the 320x240 frame"),
        ([(0, 0), (100, 0), (100, 100)], None, "need the frame size"),
        ([(0, 0), (1, 1), (1, 0), (0, 0.5)], None, "crosses itself"),
        ([(0, 0), (0.5, 0.5), (1, 1)], None, "no area"),
    ],
)
def test_polygon_checks(points: list[tuple[float, float]], frame: tuple[int, int] | None, problem: str | None) -> None:
    found = polygon_problem(points, frame)
    if problem is None:
        assert found is None
    else:
        assert found is not None
        assert problem in found


def test_polygons_scale_to_the_real_frame_and_reference_points() -> None:
    fractions = Polygon([(0.5, 0.5), (1, 0.5), (1, 1), (0.5, 1)], (640, 480), None)
    assert fractions.contains(600, 400)
    assert not fractions.contains(100, 100)
    pixels = Polygon([(160, 120), (320, 120), (320, 240), (160, 240)], (640, 480), (320, 240))  # declared half size
    assert pixels.contains(600, 400)
    assert reference_point([10, 20, 30, 60], "bottom_center") == (20, 60)
    assert reference_point([10, 20, 30, 60], "center") == (20, 40)


def test_a_static_noisy_scene_is_skipped_and_a_moving_object_is_not() -> None:
    rng = np.random.default_rng(1)
    gate = MotionGate(MotionConfig(enabled=True, hold_frames=2, keepalive_s=0), [], None)
    assert gate.wanted(scene(rng), 0.0)  # the first frame sets up the background
    static = [gate.wanted(scene(rng), 0.1 * i) for i in range(1, 30)]
    assert not any(static)
    moving = [gate.wanted(scene(rng, x), 3 + 0.1 * i) for i, x in enumerate(range(20, 220, 20))]
    assert all(moving)
    after = [gate.wanted(scene(rng), 5 + 0.1 * i) for i in range(10)]
    assert after[:2] == [True, True]  # the hold frames after motion ended
    assert not any(after[4:])  # the background forgets the square within a few frames


def test_keepalive_sends_a_frame_now_and_then_without_motion() -> None:
    rng = np.random.default_rng(2)
    gate = MotionGate(MotionConfig(enabled=True, hold_frames=0, keepalive_s=1.0), [], None)
    sent = [t for t in (0.1 * i for i in range(51)) if gate.wanted(scene(rng), t)]
    assert len(sent) == 6  # the first frame, then one per second
    assert all(b - a >= 1.0 - 1e-9 for a, b in itertools.pairwise(sent))


def test_motion_inside_a_mask_is_ignored() -> None:
    rng = np.random.default_rng(3)
    mask = [(0.0, 0.3), (1.0, 0.3), (1.0, 0.7), (0.0, 0.7)]  # the band the square moves in
    gate = MotionGate(MotionConfig(enabled=True, hold_frames=0, keepalive_s=0), [mask], None)
    gate.wanted(scene(rng), 0.0)
    assert not any(gate.wanted(scene(rng, x), 0.1 * i) for i, x in enumerate(range(20, 220, 20)))


def test_a_lighting_change_sends_one_frame_and_resets_the_background() -> None:
    rng = np.random.default_rng(4)
    gate = MotionGate(MotionConfig(enabled=True, hold_frames=0, keepalive_s=0), [], None)
    gate.wanted(scene(rng), 0.0)
    assert gate.wanted(scene(rng, brightness=200), 0.1)  # everything changed: once to the model
    assert not any(gate.wanted(scene(rng, brightness=200), 0.2 + 0.1 * i) for i in range(5))


SENSOR = {"type": "sensor", "transport": "fifo", "path": "/tmp/x.fifo", "format": "csv", "channels": ["x"], "window": 4}


def moving_square_video(path: Path, frames: int, moving: range) -> Path:
    """MJPG 160x120: a still textured scene; a dark square crosses it during the `moving` frames."""
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), 20.0, (160, 120))
    assert writer.isOpened()
    rng = np.random.default_rng(5)
    still = rng.integers(90, 160, size=(120, 160, 3), dtype=np.uint8)
    for i in range(frames):
        image = still.copy()
        if i in moving:
            x = 5 + 6 * (i - moving.start)
            image[40:70, x : x + 30] = 10
        writer.write(image)
    writer.release()
    return path


def test_a_pipeline_with_motion_gating_runs_the_model_on_the_moving_frames_only(
    tmp_path: Path, tiny_model: Path
) -> None:
    video = moving_square_video(tmp_path / "v.avi", 60, range(20, 40))
    cfg = base_config(tmp_path, tiny_model, str(video))
    cfg["pipelines"][0]["motion"] = {"enabled": True, "hold_frames": 2, "keepalive_s": 0}
    daemon = Daemon(config_from_dict(cfg))
    daemon.start()
    daemon.wait()  # the file ends (stop_at_end)
    status = daemon.pipelines[0].stats.snapshot()
    daemon.stop()
    with sqlite3.connect(tmp_path / "state" / "spool.db") as conn:
        frames = [json.loads(p)["frame"] for (p,) in conn.execute("SELECT payload FROM results ORDER BY id")]
    assert frames[0] == 0  # the first frame sets up the background and is run
    assert set(range(21, 40)) <= set(frames)  # every frame with the square moving
    assert len(frames) <= 1 + 20 + 2 + 2  # first, the moving ones, the hold frames after it (and its exit)
    assert status["motion_skipped"] == 60 - len(frames)
    assert status["frames"] == len(frames)
    assert status["state"] == "ended"


@pytest.mark.parametrize(
    ("pipeline", "message"),
    [
        ({"motion": {"enabled": True}, "source": SENSOR}, "motion gating needs images"),
        ({"motion": {"mask": [[[0, 0], [700, 0], [0, 10]]]}, "frame_size": [640, 480]}, "outside the 640x480"),
        ({"motion": {"mask": [[[0, 0], [70, 0], [0, 10]]]}}, "need the frame size"),
        ({"motion": {"mask": [[[0, 0], [1, 1], [1, 0], [0, 0.5]]]}}, "crosses itself"),
    ],
)
def test_bad_motion_settings_are_config_errors(
    tmp_path: Path, tiny_model: Path, pipeline: dict[str, Any], message: str
) -> None:
    cfg = base_config(tmp_path, tiny_model, "/dev/video9")
    cfg["pipelines"][0].update(pipeline)
    with pytest.raises(ConfigError) as err:
        config_from_dict(cfg)
    assert message in str(err.value)
    assert "pipelines[0].motion" in str(err.value)
