"""Reload: SIGHUP, a model file replaced on disk, a pinned sha256. An invalid config is refused and the running
one stays; a changed model is swapped between two frames; every change is named as applied or needing a
restart; the reload path survives bad input and its own errors, and the next reload works."""

from __future__ import annotations

import logging
import shutil
import signal
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import NotifySocket, base_config, make_tiny_model, make_video, wait_for, write_config
from hostile import run_set_aside
from inprocess import SilentCamera, finish, live_daemon, reloadable_daemon, results, start

from edged.daemon import Daemon


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
def test_reload_names_every_change_applied_or_needing_a_restart(tmp_path: Path, tiny_model: Path) -> None:
    # a reload said "applied" while some changes were silently kept as they were

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


@pytest.mark.integration
def test_a_non_utf8_config_on_sighup_is_rejected_and_the_next_reload_works(
    tmp_path: Path, tiny_model: Path, start_daemon: Any
) -> None:
    video = make_video(tmp_path / "v.mp4", 30)
    cfg = base_config(tmp_path, tiny_model, str(video), fps=30, loop=True, stop_at_end=False)
    path = write_config(tmp_path / "edged.yaml", cfg)
    daemon = start_daemon(path)
    wait_for(lambda: (s := daemon.status()) and s["pipelines"][0]["frames"] >= 5, 30, "results")
    good = path.read_bytes()
    path.write_bytes(good.replace(b"device_id:", b"device_id: \xff\xfe #"))
    daemon.proc.send_signal(signal.SIGHUP)
    snap = wait_for(lambda: (s := daemon.status()) and s["reload"]["result"] == "rejected" and s, 30, "rejected")
    assert "not UTF-8" in snap["reload"]["notes"][0]
    assert snap["state"] == "running", snap["reasons"]  # the reload thread lives; the old config runs
    # the next reload is still heard and applied
    cfg["log_level"] = "warning"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    daemon.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: (s := daemon.status()) and s["reload"]["result"] == "applied", 30, "the next reload applied")
    status = daemon.status()
    assert status is not None
    frames = status["pipelines"][0]["frames"]
    wait_for(lambda: (s := daemon.status()) and s["pipelines"][0]["frames"] > frames, 30, "results after it")
    code, err = daemon.stop()
    assert code == 0, err
    assert "Traceback" not in err


@pytest.mark.integration
def test_the_reload_thread_survives_an_unexpected_error(
    tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever goes wrong in one reload, the thread stays and the next reload works. Fault injection: the
    config loader raises an error nobody planned for, once (in-process, so the daemon's own objects show it)."""
    import edged.ops.reload
    from edged.config import load_config
    from edged.daemon import Daemon

    video = make_video(tmp_path / "v.mp4", 30)
    cfg = base_config(tmp_path, tiny_model, str(video), fps=30, loop=True, stop_at_end=False)
    path = write_config(tmp_path / "edged.yaml", cfg)
    daemon = Daemon(load_config(path), config_path=path)
    daemon.start()
    calls = {"n": 0}

    def flaky(p: Path) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("an error nobody planned for")
        return load_config(p)

    monkeypatch.setattr(edged.ops.reload, "load_config", flaky)
    try:
        daemon.request_reload()
        wait_for(lambda: daemon.reloader.status()["result"] == "rejected", 30, "the reload rejected")
        assert "an error nobody planned for" in daemon.reloader.status()["notes"][0]
        assert daemon.reloader.is_alive()
        daemon.request_reload()
        wait_for(lambda: daemon.reloader.status()["result"] == "applied", 30, "the next reload applied")
    finally:
        daemon.request_stop()
        daemon.stop()
    assert not daemon.reloader.is_alive()


@pytest.mark.integration
def test_sighup_rejects_a_bad_config_and_swaps_the_model_of_a_good_one(
    tmp_path: Path, start_daemon: Any, notify_socket: NotifySocket
) -> None:
    model_a = make_tiny_model(tmp_path / "a.onnx")
    model_b = make_tiny_model(tmp_path / "b.onnx", classes=3)
    video = make_video(tmp_path / "v.mp4", 30)
    cfg = base_config(tmp_path, model_a, str(video), fps=50, loop=True, stop_at_end=False)
    config = write_config(tmp_path / "edged.yaml", cfg)
    daemon = start_daemon(config)
    wait_for(lambda: (s := daemon.status()) and s["pipelines"][0]["frames"] >= 10, 30, "results")
    good = config.read_text()
    config.write_text(good.replace("device_id", "devce_id"), encoding="utf-8")  # a typo
    daemon.proc.send_signal(signal.SIGHUP)
    snap = wait_for(lambda: (s := daemon.status()) and s["reload"]["result"] and s, 30, "the reload to finish")
    assert snap["reload"]["result"] == "rejected"
    assert "devce_id=" in snap["reload"]["notes"][0]
    assert "unknown key" in snap["reload"]["notes"][0]
    assert snap["state"] == "running"  # the old config keeps running
    cfg["pipelines"][0]["model"]["path"] = str(model_b)
    write_config(config, cfg)
    daemon.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: (s := daemon.status()) and s["reload"]["result"] == "applied", 30, "the good reload")
    old_sha = snap["pipelines"][0]["model"]["sha256"]
    wait_for(lambda: (s := daemon.status()) and s["pipelines"][0]["model"]["sha256"] != old_sha, 30, "the swap")
    frames = daemon.status()["pipelines"][0]["frames"]
    wait_for(lambda: daemon.status()["pipelines"][0]["frames"] >= frames + 10, 30, "results from the new model")
    code, err = daemon.stop()
    assert code == 0, err
    msgs = results(tmp_path / "state")
    assert [m["seq"] for m in msgs] == list(range(1, len(msgs) + 1))  # no gap across the swap
    shas = [m["model"]["sha256"] for m in msgs]
    assert len(set(shas)) == 2  # each result names the model that produced it
    switch = shas.index(shas[-1])
    assert switch > 0
    assert all(s == shas[-1] for s in shas[switch:])  # switched once, between two frames


@pytest.mark.integration
def test_model_file_replaced_under_load_swaps_and_a_broken_one_is_refused(tmp_path: Path, tiny_model: Path) -> None:
    model = tmp_path / "model.onnx"
    shutil.copy(tiny_model, model)
    daemon = live_daemon(tmp_path, model)
    daemon.reloader.poll_s = 0.1
    daemon.start()
    waiter = threading.Thread(target=daemon.wait, name="test-wait")
    waiter.start()
    wait_for(lambda: daemon.pipelines[0].stats.frames >= 10, 10, "results")
    old_sha = daemon.pipelines[0].stats.model_sha256
    # a broken file first: the old model keeps running and the status says why
    broken = tmp_path / "broken.tmp"
    broken.write_bytes(b"not a model")
    broken.replace(model)
    wait_for(lambda: "model swap failed" in (daemon.pipelines[0].stats.error or ""), 10, "a refused swap")
    assert daemon.pipelines[0].stats.model_sha256 == old_sha
    frames = daemon.pipelines[0].stats.frames
    wait_for(lambda: daemon.pipelines[0].stats.frames >= frames + 10, 10, "still producing")
    # then a good new model, moved into place the way operators should (atomic rename)
    fresh = make_tiny_model(tmp_path / "fresh.tmp", classes=3)
    fresh.replace(model)
    wait_for(lambda: daemon.pipelines[0].stats.model_sha256 != old_sha, 10, "the swap")
    frames = daemon.pipelines[0].stats.frames
    wait_for(lambda: daemon.pipelines[0].stats.frames >= frames + 10, 10, "results from the new model")
    daemon.request_stop()
    waiter.join(10)
    daemon.stop()
    msgs = results(tmp_path / "state")
    assert [m["seq"] for m in msgs] == list(range(1, len(msgs) + 1))
    assert len({m["model"]["sha256"] for m in msgs}) == 2
    assert daemon.pipelines[0].stats.error is None


@pytest.mark.integration
def test_pinned_sha256_refuses_another_model(tmp_path: Path, tiny_model: Path, start_daemon: Any) -> None:
    cfg = base_config(tmp_path, tiny_model, str(make_video(tmp_path / "v.mp4", 3)))
    cfg["pipelines"][0]["model"]["sha256"] = "0" * 64
    # the pipeline is set aside (no other model may run: the pin), the daemon runs on and says why
    code, reasons, err = run_set_aside(write_config(tmp_path / "edged.yaml", cfg))
    assert code == 0, err[-2000:]
    assert any("set aside" in r and "but model.sha256 pins 0000000000000000" in r for r in reasons), reasons
