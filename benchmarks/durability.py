"""Durability benchmark (issue "Durable by default"): power cuts side by side with a Mosquitto bridge, and the
cost of the power-safe default on slow flash.

Every disk here is the power-cut filesystem of the test suite (`tests/powercut.py`, FUSE): it keeps what
was not fsync'd in memory and forgets it at a cut, the way database power-loss tests are done. Part 1 runs
on two of them: ext4-like (an fsync of any file also makes every rename so far durable, as ext4's journal
commit does) and strict POSIX (a rename is durable only once its folder is fsync'd).

1. Power cuts (`--cuts` per system, each after `--offline-s` seconds with the central broker down):
   E  `edged run` with the default config: the bundled digits int8 model on the bundled video at 30
      frames/s. Stored = what `edged status` calls stored just before the cut (spool depth minus
      uncommitted).
   M  the do-it-yourself alternative: a local Mosquitto with `persistence true` (default
      `autosave_interval`, 1800 s) bridged to the central broker (`topic edged/# out 1`,
      `cleansession false`), an application publishing the same kind of message at 30/s with QoS 1 to it.
      Stored = the messages the local broker acknowledged (PUBACK).
   M1 the same with `autosave_interval 1`.
   Each cut: the process is stopped at once (SIGSTOP), the power cut, the process killed, power back,
   the central broker started with a subscriber, the device restarted; then wait until nothing more
   arrives. Reported per system: stored and lost per cut, and bytes written to the disk per result
   while offline (the filesystem's own count of written bytes).
2. Slow flash (every fsync takes 20-50 ms on the `slow` disk, none on the `fast` one, otherwise the same;
   reads cached by the kernel as on a real disk, since nothing is cut here):
   latency from capture to subscriber (p50/p99) of one pipeline at 30/s, broker up; 8 pipelines flat out,
   results acknowledged per second; offline bytes written per result against the payload; and the backlog
   drain against a bare paho loop on the slow disk (`benchmarks/store_forward.py --drain` run there).
   Targets: latency and the 8-pipeline rate unchanged on slow flash; drain >= 0.8x bare paho; offline bytes
   per result <= 4x the payload.

A measurement, not a test: exit 0 whatever the figures are. Needs FUSE (/dev/fuse, fusermount3, mfusepy).

    python benchmarks/durability.py              # ~6 min
    python benchmarks/durability.py --cuts 1 --offline-s 5 --skip-slow --json
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import os
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
ASSETS = REPO / "edged" / "assets"
MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
FPS = 30


def note(text: str) -> None:
    print(f"# {text}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


class Mosquitto:
    """A Mosquitto process with a config of ours."""

    def __init__(self, work: Path, name: str, port: int, extra: str = "") -> None:
        self.port = port
        self.conf = work / f"{name}.conf"
        self.conf.write_text(
            f"listener {port} 127.0.0.1\nallow_anonymous true\nuser {getpass.getuser()}\n"
            f"max_queued_messages 1000000\nmax_inflight_messages 0\n{extra}",
            encoding="utf-8",
        )
        self.log = work / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen([MOSQUITTO, "-c", str(self.conf)], stdout=out, stderr=out)
        if not wait(self._answers, 10):
            raise RuntimeError(f"mosquitto did not start: {self.log.read_text()[-500:]}")

    def _answers(self) -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.2):
            return True
        return False

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None


class Collector:
    """A subscriber on the central broker: the distinct seqs (`seq` or `n`) and capture latencies it got."""

    def __init__(self, port: int, topic: str = "edged/#") -> None:
        import paho.mqtt.client as paho
        from paho.mqtt.enums import CallbackAPIVersion

        self.seqs: set[tuple[str, int]] = set()
        self.latency_ms: list[float] = []
        self.last = time.monotonic()
        self.lock = threading.Lock()
        ready = threading.Event()
        self.client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda *_a: ready.set()
        self.client.connect("127.0.0.1", port)
        self.client.subscribe(topic, qos=1)
        self.client.loop_start()
        ready.wait(10)

    def _on_message(self, _c: Any, _u: Any, msg: Any) -> None:
        if not msg.topic.endswith("/results"):
            return
        now = time.time()
        with contextlib.suppress(ValueError, KeyError, TypeError):
            body = json.loads(msg.payload)
            with self.lock:
                self.seqs.add((str(body.get("pipeline")), int(body["seq"])))
                self.latency_ms.append((now - float(body["ts"])) * 1e3)
                self.last = time.monotonic()

    def quiet_for(self, seconds: float) -> bool:
        with self.lock:
            return time.monotonic() - self.last > seconds

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1) if ordered else float("nan")


# -- edged ------------------------------------------------------------------------------------------------


def edged_config(work: Path, state: Path, port: int, *, pipelines: int = 1, fps: int = FPS) -> Path:
    import yaml

    cfg = {
        "device_id": f"dur-{state.name}",
        "state_dir": str(state),
        "status": {"socket": str(work / f"{state.name}.sock")},
        "mqtt": {
            "host": "127.0.0.1",
            "port": port,
            "reconnect_min_s": 0.2,
            "reconnect_max_s": 1,
            "reconnect_spread_s": 0,
        },
        "pipelines": [
            {
                "name": f"cam{i}",
                "source": {"type": "camera", "uri": str(ASSETS / "sample.mp4"), "fps": fps, "loop": True},
                "model": {"path": str(ASSETS / "digits.int8.onnx"), "providers": ["CPUExecutionProvider"]},
            }
            for i in range(pipelines)
        ],
    }
    path = work / f"{state.name}.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return path


class Edged:
    def __init__(self, work: Path, config: Path) -> None:
        import yaml

        self.config = config
        self.socket = Path(yaml.safe_load(config.read_text())["status"]["socket"])
        self.log = work / f"{config.stem}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "edged", "run", "--config", str(self.config)], stdout=out, stderr=out
            )
        if not wait(lambda: self.status().get("state") in ("running", "degraded"), 90):
            raise RuntimeError(f"edged did not start: {self.log.read_text()[-800:]}")

    def status(self) -> dict[str, Any]:
        from edged.core.errors import StatusError
        from edged.ops.status import query

        try:
            return query(self.socket, timeout=1.0)
        except (StatusError, OSError):
            return {}

    def frames(self) -> int:
        return sum(int(p.get("frames", 0)) for p in self.status().get("pipelines", []))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(60)
        self.proc = None

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(30)
        self.proc = None


def payload_mean(state: Path) -> float:
    with contextlib.closing(sqlite3.connect(f"file:{state / 'spool.db'}?mode=ro", uri=True)) as conn:
        row = conn.execute("SELECT AVG(LENGTH(payload)) FROM results").fetchone()
    return float(row[0] or 0.0)


def cut_edged(work: Path, disk: Any, offline_s: float, n: int) -> dict[str, Any]:
    central = Mosquitto(work, f"central-e{n}", free_port())
    state = disk.mount / f"edged{n}"
    device = Edged(work, edged_config(work, state, central.port))
    device.start()
    disk.freeze_on_cut(device.proc.pid if device.proc else 0)
    f0 = device.frames()
    disk.reset_counters()
    time.sleep(offline_s)  # the offline period: a fixed stretch of time is what is measured
    s = device.status()["spool"]
    stored = s["depth"] - s["uncommitted"]
    written, frames = disk.counters()["bytes_written"], device.frames() - f0
    payload = payload_mean(state)
    disk.cut()
    device.kill()
    disk.boot()
    central.start()
    sub = Collector(central.port)
    try:
        device.start()
        uncertain = device.status()["spool"]["uncertain"]
        want = set(range(1, stored + 1))  # offline and FIFO: what was stored is seqs 1..stored of this device

        def arrived() -> bool:
            with sub.lock:
                return want <= {seq for _, seq in sub.seqs}

        wait(lambda: arrived() or (device.status().get("spool", {}).get("depth", 1) == 0 and sub.quiet_for(5)), 120)
        with sub.lock:
            delivered = {seq for _, seq in sub.seqs}
    finally:
        device.stop()
        sub.close()
        central.stop()
    lost = len(set(range(1, stored + 1)) - delivered)
    return {"stored": stored, "lost": lost, "bytes_per_result": written / max(1, frames), "payload": payload,
            "uncertain": uncertain}  # fmt: skip


# -- the Mosquitto bridge ----------------------------------------------------------------------------------


class App:
    """The device's application: publishes a result-shaped message at 30/s, QoS 1, to the local broker."""

    def __init__(self, port: int) -> None:
        import paho.mqtt.client as paho
        from paho.mqtt.enums import CallbackAPIVersion

        self.acked: set[int] = set()
        self.mids: dict[int, int] = {}
        self.lock = threading.Lock()
        self.halt = threading.Event()
        self.client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id="app")
        self.client.on_publish = self._on_publish
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        self.thread = threading.Thread(target=self._run, name="bench-app", daemon=True)
        self.thread.start()

    def _on_publish(self, _c: Any, _u: Any, mid: int, _rc: Any, _p: Any) -> None:
        with self.lock:
            seq = self.mids.pop(mid, None)
            if seq is not None:
                self.acked.add(seq)

    def _run(self) -> None:
        seq, start = 0, time.monotonic()
        while not self.halt.is_set():
            seq += 1
            body = {"v": 1, "device": "bridge", "pipeline": "cam0", "seq": seq, "ts": round(time.time(), 3),
                    "model": {"name": "digits", "sha256": "0" * 64}, "provider": "CPUExecutionProvider",
                    "latency_ms": {"pre": 0.4, "infer": 3.1, "post": 0.1},
                    "result": {"top": [{"index": i, "label": str(i), "score": 0.1} for i in range(3)]}}  # fmt: skip
            with self.lock:
                info = self.client.publish("edged/bridge/cam0/results", json.dumps(body), qos=1)
                self.mids[info.mid] = seq
            self.halt.wait(max(0.0, start + seq / FPS - time.monotonic()))

    def stop(self) -> int:
        self.halt.set()
        self.thread.join(5)
        return len(self.mids) + len(self.acked)


def cut_bridge(work: Path, disk: Any, offline_s: float, n: int, autosave: int | None) -> dict[str, Any]:
    central = Mosquitto(work, f"central-m{n}", free_port())
    store = disk.mount / f"mosquitto{n}"
    store.mkdir()
    with contextlib.suppress(OSError):
        fd = os.open(disk.mount, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    extra = (
        f"persistence true\npersistence_location {store}/\n"
        + (f"autosave_interval {autosave}\n" if autosave is not None else "")
        + f"connection central\naddress 127.0.0.1:{central.port}\ntopic edged/# out 1\ncleansession false\n"
        f"remote_clientid bridge{n}\nrestart_timeout 1\n"
    )
    local = Mosquitto(work, f"local-m{n}", free_port(), extra)
    local.start()
    if local.proc is None:
        raise RuntimeError("the local broker did not start")
    disk.freeze_on_cut(local.proc.pid)
    disk.reset_counters()
    app = App(local.port)
    time.sleep(offline_s)  # the offline period
    sent = app.stop()
    with app.lock:
        stored = set(app.acked)
    written = disk.counters()["bytes_written"]
    disk.cut()
    local.proc.kill()
    local.proc.wait(10)
    app.client.loop_stop()
    disk.boot()
    central.start()
    sub = Collector(central.port)
    try:
        local.start()
        wait(lambda: sub.quiet_for(5) and (len(sub.seqs) >= len(stored) or sub.quiet_for(15)), 120)
        delivered = {seq for _, seq in sub.seqs}
    finally:
        local.stop()
        sub.close()
        central.stop()
    return {"stored": len(stored), "lost": len(stored - delivered), "bytes_per_result": written / max(1, sent),
            "payload": 0.0}  # fmt: skip


def part_cuts(work: Path, disk: Any, cuts: int, offline_s: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    systems: dict[str, Callable[[int], dict[str, Any]]] = {
        "edged (default config)": lambda n: cut_edged(work, disk, offline_s, n),
        "mosquitto bridge, autosave 1800 s (default)": lambda n: cut_bridge(work, disk, offline_s, n, None),
        "mosquitto bridge, autosave 1 s": lambda n: cut_bridge(work, disk, offline_s, n, 1),
    }
    n = 0
    for i in range(cuts):
        for name, run in systems.items():
            n += 1  # each run its own folders and names
            r = run(n)
            note(f"cut {i + 1} {name}: stored {r['stored']}, lost {r['lost']}, {r['bytes_per_result']:.0f} B/result")
            out.setdefault(name, []).append(r)
    return out


# -- slow flash -------------------------------------------------------------------------------------------


def slow_flash(work: Path, disk: Any, name: str, seconds: float) -> dict[str, Any]:
    """On one disk: live latency (1 pipeline at 30/s), the 8-pipeline live rate, offline bytes per result."""
    central = Mosquitto(work, f"central-{name}", free_port())
    central.start()
    sub = Collector(central.port)
    live = Edged(work, edged_config(work, disk.mount / f"lat-{name}", central.port))
    try:
        live.start()
        time.sleep(3)  # past the start: the steady state is measured
        with sub.lock:
            sub.latency_ms.clear()
        disk.reset_counters()
        f0 = live.frames()
        time.sleep(seconds)
        with sub.lock:
            lat = list(sub.latency_ms)
        online = disk.counters()
        online_frames = max(1, live.frames() - f0)
        live.stop()
        eight = Edged(work, edged_config(work, disk.mount / f"eight-{name}", central.port, pipelines=8, fps=0))
        eight.start()
        p0, t0 = eight.status()["mqtt"]["published"], time.monotonic()
        time.sleep(seconds)
        rate = (eight.status()["mqtt"]["published"] - p0) / (time.monotonic() - t0)
        eight.stop()
    finally:
        sub.close()
        central.stop()
    state = disk.mount / f"off-{name}"
    offline = Edged(work, edged_config(work, state, free_port()))
    offline.start()
    f0 = offline.frames()
    disk.reset_counters()
    time.sleep(seconds)
    written, frames = disk.counters()["bytes_written"], offline.frames() - f0
    offline.stop()
    payload = payload_mean(state)
    return {
        "latency_p50_ms": pct(lat, 0.5), "latency_p99_ms": pct(lat, 0.99), "latency_n": len(lat),
        "online_bytes_per_result": round(online["bytes_written"] / online_frames, 1),
        "online_fsyncs_per_s": round((online["fsyncs"] + online["dir_fsyncs"]) / seconds, 2),
        "eight_pipelines_acked_per_s": round(rate, 1),
        "offline_bytes_per_result": round(written / max(1, frames)), "payload": round(payload),
        "offline_x_payload": round(written / max(1, frames) / max(1.0, payload), 2),
    }  # fmt: skip


def drain_on(disk: Any, n: int) -> dict[str, Any]:
    """benchmarks/store_forward.py's drain (edged's spool and publisher vs bare paho) with its spool on `disk`."""
    cmd = [sys.executable, str(REPO / "benchmarks" / "store_forward.py"), "--drain", str(n), "--repeat", "3",
           "--steady", "0", "--io-results", "0", "--out", str(disk.mount / "drain"), "--json"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=1200)
    try:
        summary = json.loads(done.stdout)["drain"]["summary"]
    except (ValueError, KeyError, TypeError):
        return {"error": done.stderr[-500:]}
    return {"edged_msgs_s": round(summary["edged"]["msgs_s"]), "bare_msgs_s": round(summary["bare"]["msgs_s"]),
            "ratio": round(summary["ratio"], 2)}  # fmt: skip


# -- report -----------------------------------------------------------------------------------------------


SLOW_KEYS = (
    "latency_p50_ms",
    "latency_p99_ms",
    "online_bytes_per_result",
    "online_fsyncs_per_s",
    "eight_pipelines_acked_per_s",
    "offline_bytes_per_result",
    "payload",
    "offline_x_payload",
)


def table(cuts: dict[str, Any] | None, slow: dict[str, Any] | None) -> str:
    lines = []
    if cuts:
        lines += ["| system | cuts | stored per cut | lost per cut | uncertain seqs per cut | bytes written per "
                  "result offline |", "|---|---|---|---|---|---|"]  # fmt: skip
        for name, runs in cuts.items():
            stored = "/".join(str(r["stored"]) for r in runs)
            lost = "/".join(str(r["lost"]) for r in runs)
            uncertain = "/".join(str(r["uncertain"]) for r in runs) if "uncertain" in runs[0] else "-"
            per = statistics.median(r["bytes_per_result"] for r in runs)
            lines.append(f"| {name} | {len(runs)} | {stored} | {lost} | {uncertain} | {per:,.0f} B |")
    if slow:
        lines += ["", "| edged, default config | fast disk | slow flash (fsync 20-50 ms) |", "|---|---|---|"]
        for key in SLOW_KEYS:
            lines.append(f"| {key} | {slow['fast'][key]} | {slow['slow'][key]} |")
        if "ratio" in slow["slow"]:
            cells = [
                f"{d['edged_msgs_s']:,} / {d['bare_msgs_s']:,} = {d['ratio']}x" for d in (slow["fast"], slow["slow"])
            ]
            lines.append(f"| backlog drain, edged / bare paho (msgs/s) | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


@contextlib.contextmanager
def disks(work: Path, delay_ms: tuple[float, float], *, journal: bool = False, cache: bool = False) -> Iterator[Any]:
    from powercut import mounted

    name = f"disk-{int(delay_ms[1])}{'-journal' if journal else ''}{'-cache' if cache else ''}"
    with mounted(work / name, fsync_delay_ms=delay_ms, journal=journal, cache=cache) as fs:
        yield fs


def main(argv: list[str] | None = None) -> int:
    from powercut import unavailable

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--cuts", type=int, default=2, help="power cuts per system and disk")
    p.add_argument("--offline-s", type=float, default=10.0, help="seconds offline before each cut")
    p.add_argument("--seconds", type=float, default=10.0, help="seconds per slow-flash measurement")
    p.add_argument("--drain", type=int, default=20_000, help="backlog for the drain on slow flash (0: skip)")
    p.add_argument("--skip-cuts", action="store_true")
    p.add_argument("--skip-slow", action="store_true")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    why = unavailable()
    if why:
        print(f"cannot run: {why}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    cuts = slow = None
    with tempfile.TemporaryDirectory(prefix="edged-durability-") as tmp:
        work = Path(tmp)
        if not args.skip_cuts:
            cuts = {}
            for journal, label in ((True, "ext4-like"), (False, "strict POSIX")):
                with disks(work, (0, 0), journal=journal) as disk:
                    for name, runs in part_cuts(work, disk, args.cuts, args.offline_s).items():
                        cuts[f"{name}, {label} disk"] = runs
        if not args.skip_slow:
            slow = {}
            for name, delay in (("fast", (0.0, 0.0)), ("slow", (20.0, 50.0))):
                # no cut here: reads may come from the kernel's page cache, as on a real disk
                with disks(work, delay, cache=True) as disk:
                    slow[name] = slow_flash(work, disk, name, args.seconds)
                    if args.drain:
                        slow[name] |= drain_on(disk, args.drain)
                    note(f"{name}: {slow[name]}")
    result = {"cuts": cuts, "slow_flash": slow, "cpus": os.cpu_count(), "load": os.getloadavg()[0]}
    print(json.dumps(result, indent=2) if args.json else table(cuts, slow))
    return 0


if __name__ == "__main__":
    sys.exit(main())
