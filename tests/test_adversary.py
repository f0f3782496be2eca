"""The config file, the model file, the state_dir and the reload path as adversaries (issue "Never silently
lose", findings 3, 4, 6 and 7; the spool and broker findings are in test_spool.py and test_faults.py).
Each case failed on the code before the fix: a traceback, gigabytes of memory, a dead thread, exit 0, or
two daemons on one spool. Real processes, real files, real ONNX Runtime."""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import onnx
import pytest
import yaml
from conftest import base_config, make_video, wait_for, write_config

CLI_MEMORY_LIMIT = 3 * 2**30  # the alias bomb took check-config to 6 GB; a bounded loader needs far less


def limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CLI_MEMORY_LIMIT, CLI_MEMORY_LIMIT))


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edged", *args],
        capture_output=True, text=True, timeout=120, check=False, preexec_fn=limit_memory,
    )  # fmt: skip


def alias_bomb() -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 10):
        refs = ", ".join([f"*a{i - 1}"] * 9)
        lines.append(f"a{i}: &a{i} [{refs}]")
    return "\n".join(lines) + "\n"


HOSTILE: dict[str, tuple[bytes, int, str]] = {
    # name: (file content, line the error names, what the message says)
    "alias bomb": (alias_bomb().encode(), 1, "aliases are expanded"),
    "deep nesting": (b"device_id: x\nstate_dir: " + b"[" * 100_000 + b"]" * 100_000 + b"\n", 2, "nested deeper"),
    "huge integer": (b"device_id: x\nstatus:\n  mode: " + b"7" * 5000 + b"\n", 3, "more than 20 digits"),
    "not utf-8": (b"device_id: x\nstate_dir: /var/lib/\xff\xfeedged\n", 2, "not UTF-8"),
    "duplicate key": (b"device_id: a\nstate_dir: /tmp/x\ndevice_id: b\n", 3, "key given twice"),
    "50 MB": (b"device_id: x\n# " + b"y" * (50 * 2**20) + b"\n", 1, "larger than"),
}


@pytest.mark.integration
@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_config_is_one_clear_line_and_bounded_memory(tmp_path: Path, name: str) -> None:
    content, line, says = HOSTILE[name]
    path = tmp_path / "edged.yaml"
    path.write_bytes(content)
    res = run_cli("check-config", str(path))
    assert res.returncode == 1, res.stderr[-2000:]
    assert "Traceback" not in res.stderr, res.stderr[-2000:]
    (problem,) = res.stderr.strip().splitlines()
    assert problem.startswith(f"{path}:{line} "), problem
    assert says in problem


@pytest.mark.parametrize(
    ("topic", "says"),
    [
        ("edged/{device_id}/#", "wildcards"),
        ("edged/+/{pipeline}", "wildcards"),
        ("$SYS/edged/{device_id}", "belong to the broker"),
        ("", "cannot be empty"),
        ("t/" + "x" * 65_500 + "/{pipeline}", "MQTT allows 65535"),
    ],
)
@pytest.mark.integration
def test_a_topic_no_broker_takes_fails_check_config(tmp_path: Path, tiny_model: Path, topic: str, says: str) -> None:
    cfg = base_config(tmp_path, tiny_model, "/dev/video9")  # a camera that is not there: check-config passes it
    cfg["mqtt"]["topic"] = topic
    path = write_config(tmp_path / "edged.yaml", cfg)
    res = run_cli("check-config", str(path))
    assert res.returncode == 1
    (problem,) = res.stderr.strip().splitlines()
    assert " mqtt.topic=" in problem
    assert says in problem


def broken_models(tmp_path: Path, good: Path) -> dict[str, Path]:
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    truncated = tmp_path / "truncated.onnx"
    data = good.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    future = onnx.load(str(good))
    future.opset_import[0].version = 99
    too_new = tmp_path / "opset99.onnx"
    onnx.save(future, str(too_new))
    return {"empty": empty, "truncated": truncated, "opset 99": too_new}


@pytest.mark.integration
def test_check_config_and_inspect_refuse_a_model_onnx_runtime_cannot_load(tmp_path: Path, tiny_model: Path) -> None:
    for name, model in broken_models(tmp_path, tiny_model).items():
        cfg = base_config(tmp_path, model, "/dev/video9")  # a camera that is not there: check-config passes it
        path = write_config(tmp_path / "edged.yaml", cfg)
        res = run_cli("check-config", str(path))
        assert res.returncode == 1, f"{name}: {res.stdout}"
        (problem,) = res.stderr.strip().splitlines()
        assert f"pipelines[0].model.path={model}: ONNX Runtime cannot load it" in problem, name
        assert problem.startswith(f"{path}:"), problem
        inspected = run_cli("inspect", str(model))
        assert inspected.returncode == 1, f"{name}: {inspected.stdout}"
        assert "Traceback" not in inspected.stderr
    good = base_config(tmp_path, tiny_model, "/dev/video9")  # a camera that is not there: check-config passes it
    assert run_cli("check-config", str(write_config(tmp_path / "good.yaml", good))).returncode == 0  # still fine
    assert run_cli("inspect", str(tiny_model)).returncode == 0


@pytest.mark.integration
def test_a_second_daemon_on_the_same_state_dir_is_refused_before_it_opens_anything(
    tmp_path: Path, tiny_model: Path, start_daemon: Any
) -> None:
    video = make_video(tmp_path / "v.mp4", 30)
    cfg = base_config(tmp_path, tiny_model, str(video), fps=30, loop=True, stop_at_end=False)
    first = start_daemon(write_config(tmp_path / "a.yaml", cfg))
    wait_for(lambda: (s := first.status()) and s["pipelines"][0]["frames"] >= 5, 30, "the first daemon's results")
    other = {**cfg, "status": {"socket": str(tmp_path / "other.sock")}}  # a different socket: the probe misses it
    second = start_daemon(write_config(tmp_path / "b.yaml", other))
    code, err = second.wait(60)
    assert code == 1
    assert "another edged" in err
    assert f"(pid {first.proc.pid})" in err
    assert "Traceback" not in err
    assert not (tmp_path / "other.sock").exists()
    # aftermath: the first one never noticed; once it stops, a new daemon takes the state_dir
    snap = first.status()
    assert snap is not None
    assert snap["state"] == "running", snap.get("reasons")
    seq_before = snap["pipelines"][0]["frames"]
    code, err = first.stop()
    assert code == 0, err
    third = start_daemon(write_config(tmp_path / "c.yaml", cfg))
    wait_for(lambda: (s := third.status()) and s["pipelines"][0]["frames"] >= 5, 30, "the next daemon's results")
    code, err = third.stop()
    assert code == 0, err
    assert seq_before > 0


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
def test_a_broker_that_stops_acknowledging_makes_status_degraded_until_it_acknowledges_again(
    tmp_path: Path, tiny_model: Path, own_broker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 7: a broker that keeps the connection but acknowledges nothing (here a real Mosquitto frozen
    with SIGSTOP) left status `running` for good. The stall threshold is lowered for the test."""
    import threading

    import edged.daemon
    from edged.config import config_from_dict
    from edged.daemon import Daemon

    monkeypatch.setattr(edged.daemon, "ACK_STALL_S", 1.0)
    own_broker.start()
    video = make_video(tmp_path / "v.mp4", 30)
    cfg = base_config(tmp_path, tiny_model, str(video), broker=own_broker, fps=30, loop=True, stop_at_end=False)
    daemon = Daemon(config_from_dict(cfg))
    daemon.start()
    waiter = threading.Thread(target=daemon.wait, name="test-wait")
    waiter.start()
    try:
        wait_for(lambda: daemon.mqtt_stats.published >= 10 and daemon.health() == "running", 30, "results flowing")
        assert own_broker.proc is not None
        own_broker.proc.send_signal(signal.SIGSTOP)
        wait_for(lambda: any("acknowledged nothing" in r for r in daemon.reasons()), 30, "the stall reported")
        assert daemon.health() == "degraded"
        assert daemon.mqtt_stats.connected  # the connection itself looks fine: only the acks tell
        wait_for(lambda: daemon.spool is not None and daemon.spool.depth >= 30, 30, "results waiting meanwhile")
        own_broker.proc.send_signal(signal.SIGCONT)
        wait_for(lambda: daemon.health() == "running", 30, "healthy again once acks come")
        wait_for(lambda: daemon.spool is not None and daemon.spool.depth < 30, 30, "the backlog sent")
    finally:
        if own_broker.proc is not None:
            own_broker.proc.send_signal(signal.SIGCONT)
        daemon.request_stop()
        waiter.join(30)
        daemon.stop()
    assert not waiter.is_alive()
