"""Living on the device: systemd unit gates, the notify protocol and watchdog, stopping within one deadline, one
daemon per state_dir, logs, the status socket (reload and model swap: test_reload.py)."""

from __future__ import annotations

import logging
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, NotifySocket, base_config, make_video, wait_for, write_config
from inprocess import SilentCamera, finish, live_daemon, start

from edged.config import config_from_dict
from edged.daemon import Daemon
from edged.model.session import LoadedModel
from edged.ops.logs import RepeatFilter

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


@pytest.mark.integration
def test_notify_order_and_a_hung_model_run_silences_the_watchdog(
    tmp_path: Path, tiny_model: Path, notify_socket: NotifySocket, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon = live_daemon(tmp_path, tiny_model, watchdog_stall_s=1.0)
    daemon.start()
    waiter = threading.Thread(target=daemon.wait, name="test-wait")
    waiter.start()
    release = threading.Event()
    try:
        wait_for(lambda: notify_socket.count("WATCHDOG=1") >= 3, 30, "watchdog pings while healthy")
        first = [m for m in notify_socket.messages if not m.startswith("STATUS=")]
        assert first[0] == "READY=1"  # after the model was loaded and warmed up, before any ping
        # frames flow first (on a loaded machine the pings can come before the first frame is through)
        wait_for(lambda: daemon.report.snapshot()["pipelines"][0]["frames"] > 0, 30, "a frame through the model")
        # now a model run hangs (stands in for a wedged GPU call): the pings must stop
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
    finally:  # a failure must not leave the daemon's threads to the next test of this worker
        release.set()
        daemon.request_stop()
        waiter.join(10)
        daemon.stop()
    assert notify_socket.messages[-1] == "STOPPING=1"


# -- reload and model swap ---------------------------------------------------------------------------------


# -- logs --------------------------------------------------------------------------------------------------


@pytest.mark.integration
def test_a_repeating_log_line_is_rate_limited_with_a_count(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("edged.test.ratelimit")
    limit = RepeatFilter(burst=2, period=0.2)
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
    assert "edged stopped" not in err  # it never ran: no word of a stop, as if the running one had been stopped
    assert not (tmp_path / "other.sock").exists()
    # aftermath: the first one never noticed; once it stops, a new daemon takes the state_dir
    snap = first.status()
    assert snap is not None
    assert snap["state"] == "running", snap.get("reasons")
    seq_before = snap["pipelines"][0]["frames"]
    code, err = first.stop()
    assert code == 0, err
    # mqtt is off in this config: what stays in the spool is said, with why
    assert "edged stopped; " in err
    assert "result(s) in the spool (mqtt is off)" in err or "nothing left to send" in err
    third = start_daemon(write_config(tmp_path / "c.yaml", cfg))
    wait_for(lambda: (s := third.status()) and s["pipelines"][0]["frames"] >= 5, 30, "the next daemon's results")
    code, err = third.stop()
    assert code == 0, err
    assert seq_before > 0
