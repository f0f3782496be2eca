"""Status socket, `edged status` rendering, sd_notify, and an in-process daemon that stops every thread."""

from __future__ import annotations

import os
import socket
import stat
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest
from conftest import StartDaemon, base_config, free_port, make_video, wait_for, write_config

from edged.config import config_from_dict
from edged.core.errors import StatusError
from edged.daemon import Daemon
from edged.ops.reasons import explain
from edged.ops.status import StatusServer, exit_code, query
from edged.ops.statusview import duration, render
from edged.uplink import mqttstats as stats_module
from edged.uplink.mqttstats import MqttStats


def test_server_answers_with_a_snapshot_and_is_not_world_writable(tmp_path: Path) -> None:
    server = StatusServer(tmp_path / "s.sock", lambda: {"state": "running", "pipelines": []})
    server.start()
    try:
        assert query(tmp_path / "s.sock") == {"state": "running", "pipelines": []}
        assert stat.S_IMODE((tmp_path / "s.sock").stat().st_mode) == 0o660
    finally:
        server.stop()
    assert not server.is_alive()
    assert not (tmp_path / "s.sock").exists()


def test_a_stale_socket_is_replaced_and_a_live_one_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # the file stays, nobody listens: a daemon that died
    server = StatusServer(path, lambda: {"state": "running"})
    server.start()
    try:
        with pytest.raises(StatusError, match="another edged is already running"):
            StatusServer(path, dict)
    finally:
        server.stop()


@pytest.mark.integration
def test_a_client_that_keeps_sending_cannot_hold_the_status_thread(tmp_path: Path) -> None:
    """A client that trickles bytes and never closes is cut off after the per-client deadline; the next
    client is answered while the first one is still trying (before, the server read it for ever)."""
    path = tmp_path / "s.sock"
    server = StatusServer(path, lambda: {"state": "running"})
    server.start()
    done = threading.Event()
    cut_off = threading.Event()

    def trickle() -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(path))
            try:
                while not done.wait(0.05):
                    sock.sendall(b"x")
            except OSError:  # the server closed on us
                cut_off.set()

    slow = threading.Thread(target=trickle, name="test-trickle", daemon=True)
    slow.start()
    try:
        assert query(path, timeout=30) == {"state": "running"}
        wait_for(cut_off.is_set, 30, "the trickling client cut off")
    finally:
        done.set()
        slow.join(5)
        server.stop()
    assert not server.is_alive()


def test_a_snapshot_that_raises_does_not_end_the_status_thread(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    calls = {"n": 0}

    def snapshot() -> dict[str, Any]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("a bug in a snapshot")
        return {"state": "running"}

    server = StatusServer(path, snapshot)
    server.start()
    try:
        with pytest.raises(StatusError):
            query(path, timeout=10)  # that one gets no answer
        assert server.is_alive()
        assert query(path, timeout=10) == {"state": "running"}  # the next one does
    finally:
        server.stop()


def test_client_explains_permission_errors(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    server = StatusServer(path, lambda: {"state": "running"}, mode=0o600)
    server.start()
    read_end, write_end = os.pipe()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads: the child only queries
            pid = os.fork()
        if pid == 0:  # child: become an unprivileged user (root ignores file modes), then ask
            code = 0
            try:
                if os.geteuid() == 0:
                    os.setgid(65534)
                    os.setuid(65534)
                else:
                    path.chmod(0)
                query(path)
            except StatusError as exc:
                os.write(write_end, str(exc).encode())
            except BaseException:  # noqa: BLE001
                code = 1
            os._exit(code)
        os.close(write_end)
        _, status = os.waitpid(pid, 0)
        message = os.read(read_end, 4096).decode()
    finally:
        os.close(read_end)
        server.stop()
    assert os.waitstatus_to_exitcode(status) == 0
    assert message.startswith(f"permission denied on {path}")
    assert "usermod -aG edged" in message


def test_exit_codes_and_table_render(capsys: pytest.CaptureFixture[str]) -> None:
    snap: dict[str, Any] = {
        "state": "degraded",
        "device_id": "pi",
        "uptime_s": 12,
        "pipelines": [
            {
                "name": "cam0",
                "state": "reconnecting",
                "fps": 0,
                "frames": 3,
                "dropped_frames": 1,
                "reconnects": 4,
                "provider": "CPUExecutionProvider",
                "latency_ms": {"p50": 1, "p95": 2, "p99": 3},
                "source": "/dev/video0",
                "model": {"name": "digits", "sha256": "ab" * 32},
                "error": "/dev/video0: cannot open",
                "motion_skipped": 40,
                "tracks": 2,
                "events": 9,
                "events_per_min": 3,
            }
        ],
        "spool": {
            "depth": 7,
            "bytes": 2048,
            "oldest_age_s": 30,
            "dropped": 3,
            "dropped_by_reason": {"expired": 3},
            "dead_letters": 1,
            "max_bytes": 2**28,
            "disk_free_bytes": 2**30,
        },
        "mqtt": {"enabled": True, "connected": False, "broker": "b:1883", "published": 0, "last_error": "refused"},
    }
    assert exit_code(snap) == 1
    assert exit_code({**snap, "state": "running"}) == 0
    render(snap, color=False)
    out = capsys.readouterr().out
    assert "degraded" in out
    assert "cam0" in out
    assert "reconnecting" in out
    assert "depth 7" in out
    assert "dropped expired 3" in out
    assert "dead letters 1" in out
    assert "disconnected b:1883" in out
    assert "no motion 40 (frames not run)" in out
    assert "tracks 2  events 9 (3/min)" in out
    assert "\x1b[" not in out  # no colour codes off a TTY
    assert "up 12 s" in out


def test_durations_read_as_a_person_says_them() -> None:
    spans = [0, 42.4, 245, 11_520, 187_200]
    assert [duration(s) for s in spans] == ["0 s", "42 s", "4 min 5 s", "3 h 12 min", "2 d 4 h"]


def test_every_line_fits_80_columns_with_long_names_errors_and_notes(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    long_error = "cannot connect to broker.example.internal.corp:8883: [SSL: CERTIFICATE_VERIFY_FAILED] " * 2
    snap: dict[str, Any] = {
        "state": "degraded",
        "version": "0.1.0",
        "device_id": "pi-warehouse-north-loading-dock-07",
        "uptime_s": 86400 * 30,
        "reasons": [f"pipeline front-door-camera-long-name failed: {long_error}", f"broker down: {long_error}"],
        "pipelines": [
            {
                "name": "front-door-camera-long-name",
                "state": "reconnecting",
                "fps": 29.97,
                "frames": 123456789,
                "dropped_frames": 1234567,
                "reconnects": 12345,
                "provider": "TensorrtExecutionProvider",
                "latency_ms": {
                    "p50": 123.4,
                    "p95": 456.7,
                    "p99": 1234.5,
                    "stages": {k: {"p50": 100.1, "p95": 200.2, "p99": 300.3} for k in ("pre", "infer", "post")},
                    "e2e": {"p50": 1000.1, "p95": 2000.2, "p99": 3000.3},
                },
                "source": "rtsp://admin@camera-front-door.example.internal:554/Streaming/Channels/101",
                "model": {"name": "yolov8n-warehouse-pallets-2026-11", "sha256": "ab" * 32, "int8": True},
                "error": long_error,
                "malformed": 12,
                "suppressed": 3456,
                "motion_skipped": 123456,
                "tracks": 12,
                "events": 3456,
                "events_per_min": 42,
            }
        ],
        "spool": {
            "depth": 1234567,
            "bytes": 2**30,
            "oldest_age_s": 86400 * 3,
            "dropped_by_reason": {"expired": 1234, "full": 56789, "disk": 3},
            "dead_letters": 12345,
            "max_bytes": 2**33,
            "disk_free_bytes": 2**40,
            "uncertain": 7,
            "space_warning": "the disk has less free space than the spool's max_bytes: " + long_error,
        },
        "mqtt": {
            "enabled": True,
            "connected": False,
            "broker": "broker.example.internal.corp:8883",
            "published": 123456789,
            "published_per_s": 1234.5,
            "last_error": long_error,
        },
        "reload": {"result": "rejected", "last": 1.0, "notes": [f"edged.yaml:12 model.path: {long_error}"]},
        "control": {"accepted": 123, "refused": {"bad signature": 4, "replayed": 5}, "rollouts": {"applied": 3}},
    }
    monkeypatch.setenv("COLUMNS", "80")
    render(snap, color=False)
    lines = capsys.readouterr().out.splitlines()
    too_wide = [line for line in lines if len(line) > 80]
    assert not too_wide, "\n".join(too_wide)
    assert any("p50/p95/p99" in line for line in lines)
    assert any(line.startswith("front-door-") for line in lines)  # the table row, its name cut to fit
    render(snap, color=False, wide=True)
    assert long_error.strip() in capsys.readouterr().out  # --wide: whole


@pytest.mark.integration
def test_sd_notify_ready_only_after_warmup_and_every_thread_stops(tmp_path: Path, tiny_model: Path) -> None:
    # a datagram socket stands in for systemd's NOTIFY_SOCKET
    notify_path = tmp_path / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(notify_path))
    sock.settimeout(5)
    video = make_video(tmp_path / "v.mp4", 10)
    cfg = config_from_dict(base_config(tmp_path, tiny_model, str(video), fps=20, loop=True, stop_at_end=False))
    os.environ["NOTIFY_SOCKET"] = str(notify_path)
    try:
        daemon = Daemon(cfg)
        daemon.start()
        assert sock.recv(4096) == b"READY=1"
        assert daemon.pipelines[0].stats.provider == "CPUExecutionProvider"  # the model was loaded first
        wait_for(lambda: daemon.pipelines[0].stats.frames >= 3, 10, "results")
        names = {t.name for t in threading.enumerate() if t.name.startswith("edged-")}
        assert {"edged-source-cam0", "edged-infer-cam0", "edged-spool-writer", "edged-status"} <= names
        daemon.stop()
        assert sock.recv(4096) == b"STOPPING=1"
    finally:
        del os.environ["NOTIFY_SOCKET"]
        sock.close()
    assert not [t.name for t in threading.enumerate() if t.name.startswith("edged-")]


class _Clock:
    """A clock the test moves (the rate is about seconds; the test should not take them)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return 1.7e9 + self.now


def test_the_published_rate_reflects_the_last_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    monkeypatch.setattr(stats_module, "time", clock)
    stats = MqttStats(connected=True, connected_mono=clock.now)
    for _ in range(30):  # 6 s at 5 results/s, just after connecting
        clock.now += 0.2
        stats.count_published(1)
    assert stats.snapshot()["published_per_s"] == 5.0  # not 30 / 10 s = 3.0
    for _ in range(100 * 20):  # 20 s at 100/s: over the old 256-entry cap, and over the whole window
        clock.now += 0.01
        stats.count_published(1)
    assert stats.snapshot()["published_per_s"] == pytest.approx(100.0, abs=0.2)
    clock.now += 4.0  # idle for 4 s: 6 s of the 10 s window still hold results
    assert stats.snapshot()["published_per_s"] == pytest.approx(60.0, abs=0.2)


@pytest.mark.integration
def test_results_dropped_for_a_full_spool_make_the_status_degraded_and_say_so(
    tmp_path: Path, tiny_model: Path, start_daemon: StartDaemon
) -> None:
    """Health never lies: with the broker away and a spool that holds a few results, the oldest give way;
    status says so in a reasons line the troubleshooting page explains, and asking twice changes nothing."""
    cfg = base_config(tmp_path, tiny_model, str(make_video(tmp_path / "v.mp4", 40)), broker=None, fps=20, loop=True,
                      stop_at_end=False)  # fmt: skip
    cfg["mqtt"] |= {"enabled": True, "port": free_port()}  # nothing listens: results wait, then give way
    cfg["spool"] |= {"max_bytes": "4KiB", "min_free_bytes": 0, "ballast_bytes": 0}
    daemon = start_daemon(write_config(tmp_path / "edged.yaml", cfg))
    snap = wait_for(lambda: (s := daemon.status()) and s["spool"]["dropped"] > 0 and s, 60, "results dropped")
    snap = wait_for(lambda: (s := daemon.status()) and any("dropped in the last" in r for r in s["reasons"]) and s,
                    10, "the drop reason")  # fmt: skip
    assert snap["state"] == "degraded"
    assert snap["spool"]["dropped_recent"] > 0
    line = next(r for r in snap["reasons"] if "dropped in the last" in r)
    assert explain(line) is not None
