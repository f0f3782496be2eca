"""Several pipelines in one daemon: isolation of failures, the CPU core budget, TensorRT engine lifecycle."""

from __future__ import annotations

import json
import shutil
import sqlite3
import threading
from pathlib import Path
from typing import Any

import onnxruntime as ort
import pytest
from conftest import base_config, make_tiny_model, make_video, wait_for

from edged.config import config_from_dict
from edged.daemon import Daemon
from edged.model import engines, trtcache
from edged.model.session import LoadedModel, share_cores, thread_plan
from edged.model.settings import ModelConfig
from edged.tools.prepare import prepare

CPU = "CPUExecutionProvider"
TRT = "TensorrtExecutionProvider"


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


@pytest.mark.integration
def test_a_dead_source_degrades_status_while_the_other_pipeline_keeps_producing(tmp_path: Path) -> None:
    dying = make_video(tmp_path / "dying.mp4", 10)
    video = make_video(tmp_path / "ok.mp4", 60)
    # a: ends without stop_at_end, so it is reopened, and by then its file is gone (a camera unplugged)
    cfg = two_pipelines(tmp_path, {"uri": str(dying), "stop_at_end": False}, {"uri": str(video)})
    daemon = Daemon(config_from_dict(cfg))
    daemon.start()
    try:
        wait_for(lambda: by_name(daemon.snapshot(), "a")["frames"] >= 10, 30, "pipeline a's frames")
        dying.unlink()
        wait_for(lambda: "file not found" in (by_name(daemon.snapshot(), "a")["error"] or ""), 30, "a failing")
        wait_for(lambda: by_name(daemon.snapshot(), "b")["state"] == "ended", 60, "pipeline b to finish its file")
        snap = daemon.snapshot()
    finally:
        daemon.stop()
    assert snap["state"] == "degraded"
    assert by_name(snap, "a")["state"] == "reconnecting"
    assert by_name(snap, "a")["reconnects"] >= 1
    assert by_name(snap, "b")["frames"] == 60
    assert seqs(tmp_path / "state", "b") == list(range(1, 61))  # its own seq, untouched by a's trouble
    assert not [t.name for t in threading.enumerate() if t.name.startswith("edged-")]


@pytest.mark.integration
def test_a_model_failing_at_run_time_stops_only_its_pipeline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    video = make_video(tmp_path / "v.mp4", 30)
    loop = {"uri": str(video), "loop": True, "stop_at_end": False}
    daemon = Daemon(config_from_dict(two_pipelines(tmp_path, loop, loop)))
    real_run = LoadedModel.run
    calls = {"a": 0}

    def flaky(self: LoadedModel, tensor: Any) -> Any:
        # pipeline a's (real) model breaks at run time, as a GPU error would; b's is left alone
        if self.path.name == "a.onnx":
            calls["a"] += 1
            if calls["a"] > 5:
                raise RuntimeError("device lost")
        return real_run(self, tensor)

    monkeypatch.setattr(LoadedModel, "run", flaky)
    daemon.start()
    try:
        wait_for(lambda: by_name(daemon.snapshot(), "a")["state"] == "failed", 30, "pipeline a to fail")
        at_failure = by_name(daemon.snapshot(), "b")["frames"]
        wait_for(lambda: by_name(daemon.snapshot(), "b")["frames"] >= at_failure + 30, 30, "b to go on")
        snap = daemon.snapshot()
    finally:
        daemon.stop()
    assert snap["state"] == "degraded"
    assert "device lost" in by_name(snap, "a")["error"]
    assert by_name(snap, "b")["state"] == "running"
    b = seqs(tmp_path / "state", "b")
    assert b == list(range(1, len(b) + 1))


# -- the CPU core budget -------------------------------------------------------------------------------------


def model(tmp_path: Path, **kw: Any) -> ModelConfig:
    path = tmp_path / "m.onnx"
    if not path.exists():
        make_tiny_model(path)
    return ModelConfig(path=path, **kw)


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
    monkeypatch.setattr("edged.daemon.usable_cores", lambda: 4)
    video = make_video(tmp_path / "v.mp4", 3)
    daemon = Daemon(config_from_dict(two_pipelines(tmp_path, {"uri": str(video)}, {"uri": str(video)})))
    daemon.start()
    try:
        assert [len(rt.workers) for rt in daemon.pipelines] == [2, 2]
    finally:
        daemon.stop()


# -- TensorRT engine lifecycle (no GPU needed) -------------------------------------------------------------------


def test_engine_cache_key_follows_model_tensorrt_version_and_precision(tmp_path: Path) -> None:
    cfg = model(tmp_path)
    sha = "0123456789abcdef" + "0" * 48
    assert trtcache.cache_key(sha, "10.3.0", cfg) == "0123456789abcdef-trt10.3.0-fp16-int8"
    assert trtcache.cache_key(sha, "10.3.0", model(tmp_path, trt_int8=False)) == "0123456789abcdef-trt10.3.0-fp16"
    assert trtcache.cache_key(sha, "10.3.0", model(tmp_path, trt_int8=False, trt_fp16=False)).endswith("-fp32")
    keys = {
        trtcache.cache_key(sha, "10.3.0", cfg),
        trtcache.cache_key("f" * 64, "10.3.0", cfg),
        trtcache.cache_key(sha, "8.6.2", cfg),
        trtcache.cache_key(sha, "10.3.0", model(tmp_path, trt_fp16=False)),
    }
    assert len(keys) == 4  # any change means another directory, so a stale engine is never loaded


def test_a_directory_holding_another_build_is_emptied_and_old_ones_are_cleaned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trtcache, "tensorrt_version", lambda: "10.3.0")
    cfg = model(tmp_path)
    sha = "ab" * 32
    path = trtcache.prepare_dir(cfg, tmp_path, sha)
    assert path == tmp_path / "trt-cache" / "abababababababab-trt10.3.0-fp16-int8"
    (path / "TensorrtExecutionProvider_TRTKernel_graph_1_sm87.engine").write_bytes(b"engine")
    assert trtcache.has_engine(path)
    assert trtcache.prepare_dir(cfg, tmp_path, sha) == path
    # not sealed (no warm-up finished after the build): the engine may be torn by a power cut, so it goes
    assert not trtcache.has_engine(path)
    (path / "TensorrtExecutionProvider_TRTKernel_graph_1_sm87.engine").write_bytes(b"engine")
    trtcache.seal(path)  # the warm-up built it: fsync'd, the manifest marked sealed
    assert trtcache.prepare_dir(cfg, tmp_path, sha) == path
    assert trtcache.has_engine(path)  # same key, sealed manifest: the engine is reused
    (path / trtcache.MANIFEST).write_text('{"sha256": "something else"}', encoding="utf-8")
    trtcache.prepare_dir(cfg, tmp_path, sha)
    assert not trtcache.has_engine(path)  # a manifest that does not match: rebuilt, never loaded
    root = tmp_path / "trt-cache"
    old = root / "abababababababab-trt8.6.2-fp16-int8"
    old.mkdir()
    (root / "TensorrtExecutionProvider_cache_sm87.timing").write_bytes(b"legacy unkeyed cache")
    (root / "notes.txt").write_text("not ours", encoding="utf-8")
    removed = trtcache.cleanup(root, {path.name})
    assert {p.name for p in removed} == {old.name, "TensorrtExecutionProvider_cache_sm87.timing"}
    assert sorted(p.name for p in root.iterdir()) == [path.name, "notes.txt"]


@pytest.mark.filterwarnings("ignore:Specified provider 'TensorrtExecutionProvider' is not in available provider")
def test_run_reports_building_engine_before_ready(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # This onnxruntime has only the CPU provider: the runtime is made to *report* TensorRT (monkeypatched
    # get_available_providers), the session then really falls back to CPU. That is enough to check
    # the keying and the state transitions; building a real engine needs a GPU.
    monkeypatch.setattr(ort, "get_available_providers", lambda: [TRT, CPU])
    monkeypatch.setattr(trtcache, "tensorrt_version", lambda: "10.3.0")
    events: list[str] = []

    def notify(msg: str) -> bool:
        events.append(msg)
        return True

    monkeypatch.setattr("edged.daemon.notify", notify)
    video = make_video(tmp_path / "v.mp4", 3)
    cfg = base_config(tmp_path, make_tiny_model(tmp_path / "m.onnx"), str(video))
    cfg["pipelines"][0]["model"]["providers"] = [TRT, CPU]
    config = config_from_dict(cfg)
    daemon = Daemon(config)
    states: list[str] = []
    stats = daemon.pipelines[0].stats
    real_set_state = type(stats).set_state

    def spy(self: Any, state: str, error: str | None = None) -> None:
        states.append(state)
        real_set_state(self, state, error)

    monkeypatch.setattr(type(stats), "set_state", spy)
    daemon.start()
    daemon.wait()
    daemon.stop()
    assert states[:2] == ["building_engine", "starting"]
    assert events.index("STATUS=building TensorRT engine for pipeline cam0") < events.index("READY=1")
    cache = tmp_path / "state" / "trt-cache"
    (key_dir,) = cache.iterdir()
    assert key_dir.name.endswith("-trt10.3.0-fp16-int8")
    assert json.loads((key_dir / trtcache.MANIFEST).read_text())["tensorrt"] == "10.3.0"
    # once an engine is in its directory, the next start announces no build
    (key_dir / "TensorrtExecutionProvider_TRTKernel_graph_1_sm87.engine").write_bytes(b"engine")
    assert engines.pending_build(config.pipelines[0].model, config.state_dir) is None
    shutil.rmtree(key_dir)
    assert engines.pending_build(config.pipelines[0].model, config.state_dir) == key_dir


@pytest.mark.filterwarnings("ignore:Specified provider 'TensorrtExecutionProvider' is not in available provider")
def test_prepare_fails_when_the_session_does_not_get_tensorrt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the runtime reports TensorRT (monkeypatched), but this CPU-only onnxruntime cannot give it to the session
    monkeypatch.setattr(ort, "get_available_providers", lambda: [TRT, CPU])
    cfg = base_config(tmp_path, make_tiny_model(tmp_path / "m.onnx"), "/dev/video9")
    cfg["pipelines"][0]["model"]["providers"] = [TRT, CPU]
    assert prepare(config_from_dict(cfg)) == 1


def test_prepare_builds_nothing_without_tensorrt(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = base_config(tmp_path, make_tiny_model(tmp_path / "m.onnx"), "/dev/video9")
    caplog.set_level("INFO")
    assert prepare(config_from_dict(cfg)) == 0
    assert "no TensorRT here" in caplog.text
