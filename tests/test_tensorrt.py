"""TensorRT engines: the cache key, the cache folder, `building_engine` before READY, `edged prepare`. This
machine has no GPU: the TensorRT session is a fake (said so in each test); the cache logic is real."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import onnxruntime as ort
import pytest
from conftest import base_config, make_tiny_model, make_video
from inprocess import CPU, model

from edged.config import config_from_dict
from edged.daemon import Daemon
from edged.model import engines, trtcache
from edged.tools.prepare import prepare

TRT = "TensorrtExecutionProvider"


# -- the CPU core budget -------------------------------------------------------------------------------------


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
