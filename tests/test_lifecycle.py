"""Living on the device: systemd unit gates, the notify protocol and watchdog, reload and model swap."""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, base_config, make_tiny_model, make_video, wait_for, write_config

from edged.config import config_from_dict
from edged.daemon import Daemon
from edged.model.session import LoadedModel
from edged.ops.logs import RateLimit

UNIT = REPO / "systemd" / "edged.service"


# -- the unit ----------------------------------------------------------------------------------------------


def unit_for_test(tmp_path: Path, extra: str = "") -> Path:
    """The shipped unit with ExecStart pointing at this checkout's edged (verify checks it exists)."""
    edged = str(Path(sys.executable).parent / "edged")
    text = UNIT.read_text(encoding="utf-8").replace("/opt/edged/venv/bin/edged", edged)
    path = tmp_path / "edged.service"
    path.write_text(text + extra, encoding="utf-8")
    return path


def analyze(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("systemd-analyze")
    if exe is None:
        pytest.fail("systemd-analyze is missing: install the systemd package (scripts/setup dev does)")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=60, check=False)


def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    res = analyze("verify", str(unit_for_test(tmp_path)))
    assert res.returncode == 0, res.stderr
    assert "edged.service" not in res.stderr  # no complaint about our unit


def test_unit_with_the_jetson_drop_in_verifies(tmp_path: Path) -> None:
    drop_in = (REPO / "systemd" / "edged.service.d" / "jetson-gpu.conf").read_text(encoding="utf-8")
    res = analyze("verify", str(unit_for_test(tmp_path, "\n" + drop_in)))
    assert res.returncode == 0, res.stderr


def exposure(unit: Path) -> tuple[float, str]:
    res = analyze("security", "--offline=true", "--no-pager", str(unit))
    match = re.search(r"Overall exposure level for edged\.service: (\d+\.\d+) (\w+)", res.stdout)
    assert match, res.stdout[-2000:] + res.stderr
    return float(match.group(1)), match.group(2)


def test_the_unit_as_shipped_gets_the_security_rating_the_readme_states(tmp_path: Path) -> None:
    """The unit exactly as shipped (its ExecStart need not exist for the rating), and with the Jetson drop-in."""
    (tmp_path / "plain").mkdir()
    plain = shutil.copy(UNIT, tmp_path / "plain" / "edged.service")
    (tmp_path / "jetson").mkdir()
    jetson = tmp_path / "jetson" / "edged.service"
    drop_in = (REPO / "systemd" / "edged.service.d" / "jetson-gpu.conf").read_text(encoding="utf-8")
    jetson.write_text(UNIT.read_text(encoding="utf-8") + "\n" + drop_in, encoding="utf-8")
    (level, verdict), (gpu_level, gpu_verdict) = exposure(Path(plain)), exposure(jetson)
    assert (verdict, gpu_verdict) == ("OK", "OK")
    assert max(level, gpu_level) <= 2.0
    page = " ".join((REPO / "docs" / "getting-started.md").read_text(encoding="utf-8").split())
    assert f'rates the unit as shipped {level} "OK", {gpu_level} with the Jetson GPU drop-in' in page


def test_unit_has_the_settings_operators_rely_on() -> None:
    text = UNIT.read_text(encoding="utf-8")
    for line in ("Type=notify", "WatchdogSec=", "Restart=on-failure", "StartLimitBurst=", "StateDirectory=edged",
                 "RuntimeDirectory=edged", "ConfigurationDirectory=edged", "NoNewPrivileges=yes",
                 "ProtectSystem=strict", "CapabilityBoundingSet=\n", "SystemCallFilter=@system-service",
                 "MemoryMax=", "DeviceAllow=char-video4linux rw", "SupplementaryGroups=video",
                 "ExecReload=/bin/kill -HUP $MAINPID"):  # fmt: skip
        assert line in text, line


# -- notify protocol and watchdog ------------------------------------------------------------------------


class NotifySocket:
    """Stands in for systemd's NOTIFY_SOCKET: collects the datagrams the daemon sends."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.messages: list[str] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._read, name="test-notify", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except TimeoutError:  # noqa: PERF203  (a poll loop, not a hot path)
                continue

    def count(self, prefix: str) -> int:
        return sum(m.startswith(prefix) for m in list(self.messages))

    def close(self) -> None:
        self._stop.set()
        self.thread.join(2)
        self.sock.close()


@pytest.fixture
def notify_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    path = tmp_path / "notify"
    ns = NotifySocket(path)
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    monkeypatch.setenv("WATCHDOG_USEC", "200000")  # WatchdogSec=0.2s: a ping every 0.1 s
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    yield ns
    ns.close()


def live_daemon(tmp_path: Path, model: Path, **top: Any) -> Daemon:
    video = make_video(tmp_path / "v.mp4", 30)
    cfg = base_config(tmp_path, model, str(video), fps=50, loop=True, stop_at_end=False)
    cfg.update(top)
    return Daemon(config_from_dict(cfg))


@pytest.mark.integration
def test_notify_order_and_a_hung_model_run_silences_the_watchdog(
    tmp_path: Path, tiny_model: Path, notify_socket: NotifySocket, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon = live_daemon(tmp_path, tiny_model, watchdog_stall_s=1.0)
    daemon.start()
    waiter = threading.Thread(target=daemon.wait, name="test-wait")
    waiter.start()
    wait_for(lambda: notify_socket.count("WATCHDOG=1") >= 3, 10, "watchdog pings while healthy")
    first = [m for m in notify_socket.messages if not m.startswith("STATUS=")]
    assert first[0] == "READY=1"  # after the model was loaded and warmed up, before any ping
    # now a model run hangs (stands in for a wedged GPU call): the pings must stop
    release = threading.Event()
    real_run = LoadedModel.run

    def hang(self: LoadedModel, tensor: Any) -> Any:
        release.wait(30)
        return real_run(self, tensor)

    monkeypatch.setattr(LoadedModel, "run", hang)
    # the condition, not a fixed sleep: the daemon says it stopped pinging (after watchdog_stall_s)
    wait_for(lambda: daemon.pipelines[0].stats.stalled(daemon.config.watchdog_stall_s), 30, "the stall seen")
    wait_for(lambda: daemon.watchdog_stopped, 30, "the daemon stopping the pings")
    before = notify_socket.count("WATCHDOG=1")
    time.sleep(1.0)  # ten ping intervals
    assert notify_socket.count("WATCHDOG=1") == before  # silence: systemd would restart us
    assert daemon.snapshot()["pipelines"][0]["frames"] > 0
    release.set()
    daemon.request_stop()
    waiter.join(10)
    daemon.stop()
    assert notify_socket.messages[-1] == "STOPPING=1"


# -- reload and model swap ---------------------------------------------------------------------------------


def results(state_dir: Path) -> list[dict[str, Any]]:
    import json

    with sqlite3.connect(state_dir / "spool.db") as conn:
        return [json.loads(p) for (p,) in conn.execute("SELECT payload FROM results ORDER BY id")]


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
    code, err = start_daemon(write_config(tmp_path / "edged.yaml", cfg)).wait()
    assert code == 1
    assert "but model.sha256 pins 0000000000000000" in err


# -- logs --------------------------------------------------------------------------------------------------


@pytest.mark.integration
def test_a_repeating_log_line_is_rate_limited_with_a_count(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("edged.test.ratelimit")
    limit = RateLimit(burst=2, period=0.2)
    logger.addFilter(limit)
    try:
        with caplog.at_level(logging.WARNING, logger="edged.test.ratelimit"):
            for _ in range(10):
                logger.warning("camera %s failed", "/dev/video0")
            time.sleep(0.25)
            logger.warning("camera %s failed", "/dev/video0")
    finally:
        logger.removeFilter(limit)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[:2] == ["camera /dev/video0 failed"] * 2
    assert lines[2] == "camera /dev/video0 failed (8 similar message(s) suppressed)"
    assert len(lines) == 3


def test_status_socket_ignores_malformed_requests(tmp_path: Path) -> None:
    from edged.ops.status import StatusServer, query

    server = StatusServer(tmp_path / "s.sock", lambda: {"state": "running"})
    server.start()
    try:
        for junk in (b"\x00\xff" * 1000, b"GET / HTTP/1.1\r\n\r\n", b""):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(str(tmp_path / "s.sock"))
                if junk:
                    s.sendall(junk)
                s.shutdown(socket.SHUT_WR)
                assert s.recv(65536).startswith(b'{"state":"running"}')
        assert query(tmp_path / "s.sock") == {"state": "running"}
    finally:
        server.stop()


@pytest.mark.integration
def test_watch_refreshes_until_interrupted(tmp_path: Path) -> None:
    from edged.ops.status import StatusServer

    calls = {"n": 0}

    def snapshot() -> dict[str, Any]:
        calls["n"] += 1
        return {"state": "running", "pipelines": [], "uptime_s": 1}

    server = StatusServer(tmp_path / "s.sock", snapshot)
    server.start()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "edged", "status", "--socket", str(tmp_path / "s.sock"), "--watch",
             "--interval", "0.1"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        # SIGINT only once it is refreshing (imports and the first render take a while under load)
        wait_for(lambda: calls["n"] >= 3, 30, "three refreshes")
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=30)  # a loaded machine: once it took over 10 s to end
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"edged status --watch did not end after SIGINT; stderr: {err[-2000:]}")
    finally:
        server.stop()
    assert proc.returncode == 0, err
    assert "edged running" in out


def test_the_journal_is_used_only_when_stderr_is_the_journal(monkeypatch: pytest.MonkeyPatch) -> None:
    from edged.ops.logs import journal_handler

    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    assert journal_handler() is None  # plain stderr: journald (if any) adds time and unit itself
    monkeypatch.setenv("JOURNAL_STREAM", "1:1")  # not our stderr's device and inode
    assert journal_handler() is None


def test_status_says_whether_the_model_is_int8(tmp_path: Path, tiny_model: Path) -> None:
    from edged.model.session import is_quantized

    assert is_quantized(REPO / "edged" / "assets" / "digits.int8.onnx")
    assert not is_quantized(REPO / "edged" / "assets" / "digits.fp32.onnx")
    assert not is_quantized(tiny_model)
