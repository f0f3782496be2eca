"""Health never lies: a failure anywhere (a raising result hook, a dead source thread, a model failing at run
time, a broker that stops acknowledging) turns the status degraded with its reason, stops only the pipeline
it hit, and the status recovers when the cause goes."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import base_config, make_video, wait_for
from inprocess import ExplodingCamera, by_name, finish, seqs, start, two_pipelines

from edged.config import config_from_dict
from edged.daemon import Daemon
from edged.model.session import LoadedModel


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
        assert daemon.report.health() == "degraded"
        assert "pipeline cam0 failed: storing the result failed: a hook that breaks" in daemon.report.reasons()
        wait_for(lambda: not rt.running(), 30, "every worker of the pipeline ended")
    finally:
        finish(daemon, waiter)  # aftermath: the daemon still stops cleanly (it also stops by itself here)


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
        snapshot = daemon.report.snapshot()
        assert snapshot["state"] == "degraded"
        assert "pipeline cam0 failed: source thread died: RuntimeError: driver bug" in snapshot["reasons"]
        assert "thread edged-source-cam0 died: RuntimeError: driver bug" in snapshot["reasons"]
        waiter.join(30)  # aftermath: its workers finished, every pipeline ended, so wait() returned
        assert not waiter.is_alive()
    finally:
        finish(daemon, waiter)


@pytest.mark.integration
def test_a_dead_source_degrades_status_while_the_other_pipeline_keeps_producing(tmp_path: Path) -> None:
    dying = make_video(tmp_path / "dying.mp4", 10)
    video = make_video(tmp_path / "ok.mp4", 60)
    # a: ends without stop_at_end, so it is reopened, and by then its file is gone (a camera unplugged)
    cfg = two_pipelines(tmp_path, {"uri": str(dying), "stop_at_end": False}, {"uri": str(video)})
    daemon = Daemon(config_from_dict(cfg))
    daemon.start()
    try:
        wait_for(lambda: by_name(daemon.report.snapshot(), "a")["frames"] >= 10, 30, "pipeline a's frames")
        dying.unlink()
        wait_for(lambda: "file not found" in (by_name(daemon.report.snapshot(), "a")["error"] or ""), 30, "a failing")
        wait_for(lambda: by_name(daemon.report.snapshot(), "b")["state"] == "ended", 60, "b to finish its file")
        snap = daemon.report.snapshot()
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
        wait_for(lambda: by_name(daemon.report.snapshot(), "a")["state"] == "failed", 30, "pipeline a to fail")
        at_failure = by_name(daemon.report.snapshot(), "b")["frames"]
        wait_for(lambda: by_name(daemon.report.snapshot(), "b")["frames"] >= at_failure + 30, 30, "b to go on")
        snap = daemon.report.snapshot()
    finally:
        daemon.stop()
    assert snap["state"] == "degraded"
    assert "device lost" in by_name(snap, "a")["error"]
    assert by_name(snap, "b")["state"] == "running"
    b = seqs(tmp_path / "state", "b")
    assert b == list(range(1, len(b) + 1))


@pytest.mark.integration
def test_a_broker_that_stops_acknowledging_makes_status_degraded_until_it_acknowledges_again(
    tmp_path: Path, tiny_model: Path, own_broker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 7: a broker that keeps the connection but acknowledges nothing (here a real Mosquitto frozen
    with SIGSTOP) left status `running` for good. The stall threshold is lowered for the test."""
    import threading

    import edged.ops.reasons
    from edged.config import config_from_dict
    from edged.daemon import Daemon

    monkeypatch.setattr(edged.ops.reasons, "ACK_STALL_S", 1.0)
    own_broker.start()
    video = make_video(tmp_path / "v.mp4", 30)
    cfg = base_config(tmp_path, tiny_model, str(video), broker=own_broker, fps=30, loop=True, stop_at_end=False)
    daemon = Daemon(config_from_dict(cfg))
    daemon.start()
    waiter = threading.Thread(target=daemon.wait, name="test-wait")
    waiter.start()
    try:
        wait_for(lambda: daemon.mqtt_stats.published >= 10 and daemon.report.health() == "running", 30, "results")
        assert own_broker.proc is not None
        own_broker.proc.send_signal(signal.SIGSTOP)
        wait_for(lambda: any("acknowledged nothing" in r for r in daemon.report.reasons()), 30, "the stall reported")
        assert daemon.report.health() == "degraded"
        assert daemon.mqtt_stats.connected  # the connection itself looks fine: only the acks tell
        wait_for(lambda: daemon.spool is not None and daemon.spool.depth >= 30, 30, "results waiting meanwhile")
        own_broker.proc.send_signal(signal.SIGCONT)
        wait_for(lambda: daemon.report.health() == "running", 30, "healthy again once acks come")
        wait_for(lambda: daemon.spool is not None and daemon.spool.depth < 30, 30, "the backlog sent")
    finally:
        if own_broker.proc is not None:
            own_broker.proc.send_signal(signal.SIGCONT)
        daemon.request_stop()
        waiter.join(30)
        daemon.stop()
    assert not waiter.is_alive()
