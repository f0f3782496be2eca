"""Power cuts through a filesystem that forgets every write not fsync'd (tests/powercut.py), default config.

Each test cuts power at a moment that matters (buffering offline, draining, a WAL checkpoint, the first
start, the seq lease write, a rollout's model swap, a remote config write) and checks the aftermath:
every result the spool had committed (what status calls stored) is delivered after the restart, no seq is
used twice, every missing seq lies in a gap the daemon declared (status and the gaps topic), counters
carry over, and the next start works. Skipped with the reason where FUSE is unavailable; CI has it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import (
    Broker,
    DaemonProc,
    StartDaemon,
    Subscribe,
    base_config,
    make_tiny_model,
    make_video,
    wait_for,
    write_config,
)
from powercut import CONTROL, PowerCutFS, mounted, unavailable

from edged.config import load_config
from edged.control.modelfetch import fetch_url
from edged.control.remoteconfig import apply_remote_config
from edged.core.durable import fsync_dir

pytestmark = [
    pytest.mark.skipif(bool(unavailable()), reason=f"no power-cut filesystem here: {unavailable()}"),
    pytest.mark.timeout(300),  # a daemon started twice or three times, on a disk served by Python
]


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[PowerCutFS]:
    with mounted(tmp_path / "disk") as fs:
        yield fs


@dataclass
class Device:
    """A daemon whose state_dir is on the power-cut disk; the status socket lives off it (a tmpfs)."""

    fs: PowerCutFS
    broker: Broker
    config: Path
    device_id: str
    state: Path
    start_daemon: StartDaemon
    daemon: DaemonProc | None = None

    def start(self) -> DaemonProc:
        self.daemon = self.start_daemon(self.config)
        self.daemon.socket = Path(yaml.safe_load(self.config.read_text())["status"]["socket"])
        self.fs.freeze_on_cut(self.daemon.proc.pid)
        daemon = self.daemon
        wait_for(lambda: (daemon.status() or {}).get("state") not in (None, "starting"), 60, "the daemon running")
        return daemon

    def status(self) -> dict[str, Any]:
        assert self.daemon is not None
        return wait_for(self.daemon.status, 30, "a status answer")  # type: ignore[no-any-return]

    def committed(self) -> set[int]:
        """The seqs the spool has committed now (the daemon is stopped): what status calls stored."""
        with sqlite3.connect(f"file:{self.state / 'spool.db'}?mode=ro", uri=True) as conn:
            return {
                int(r[0])
                for r in conn.execute("SELECT seq FROM results WHERE pipeline = 'cam0' AND topic LIKE '%/results'")
            }

    def power_cut(self) -> set[int]:
        """Stop the daemon where it is, note what is committed, cut the power, end the daemon, boot."""
        assert self.daemon is not None
        if not self.fs.dead:
            os.kill(self.daemon.proc.pid, signal.SIGSTOP)  # every program stops at once
        stored = self.committed() if not self.fs.dead else set()
        self.fs.cut()
        self.daemon.proc.kill()
        # a killed process exits once the (Python, here) disk server has answered its last calls: on a
        # loaded machine that takes a while, so the deadline is generous; the wait ends when it exits
        self.daemon.proc.communicate(timeout=180)
        self.fs.boot()
        return stored

    def drain_and_stop(self) -> dict[str, Any]:
        assert self.daemon is not None
        daemon = self.daemon

        def drained() -> bool:
            s = daemon.status() or {}
            return bool(s.get("mqtt", {}).get("connected")) and s["spool"]["depth"] == 0

        wait_for(drained, 60, "the backlog delivered")
        status = self.status()
        code, err = daemon.stop(signal.SIGTERM)
        assert code == 0, err
        return status


def make_device(tmp_path: Path, fs: PowerCutFS, broker: Broker, start_daemon: StartDaemon) -> Device:
    """30 frames/s of a looping video, the default spool config (power-safe), state on the cut disk."""
    model, video = make_tiny_model(tmp_path / "tiny.onnx"), make_video(tmp_path / "v.mp4", 30)
    cfg = base_config(tmp_path, model, str(video), broker=broker, fps=30, loop=True, stop_at_end=False)
    cfg["state_dir"] = str(fs.mount / "state")
    cfg["status"] = {"socket": str(tmp_path / "status.sock")}
    del cfg["spool"]  # the defaults are what is tested
    config = write_config(tmp_path / "edged.yaml", cfg)
    return Device(fs, broker, config, cfg["device_id"], fs.mount / "state", start_daemon)


@pytest.fixture
def device(tmp_path: Path, disk: PowerCutFS, own_broker: Broker, start_daemon: StartDaemon) -> Device:
    return make_device(tmp_path, disk, own_broker, start_daemon)


def check_aftermath(sub: Any, stored: set[int], status: dict[str, Any]) -> None:
    """Everything stored arrived; no seq twice with two contents; every missing seq is in a declared gap,
    announced on the gaps topic and shown in status."""
    by_seq: dict[int, set[str]] = {}
    for m in sub.results():
        by_seq.setdefault(m["seq"], set()).add(json.dumps(m, sort_keys=True))
    assert all(len(v) == 1 for v in by_seq.values()), "a seq was used twice"
    lost = sorted(stored - set(by_seq))
    assert not lost, f"{len(lost)} results the spool had stored never arrived, e.g. {lost[:10]}"
    announced = [json.loads(p)["gap"] for t, p, _ in sub.messages if t.endswith("/cam0/gaps")]
    declared = {s for g in announced for s in range(g["first"], g["last"] + 1)}
    shown = {
        s for g in status["spool"]["seq_gaps"] if g["pipeline"] == "cam0" for s in range(g["first"], g["last"] + 1)
    }
    assert declared == shown, "the gaps announced and the gaps in status differ"
    top = max(by_seq)
    missing = set(range(1, top + 1)) - set(by_seq)
    assert missing <= declared, f"seqs missing outside any declared gap: {sorted(missing - declared)[:10]}"
    assert status["spool"]["uncertain"] == len(declared)
    assert "unclean_stop" not in status["spool"]["dropped_by_reason"]  # uncertain, not known lost


def listen(broker: Broker, subscribe: Subscribe, dev: Device) -> Any:
    """A subscriber whose session the broker keeps while either of them is away (both persistent)."""
    broker.persistent = True
    broker.start()
    return subscribe(broker, f"edged/{dev.device_id}/#", persistent=True)


@pytest.mark.integration
def test_a_cut_while_buffering_offline_loses_nothing_stored(device: Device, subscribe: Subscribe) -> None:
    dev, _disk, own_broker = device, device.fs, device.broker
    sub = listen(own_broker, subscribe, dev)
    own_broker.stop()
    dev.start()  # the broker is down: everything is buffered
    wait_for(lambda: dev.status()["spool"]["depth"] - dev.status()["spool"]["uncommitted"] >= 40, 60, "results stored")
    said = dev.status()["spool"]
    stored = dev.power_cut()
    assert len(stored) >= said["depth"] - said["uncommitted"]  # what status called stored was on disk
    own_broker.start()
    dev.start()
    after = dev.status()
    assert after["state"] == "degraded"
    assert any("unclean stop" in r for r in after["reasons"]), after["reasons"]
    assert dev.daemon is not None
    view = subprocess.run(
        [sys.executable, "-m", "edged", "status", "--socket", str(dev.daemon.socket)],
        capture_output=True, text=True, check=False, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert view.returncode == 1  # degraded, and the table says what is uncertain
    assert f"uncertain {after['spool']['uncertain']}" in view.stdout
    check_aftermath(sub, stored, dev.drain_and_stop())


@pytest.mark.integration
def test_a_cut_while_draining_loses_nothing_stored_and_the_next_cut_too(device: Device, subscribe: Subscribe) -> None:
    dev, _disk, own_broker = device, device.fs, device.broker
    sub = listen(own_broker, subscribe, dev)
    own_broker.stop()
    dev.start()
    wait_for(lambda: dev.status()["spool"]["depth"] >= 60, 60, "a backlog")
    own_broker.start()
    wait_for(lambda: len(sub.results()) >= 10, 60, "the drain under way")
    stored = dev.power_cut()
    dev.start()
    wait_for(lambda: len(sub.results()) >= len(stored) // 2, 60, "the drain under way again")
    stored |= dev.power_cut()  # a second cut while the first one's gap may not be announced yet
    dev.start()
    status = dev.drain_and_stop()
    check_aftermath(sub, stored, status)
    # one gap per cut, or one covering both when the second came before the first was announced
    assert 1 <= len(status["spool"]["seq_gaps"]) <= 2


@pytest.mark.integration
def test_a_cut_in_the_middle_of_a_wal_checkpoint(device: Device, subscribe: Subscribe) -> None:
    dev, disk, own_broker = device, device.fs, device.broker
    sub = listen(own_broker, subscribe, dev)
    own_broker.stop()
    # offline flat out: the WAL passes its checkpoint size (500 pages) within seconds
    cfg = yaml.safe_load(dev.config.read_text())
    cfg["pipelines"][0]["source"]["fps"] = 0
    write_config(dev.config, cfg)
    dev.start()
    # once the database exists, only a checkpoint writes into its main file (commits go to the WAL): cut at
    # the checkpoint's third page, torn half-way
    disk.arm("write", "spool.db", 3, tear=True)
    wait_for(lambda: disk.dead, 120, "a checkpoint")
    dev.power_cut()  # the daemon was frozen at the cut
    stored = dev.committed()  # what survived; any committed row lost would be a missing seq outside a gap
    assert len(stored) > 500, "the checkpoint came before much was committed"
    cfg["pipelines"][0]["source"]["fps"] = 30  # back to the camera's pace: flat out, the spool never empties
    write_config(dev.config, cfg)
    own_broker.start()
    dev.start()
    status = dev.drain_and_stop()
    assert status["spool"]["recovered_from"] is None  # the database was not damaged: nothing moved aside
    check_aftermath(sub, stored, status)


@pytest.mark.integration
@pytest.mark.parametrize("call", ["write", "fsync"])
def test_a_cut_right_after_the_first_start_created_the_database(
    device: Device, subscribe: Subscribe, start_daemon: StartDaemon, call: str
) -> None:
    dev, disk, own_broker = device, device.fs, device.broker
    sub = listen(own_broker, subscribe, dev)
    disk.arm(call, "spool.db*", 4)  # a few calls into creating the database and its WAL
    dev.daemon = start_daemon(dev.config)
    disk.freeze_on_cut(dev.daemon.proc.pid)
    wait_for(lambda: disk.dead, 60, "the cut during the first start")
    dev.power_cut()
    dev.start()  # starts on what the cut left: no damage, no crash
    wait_for(lambda: len(sub.results()) >= 10, 60, "results after the restart")
    status = dev.drain_and_stop()
    assert status["spool"]["recovered_from"] is None
    check_aftermath(sub, set(), status)


@pytest.mark.integration
def test_a_cut_during_the_seq_lease_write_never_reuses_a_seq(device: Device, subscribe: Subscribe) -> None:
    dev, disk, own_broker = device, device.fs, device.broker
    sub = listen(own_broker, subscribe, dev)
    for n, tear in ((3, True), (4, False)):  # the third and fourth lease writes: results already published
        disk.arm("write", "*seqfloor*", n, tear=tear)
        dev.start()
        wait_for(lambda: disk.dead, 60, "the cut during a lease write")
        dev.power_cut()
    dev.start()
    wait_for(lambda: len(sub.results()) >= 5, 60, "results after the restarts")
    check_aftermath(sub, set(), dev.drain_and_stop())


@pytest.mark.integration
@pytest.mark.timeout(900)  # twenty daemon starts; about a minute unloaded, several on a loaded 2-core machine
def test_twenty_cuts_at_random_moments_lose_nothing_stored(device: Device, subscribe: Subscribe) -> None:
    """Offline, draining, flat out (WAL checkpoints) and right at the start, mixed; one gap per cut at most."""
    dev, disk, own_broker = device, device.fs, device.broker
    sub = listen(own_broker, subscribe, dev)
    cfg = yaml.safe_load(dev.config.read_text())
    rng = random.Random(27)
    stored: set[int] = set()
    for i in range(20):
        moment = rng.choice(["offline", "draining", "flat_out", "starting"])
        if moment == "draining" and own_broker.proc is None:
            own_broker.start()
        elif moment != "draining":
            own_broker.stop()
        cfg["pipelines"][0]["source"]["fps"] = 0 if moment == "flat_out" else 30
        write_config(dev.config, cfg)
        daemon = dev.start()
        if moment != "starting":
            target = dev.status()["pipelines"][0]["frames"] + rng.randint(5, 90)

            def produced(d: DaemonProc = daemon, n: int = target) -> bool:
                return bool((d.status() or {}).get("pipelines", [{}])[0].get("frames", 0) >= n)

            wait_for(produced, 60, f"frames before cut {i} ({moment})")
        stored |= dev.power_cut()
    if own_broker.proc is None:
        own_broker.start()
    dev.start()
    status = dev.drain_and_stop()
    check_aftermath(sub, stored, status)
    assert disk.counters()["cuts"] == 20
    assert len(status["spool"]["seq_gaps"]) <= 20


# -- files written by commands: a cut at every durable step -------------------------------------------------


def sync_tree(root: Path) -> None:
    """Make everything under root durable (the state before the operation under test)."""
    for folder, _, files in os.walk(root):
        for name in files:
            if name == CONTROL:
                continue
            fd = os.open(Path(folder) / name, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        fsync_dir(Path(folder))


def cut_at_every_step(disk: PowerCutFS, prepare: Any, operation: Any, check: Any) -> int:
    """Run `operation` once per write and per fsync it makes, cutting power at that call; after each cut
    `check(done)` sees what a restart would (`done`: the operation had returned, so its change must be
    there). Returns how many cuts were tried."""
    tried = 0
    for call in ("write", "fsync"):
        for n in range(1, 200):
            prepare()
            sync_tree(disk.mount)
            disk.arm(call, "*", n, tear=call == "write")
            with contextlib.suppress(Exception):  # the cut fails the call half-way: that is the test
                operation()
            if not disk.dead:  # the operation made fewer calls than n: every step was cut once; cut after it
                disk.cut()
                disk.boot()
                check(True)
                break
            disk.boot()
            tried += 1
            check(False)
    return tried


def test_a_remote_config_write_cut_at_every_step_leaves_the_old_config_or_the_new(
    tmp_path: Path, disk: PowerCutFS
) -> None:
    model = make_tiny_model(disk.mount / "tiny.onnx")
    path = disk.mount / "edged.yaml"
    old = base_config(disk.mount, model, "/dev/video9")
    old["state_dir"] = str(tmp_path / "state")

    def prepare() -> None:
        write_config(path, old)
        for stale in disk.mount.glob(".edged.yaml*"):
            stale.unlink()

    def check(done: bool) -> None:
        cfg = load_config(path)  # whatever the cut left, the daemon starts on a valid config
        assert cfg.log_level in (("debug",) if done else ("info", "debug")), "an applied config was lost"
        prev = path.with_name("edged.yaml.prev")
        if prev.exists():
            load_config(prev)

    change = {"log_level": "debug"}
    tried = cut_at_every_step(
        disk, prepare, lambda: apply_remote_config(path, change, replace=False, check=load_config), check
    )
    assert tried >= 6  # writes and fsyncs of .prev and of the new file, the folder syncs


def test_a_rollout_model_swap_cut_at_every_step_leaves_a_model_that_loads(tmp_path: Path, disk: PowerCutFS) -> None:
    """The rollout's steps: the model fetched into state_dir/models, then the config pointed at it."""
    old_model = make_tiny_model(disk.mount / "old.onnx")
    new_model = make_tiny_model(tmp_path / "new.onnx", gain=11.0)
    digest = hashlib.sha256(new_model.read_bytes()).hexdigest()
    path = disk.mount / "edged.yaml"
    old = base_config(disk.mount, old_model, "/dev/video9")
    old["state_dir"] = str(disk.mount / "state")
    models = disk.mount / "state" / "models"

    def prepare() -> None:
        write_config(path, old)
        if models.exists():
            for f in models.iterdir():
                f.unlink()

    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(SimpleHTTPRequestHandler, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, name="test-http", daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/new.onnx"

    def swap() -> None:
        fetched = fetch_url(url, models, digest, max_bytes=10**7, timeout=10)
        apply_remote_config(
            path, {"pipelines": [{"name": "cam0", "model": {"path": str(fetched)}}]}, replace=False, check=load_config
        )

    def check(done: bool) -> None:
        cfg = load_config(path)
        running = cfg.pipelines[0].model.path.read_bytes()
        assert running in (old_model.read_bytes(), new_model.read_bytes()), "a torn model is named by the config"
        assert not done or running == new_model.read_bytes(), "a swapped-in model was lost"

    try:
        assert cut_at_every_step(disk, prepare, swap, check) >= 6
    finally:
        server.shutdown()
        server.server_close()
