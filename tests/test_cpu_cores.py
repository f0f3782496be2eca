"""CPU cores are shared between CPU pipelines: each plans its concurrent runs within its share."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import make_video
from inprocess import CPU, model, two_pipelines

from edged.config import config_from_dict
from edged.daemon import Daemon
from edged.model.session import share_cores, thread_plan


def test_cores_are_shared_between_cpu_pipelines(tmp_path: Path) -> None:
    auto = model(tmp_path)
    assert share_cores([auto], [True], 4) == [4]
    assert share_cores([auto, auto], [True, True], 4) == [2, 2]  # a 4-core Pi, two cameras
    assert share_cores([auto, auto, auto], [True, True, True], 4) == [2, 1, 1]
    assert share_cores([auto] * 6, [True] * 6, 4) == [1] * 6  # never below one core
    assert share_cores([auto, auto], [False, True], 4) == [4, 4]  # a GPU pipeline does not count
    pinned = model(tmp_path, concurrency=1, threads=3)
    assert share_cores([pinned, auto], [True, True], 4) == [3, 1]  # explicit settings take their cores first
    # and each pipeline plans within its share
    assert [thread_plan(auto, CPU, c) for c in share_cores([auto, auto], [True, True], 4)] == [(2, 1), (2, 1)]


def test_two_cpu_pipelines_in_the_daemon_get_half_the_cores_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("edged.pipeline.startup.usable_cores", lambda: 4)
    video = make_video(tmp_path / "v.mp4", 3)
    daemon = Daemon(config_from_dict(two_pipelines(tmp_path, {"uri": str(video)}, {"uri": str(video)})))
    daemon.start()
    try:
        assert [len(rt.workers) for rt in daemon.pipelines] == [2, 2]
    finally:
        daemon.stop()
