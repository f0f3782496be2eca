"""Bugs of issue "The tree is the dataflow" that the restructuring must not keep, each reproduced as a user
would meet it and failing on the code before its fix. In-process daemons on a real video and model, a real
spool; the config files are real files read by `edged check-config`."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import base_config, make_video, wait_for, write_config

from edged.config import config_from_dict
from edged.daemon import Daemon


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edged", *args], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.integration
def test_backoff_bounds_in_the_wrong_order_fail_check_config_not_run(tmp_path: Path, tiny_model: Path) -> None:
    # `edged run` used to die with a ValueError traceback; check-config passed it
    cfg = base_config(tmp_path, tiny_model, "/dev/video9")
    cfg["mqtt"].update({"reconnect_min_s": 10, "reconnect_max_s": 1})
    path = write_config(tmp_path / "edged.yaml", cfg)
    res = run_cli("check-config", str(path))
    assert res.returncode == 1
    (problem,) = res.stderr.strip().splitlines()
    assert problem.startswith(f"{path}:")
    assert "mqtt" in problem
    assert "reconnect_max_s must be >= reconnect_min_s" in problem


def start(daemon: Daemon) -> threading.Thread:
    daemon.start()
    waiter = threading.Thread(target=daemon.wait, name="test-wait")
    waiter.start()
    return waiter


def finish(daemon: Daemon, waiter: threading.Thread) -> None:
    daemon.request_stop()
    waiter.join(30)
    daemon.stop()
    assert not waiter.is_alive()


@pytest.mark.integration
def test_a_raising_result_hook_marks_the_pipeline_failed_and_status_says_why(tmp_path: Path, tiny_model: Path) -> None:
    # the store step ran outside the worker's try: the thread ended, the pipeline still said "running"
    video = make_video(tmp_path / "v.mp4", 30)
    cfg = base_config(tmp_path, tiny_model, str(video), fps=50, loop=True, stop_at_end=False)
    calls = {"n": 0}

    def hook(_result: dict[str, Any]) -> None:
        calls["n"] += 1
        if calls["n"] == 5:
            raise RuntimeError("a hook that breaks")

    daemon = Daemon(config_from_dict(cfg), on_result=hook)
    waiter = start(daemon)
    try:
        rt = daemon.pipelines[0]
        wait_for(lambda: rt.stats.state == "failed", 30, "the pipeline marked failed")
        assert "storing the result failed: a hook that breaks" in (rt.stats.error or "")
        assert daemon.health() == "degraded"
        assert "pipeline cam0 failed: storing the result failed: a hook that breaks" in daemon.reasons()
        wait_for(lambda: not rt.running(), 30, "every worker of the pipeline ended")
    finally:
        finish(daemon, waiter)  # aftermath: the daemon still stops cleanly (it also stops by itself here)


def reloadable_daemon(tmp_path: Path, model: Path) -> tuple[Daemon, dict[str, Any], Path]:
    """A daemon on a looping video, started from a config file that the test then changes and reloads."""
    from edged.config import load_config

    video = make_video(tmp_path / "v.mp4", 30)
    cfg = base_config(tmp_path, model, str(video), fps=50, loop=True, stop_at_end=False)
    path = write_config(tmp_path / "edged.yaml", cfg)
    return Daemon(load_config(path), config_path=path), cfg, path


@pytest.mark.integration
def test_a_reload_that_changes_publish_is_applied_to_the_running_workers(tmp_path: Path, tiny_model: Path) -> None:
    # "applied" was reported, but the workers kept the filter they were built with
    daemon, cfg, path = reloadable_daemon(tmp_path, tiny_model)
    waiter = start(daemon)
    try:
        stats = daemon.pipelines[0].stats
        wait_for(lambda: stats.frames >= 10, 30, "results")
        assert stats.suppressed == 0
        cfg["pipelines"][0]["publish"] = {"mode": "interval", "interval_s": 3600}  # one result an hour
        write_config(path, cfg)
        assert daemon.reloader.reload()
        notes = daemon.reloader.status()["notes"]
        assert any("publish/snapshot settings applied" in n for n in notes)
        wait_for(lambda: stats.suppressed >= 10, 30, "results held back by the new filter")
        assert daemon.pipelines[0].cfg.publish.mode == "interval"
    finally:
        finish(daemon, waiter)


@pytest.mark.integration
def test_a_model_run_would_refuse_fails_check_config_too_and_run_names_the_pipeline(tmp_path: Path) -> None:
    # a model with dynamic input axes and no preprocess size: check-config passed it, run refused it
    # without naming the pipeline
    from tools_models import make_conv_model

    dyn = make_conv_model(tmp_path / "dyn.onnx", dynamic=True, metadata=False)
    video = make_video(tmp_path / "v.mp4", 5)
    cfg = base_config(tmp_path, dyn, str(video))
    cfg["pipelines"][0]["name"] = "door"
    path = write_config(tmp_path / "edged.yaml", cfg)
    checked = run_cli("check-config", str(path))
    assert checked.returncode == 1, checked.stdout
    (problem,) = checked.stderr.strip().splitlines()
    assert problem.startswith(f"{path}:")
    assert "pipelines[0].preprocess=<missing>" in problem  # the key at fault, not the model file
    assert "size" in problem  # what to add: preprocess.size
    ran = run_cli("run", "--config", str(path))
    assert ran.returncode == 1
    assert "pipeline door:" in ran.stderr
    assert "Traceback" not in ran.stderr
    cfg["pipelines"][0]["preprocess"] = {"size": [16, 16]}  # with the size both accept it
    assert run_cli("check-config", str(write_config(path, cfg))).returncode == 0


class SilentCamera:
    """Stands in for a network camera that went silent mid-stream: OpenCV's read() blocks inside FFmpeg
    and cannot be interrupted (no such camera here; a fake capture object, through the daemon's
    capture_factory hook)."""

    def __init__(self, frames: int = 20) -> None:
        self.frames = frames
        self.hang = threading.Event()

    def isOpened(self) -> bool:  # noqa: N802  (OpenCV's name)
        return True

    def read(self) -> tuple[bool, Any]:
        import numpy as np

        if self.frames > 0:
            self.frames -= 1
            return True, np.zeros((48, 64, 3), np.uint8)
        self.hang.wait(600)  # silent: never returns while the test runs
        return False, None

    def release(self) -> None:
        pass

    def set(self, *_a: Any) -> bool:
        return True


@pytest.mark.integration
def test_stop_keeps_one_deadline_and_abandons_a_source_stuck_in_a_read(
    tmp_path: Path, tiny_model: Path, caplog: Any, monkeypatch: Any
) -> None:
    # one SIGTERM took 30.4 s with a silent HTTP camera: every stop budget was added up (unit: TimeoutStopSec=30)
    import logging

    import edged.pipeline.runner

    monkeypatch.setattr(edged.pipeline.runner, "SOURCE_JOIN_S", 0.5)
    camera, second = SilentCamera(), SilentCamera(0)
    cfg = base_config(tmp_path, tiny_model, "rtsp://camera.invalid/stream", stop_at_end=False)
    daemon = Daemon(config_from_dict(cfg), source_kwargs={"capture_factory": lambda _c: camera})
    waiter = start(daemon)
    stopper = threading.Thread(target=lambda: finish(daemon, waiter), name="test-stop")
    try:
        stats = daemon.pipelines[0].stats
        # a live source: the latest frame wins, so the model may skip some of the 20
        wait_for(lambda: stats.frames_captured >= 20 and stats.frames >= 1, 30, "frames before the camera went silent")
        with caplog.at_level(logging.WARNING, logger="edged.pipeline.runner"):
            stopper.start()
            stopper.join(60)
        assert not stopper.is_alive(), "stop() did not return"
        assert "did not stop within" in caplog.text
        assert "abandoned" in caplog.text
        # aftermath: every result was committed, and the next daemon on this state_dir starts
        produced = stats.frames
        assert daemon.left_in_spool == produced  # mqtt is off: every result waits in the spool
        again = Daemon(config_from_dict(cfg), source_kwargs={"capture_factory": lambda _c: second})
        again.start()
        assert again.spool is not None
        assert again.spool.depth == produced
        again.stop()
    finally:
        camera.hang.set()
        second.hang.set()


@pytest.mark.integration
def test_a_source_replaced_on_reload_that_will_not_stop_is_detached(
    tmp_path: Path, tiny_model: Path, monkeypatch: Any
) -> None:
    # the old source outlived its join and went on feeding the slot beside its replacement
    import edged.pipeline.runner
    from edged.config import load_config

    monkeypatch.setattr(edged.pipeline.runner, "SOURCE_STOP_S", 0.5)
    stuck, fresh = SilentCamera(), SilentCamera(10**9)  # the new camera never runs out
    cfg = base_config(tmp_path, tiny_model, "rtsp://old.invalid/stream", stop_at_end=False)
    path = write_config(tmp_path / "edged.yaml", cfg)
    daemon = Daemon(
        load_config(path),
        config_path=path,
        source_kwargs={"capture_factory": lambda c: stuck if "old" in str(c.uri) else fresh},
    )
    waiter = start(daemon)
    try:
        rt = daemon.pipelines[0]
        wait_for(lambda: rt.stats.frames_captured >= 20, 30, "the old camera's frames, then silence")
        old = rt.source
        cfg["pipelines"][0]["source"]["uri"] = "rtsp://new.invalid/stream"
        write_config(path, cfg)
        assert daemon.reloader.reload()
        assert old is not None
        assert old.is_alive()  # still stuck in its read
        assert old.slot is not rt.slot  # but no longer feeding the pipeline
        assert rt.source is not old
        assert rt.source is not None
        assert rt.source.slot is rt.slot
        before = rt.stats.frames
        wait_for(lambda: rt.stats.frames > before + 10, 30, "results from the new camera")
    finally:
        stuck.hang.set()
        fresh.hang.set()
        finish(daemon, waiter)


@pytest.mark.integration
def test_a_forced_yolov5_on_a_yolov8_head_fails_check_config_and_run(tmp_path: Path) -> None:
    # the head [1, 4 + nc, N] read as YOLOv5 [1, N, 5 + nc] published garbage silently (no labels to check)
    from detect_models import make_detector

    model = make_detector(tmp_path / "v8.onnx", "yolov8", labels=False)
    cfg = base_config(tmp_path, model, str(make_video(tmp_path / "v.mp4", 3, size=(64, 64))))
    cfg["pipelines"][0]["postprocess"] = {"type": "detect", "format": "yolov5"}
    path = write_config(tmp_path / "edged.yaml", cfg)
    checked = run_cli("check-config", str(path))
    assert checked.returncode == 1
    (problem,) = checked.stderr.strip().splitlines()
    assert 'pipelines[0].postprocess={"type": "detect", "format": "yolov5"}' in problem
    assert "set format: yolov8" in problem
    ran = run_cli("run", "--config", str(path))
    assert ran.returncode == 1
    assert "set format: yolov8" in ran.stderr
    cfg["pipelines"][0]["postprocess"]["format"] = "auto"  # aftermath: the same head, read right, passes
    assert run_cli("check-config", str(write_config(path, cfg))).returncode == 0


class ExplodingCamera:
    """A capture whose read() raises something no source handles (a driver bug): the thread body dies."""

    def isOpened(self) -> bool:  # noqa: N802  (OpenCV's name)
        return True

    def read(self) -> tuple[bool, Any]:
        raise RuntimeError("driver bug")

    def release(self) -> None:
        pass


def test_a_source_thread_that_dies_marks_its_pipeline_failed_and_the_status_says_why(
    tmp_path: Path, tiny_model: Path
) -> None:
    # a source body that raised ended its thread silently: the pipeline stayed "running" with no frames
    cfg = base_config(tmp_path, tiny_model, "/dev/video9", stop_at_end=False)
    daemon = Daemon(config_from_dict(cfg), source_kwargs={"capture_factory": lambda _c: ExplodingCamera()})
    waiter = start(daemon)
    try:
        runner = daemon.pipelines[0]
        wait_for(lambda: runner.stats.state == "failed", 30, "the pipeline marked failed")
        assert "source thread died: RuntimeError: driver bug" in (runner.stats.error or "")
        snapshot = daemon.snapshot()
        assert snapshot["state"] == "degraded"
        assert "pipeline cam0 failed: source thread died: RuntimeError: driver bug" in snapshot["reasons"]
        assert "thread edged-source-cam0 died: RuntimeError: driver bug" in snapshot["reasons"]
        waiter.join(30)  # aftermath: its workers finished, every pipeline ended, so wait() returned
        assert not waiter.is_alive()
    finally:
        finish(daemon, waiter)


@pytest.mark.integration
def test_reload_names_every_change_applied_or_needing_a_restart(tmp_path: Path, tiny_model: Path) -> None:
    # a reload said "applied" while some changes were silently kept as they were
    import logging

    daemon, cfg, path = reloadable_daemon(tmp_path, tiny_model)
    level = logging.getLogger().level
    waiter = start(daemon)
    try:
        cfg["log_level"] = "warning"
        cfg["mqtt"]["keepalive_s"] = 60
        cfg["pipelines"][0]["model"]["threads"] = 2
        cfg["pipelines"][0]["publish"] = {"mode": "on_change"}
        cfg["pipelines"][0]["snapshot"] = {"enabled": True}
        write_config(path, cfg)
        assert daemon.reloader.reload()
        notes = daemon.reloader.status()["notes"]
        assert "mqtt changed: takes effect after a restart" in notes
        assert "pipeline cam0: threads/concurrency take effect after a restart" in notes
        assert any("publish/snapshot settings applied" in n for n in notes)
        assert "log_level warning applied" in notes
        runner = daemon.pipelines[0]
        assert runner.cfg.publish.mode == "on_change"
        assert runner.cfg.model.threads == 0  # what runs is what the config of the daemon says
        assert runner.outlet is not None
        assert runner.outlet.snapshots is not None
        # aftermath: results still flow, and the next reload with nothing new changes nothing
        before = runner.stats.frames
        wait_for(lambda: runner.stats.frames > before + 5, 30, "results after the reload")
        assert daemon.reloader.reload()
        assert daemon.reloader.status()["notes"] == [
            "mqtt changed: takes effect after a restart",
            "pipeline cam0: threads/concurrency take effect after a restart",
        ]
    finally:
        finish(daemon, waiter)
        logging.getLogger().setLevel(level)
