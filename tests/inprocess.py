"""Helpers for tests that run the daemon in this process: start and finish it, cameras that
misbehave (this machine has no camera: these are fakes of the source, said so here),
configs with two pipelines, and reading results from a spool file."""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

from conftest import base_config, make_tiny_model, make_video, write_config

from edged.config import config_from_dict
from edged.daemon import Daemon
from edged.model.settings import ModelConfig


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


def reloadable_daemon(tmp_path: Path, model: Path) -> tuple[Daemon, dict[str, Any], Path]:
    """A daemon on a looping video, started from a config file that the test then changes and reloads."""
    from edged.config import load_config

    video = make_video(tmp_path / "v.mp4", 30)
    cfg = base_config(tmp_path, model, str(video), fps=50, loop=True, stop_at_end=False)
    path = write_config(tmp_path / "edged.yaml", cfg)
    return Daemon(load_config(path), config_path=path), cfg, path


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


class ExplodingCamera:
    """A capture whose read() raises something no source handles (a driver bug): the thread body dies."""

    def isOpened(self) -> bool:  # noqa: N802  (OpenCV's name)
        return True

    def read(self) -> tuple[bool, Any]:
        raise RuntimeError("driver bug")

    def release(self) -> None:
        pass


def live_daemon(tmp_path: Path, model: Path, **top: Any) -> Daemon:
    video = make_video(tmp_path / "v.mp4", 30)
    cfg = base_config(tmp_path, model, str(video), fps=50, loop=True, stop_at_end=False)
    cfg.update(top)
    return Daemon(config_from_dict(cfg))


def results(state_dir: Path) -> list[dict[str, Any]]:
    import json

    with sqlite3.connect(state_dir / "spool.db") as conn:
        return [json.loads(p) for (p,) in conn.execute("SELECT payload FROM results ORDER BY id")]


CPU = "CPUExecutionProvider"


def seqs(state_dir: Path, pipeline: str) -> list[int]:
    with sqlite3.connect(state_dir / "spool.db") as conn:
        payloads = conn.execute("SELECT payload FROM results WHERE pipeline = ? ORDER BY id", (pipeline,))
        return [json.loads(p)["seq"] for (p,) in payloads]


def two_pipelines(tmp_path: Path, first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    cfg = base_config(tmp_path, make_tiny_model(tmp_path / "a.onnx"), "unused")
    template = cfg["pipelines"][0]
    b_model = make_tiny_model(tmp_path / "b.onnx")
    cfg["pipelines"] = [
        {**template, "name": "a", "source": {**template["source"], **first}},
        {
            **template,
            "name": "b",
            "source": {**template["source"], **second},
            "model": {**template["model"], "path": str(b_model)},
        },
    ]
    return cfg


def by_name(snap: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in snap["pipelines"] if p["name"] == name)


def model(tmp_path: Path, **kw: Any) -> ModelConfig:
    path = tmp_path / "m.onnx"
    if not path.exists():
        make_tiny_model(path)
    return ModelConfig(path=path, **kw)
