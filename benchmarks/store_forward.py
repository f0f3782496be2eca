"""Store-and-forward benchmark (issue 3): backlog drain, steady-state memory, bytes written per result.

One run, three parts, printed side by side (and as JSON with `--json`):

1. Drain. N results (default 50,000) are buffered in an `edged.store.spool.Spool` while no broker runs
   (`next_seq` + `append` + `flush`, ~400-byte JSON payloads shaped like the daemon's messages). Then a
   fresh Mosquitto starts (no persistence, unlimited in-flight and queue, no subscriber) and, in a child
   process, `edged.uplink.publisher.Publisher` drains the spool until `spool.depth == 0`. The parent samples the
   child's VmRSS every ~50 ms (start / max / end of the drain). The same payloads are then published
   to the same broker by a bare paho QoS 1 loop (paho 2.x, `loop_start`, the same in-flight window),
   timed until the last PUBACK. Both clocks start before the TCP connect. `--repeat` rounds,
   interleaved (E B E B ...), medians reported. Targets: edged/bare >= 0.8, RSS flat.
2. Steady state. `python -m edged run` with a tiny ONNX model on a looping small video, MQTT on; VmRSS
   when the status socket shows 10 % and 100 % of `--steady` results (default 10,000 and 100,000).
   Target: RSS(100k) <= RSS(10k) + 5 MB. Bounded by `--steady-timeout`; a shortfall is reported.
3. Bytes written per result. `write_bytes` of the daemon's /proc/<pid>/io over `--io-results` results
   (after a warm-up, so the spool's creation and its ballast file are excluded), for `sync: normal` and
   `sync: full`, with MQTT on (rows are deleted on PUBACK) and off (rows accumulate), against the mean
   payload size, the replay window on (the default: acknowledged results kept for replay requests) and, with
   MQTT on, off (`replay_max_bytes: 0`). Targets: <= 1x online with replay on, <= 4x offline. Also results/s
   per mode.

This is a measurement, not a test: it exits 0 whatever the figures are, non-zero only when something
crashed. Every broker and child it starts is stopped on exit, Ctrl-C included.

`--io-fps 30` runs part 3 at a camera's pace (commits then hold fewer rows: more bytes per result);
`--io-whatif batch_max=256,batch_ms=2000` adds two runs with other spool settings; `--edged-src DIR`
runs every edged child from a snapshot (e.g. `git archive HEAD edged | tar -x -C DIR`) while the
working tree is mid-edit.

    python benchmarks/store_forward.py
    python benchmarks/store_forward.py --drain 10000 --repeat 1 --steady 20000 --io-results 5000 --json
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import hashlib
import json
import os
import random
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT_DIR = REPO_ROOT / "bench-out"
TOPIC = "edged/bench/cam0/results"
RSS_POLL_S = 0.05
BARE_QUEUE_MAX = 30_000  # the bare loop's paho queue at most (see child_drain_bare)
STATUS_POLL_S = 0.1
MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
LABELS = ["person", "bicycle", "car", "motorcycle", "bus", "truck", "traffic light", "stop sign", "dog", "cat"]

_CHILDREN: list[subprocess.Popen[Any]] = []  # everything we started, stopped in `stop_children`
_LAST_PAYLOAD = [0.0]  # mean payload of the last bytes-written run that had rows to measure


# -- helpers -------------------------------------------------------------------------------------------------


def load() -> str:
    """The 1-minute load average, for the per-run notes."""
    return f"{os.getloadavg()[0]:.2f}"


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_field(pid: int, name: str, key: str) -> int | None:
    """An integer field of /proc/<pid>/<name> (`status` in kB, `io` in bytes); None when gone."""
    try:
        text = Path(f"/proc/{pid}/{name}").read_text(encoding="ascii")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return None


def rss_mb(pid: int) -> float | None:
    """VmRSS of a process in MiB; None when it is gone."""
    kb = proc_field(pid, "status", "VmRSS")
    return None if kb is None else kb / 1024.0


def child_env() -> dict[str, str]:
    """The environment of edged children: `--edged-src` (EDGED_SRC) first on the import path."""
    env = dict(os.environ)
    src = env.get("EDGED_SRC")
    if src:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    return env


def spawn(args: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
    """Start a child process (edged from `--edged-src` if given); stopped on every exit path."""
    proc: subprocess.Popen[Any] = subprocess.Popen(args, env=child_env(), **kwargs)
    _CHILDREN.append(proc)
    return proc


def stop(proc: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after `timeout`; forget the process."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    if proc in _CHILDREN:
        _CHILDREN.remove(proc)


def stop_children() -> None:
    """Stop everything still running that this script started."""
    for proc in _CHILDREN:
        with contextlib.suppress(Exception):
            stop(proc, 5.0)


@contextlib.contextmanager
def mosquitto(workdir: Path) -> Iterator[int]:
    """A fresh broker on a free loopback port: no persistence, no in-flight or queue limits."""
    port = free_port()
    conf = workdir / f"mosquitto-{port}.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\nuser {getpass.getuser()}\npersistence false\n"
        "max_inflight_messages 0\nmax_queued_messages 0\n",
        encoding="utf-8",
    )
    with (workdir / "mosquitto.log").open("ab") as log:
        proc = spawn([MOSQUITTO, "-c", str(conf)], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"mosquitto did not start (see {workdir / 'mosquitto.log'})") from None
                time.sleep(0.05)
        yield port
    finally:
        stop(proc)


class RssSampler(threading.Thread):
    """Samples a process's VmRSS every RSS_POLL_S seconds until stopped."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.samples: list[float] = []
        self.at_max: dict[str, float] = {}  # RssAnon / RssFile / RssShmem (MiB) at the highest sample
        self.at_start: dict[str, float] = {}  # the same at the first sample
        self._halt = threading.Event()

    def _sample(self) -> None:
        value = rss_mb(self.pid)
        if value is None:
            return
        if not self.samples or value > max(self.samples):
            keys = ("RssAnon", "RssFile", "RssShmem")
            self.at_max = {k: (proc_field(self.pid, "status", k) or 0) / 1024.0 for k in keys}
            if not self.samples:
                self.at_start = dict(self.at_max)
        self.samples.append(value)

    def run(self) -> None:
        """Poll until `finish`."""
        while not self._halt.is_set():
            self._sample()
            self._halt.wait(RSS_POLL_S)

    def finish(self) -> None:
        """Stop sampling (one last sample first)."""
        self._sample()
        self._halt.set()
        self.join()


# -- part 1: drain ----------------------------------------------------------------------------------------


def make_payload(seq: int, rng: random.Random) -> bytes:
    """A result message shaped like the daemon's (see edged/pipeline/message.py), about 400 bytes."""
    top = sorted(((rng.randrange(1000), rng.random()) for _ in range(3)), key=lambda t: -t[1])
    message = {
        "v": 1,
        "device": "pi-kitchen-01",
        "pipeline": "cam0",
        "seq": seq,
        "ts": round(time.time(), 3),
        "frame": seq - 1,
        "model": {"name": "mobilenetv2-int8", "sha256": hashlib.sha256(b"mobilenetv2").hexdigest()},
        "provider": "CPUExecutionProvider",
        "latency_ms": {
            "pre": round(rng.uniform(0.2, 2), 3),
            "infer": round(rng.uniform(5, 40), 3),
            "post": round(rng.uniform(0.05, 0.3), 3),
        },
        "result": {
            "top": [{"index": i, "label": LABELS[i % 10], "score": round(s, 6)} for i, s in top],
        },
    }
    return json.dumps(message, separators=(",", ":")).encode("utf-8")


def fill_spool(path: Path, n: int) -> tuple[float, float]:
    """Buffer n results in a new spool at `path` (no broker); (results/s, mean payload bytes)."""
    from edged.store.spool import Spool

    rng = random.Random(3)
    spool = Spool(path)
    spool.start()
    total = 0
    t0 = time.perf_counter()
    try:
        for _ in range(n):
            seq = spool.next_seq("cam0")
            payload = make_payload(seq, rng)
            total += len(payload)
            spool.append("cam0", seq, time.time(), TOPIC, payload)
        if not spool.flush(60):
            raise RuntimeError("spool flush timed out")
    finally:
        spool.close()
    return n / (time.perf_counter() - t0), total / n


def child_drain_edged(db: Path, port: int) -> dict[str, Any]:
    """(child) Drain the spool with edged's Publisher until depth 0."""
    from edged.store.spool import Spool
    from edged.uplink.mqttstats import MqttStats
    from edged.uplink.publisher import Publisher
    from edged.uplink.settings import MqttConfig

    spool = Spool(db)
    spool.start()
    n = spool.depth
    cfg = MqttConfig.model_validate({"host": "127.0.0.1", "port": port, "client_id": f"bench-edged-{os.getpid()}"})
    stats = MqttStats()
    publisher = Publisher(cfg, "bench", spool, stats)
    handshake()
    t0 = time.perf_counter()
    publisher.start()
    while spool.depth > 0 and publisher.is_alive():
        time.sleep(0.01)
    seconds = time.perf_counter() - t0
    publisher.request_stop(1.0)
    publisher.join(10)
    spool.close()
    return {"n": n, "seconds": seconds, "acked": stats.published, "left": spool.depth}


def child_drain_bare(db: Path, port: int, inflight: int) -> dict[str, Any]:
    """(child) Publish the spool's payloads with a bare paho QoS 1 loop; wait for every PUBACK."""
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    with contextlib.closing(sqlite3.connect(db)) as conn:
        rows = conn.execute("SELECT topic, payload FROM results ORDER BY id").fetchall()
    n = len(rows)
    acked = [0]
    done, connected = threading.Event(), threading.Event()

    def on_publish(_c: Any, _u: Any, _mid: int, _rc: Any, _p: Any) -> None:
        acked[0] += 1
        if acked[0] >= n:
            done.set()

    client = paho.Client(
        callback_api_version=CallbackAPIVersion.VERSION2, client_id=f"bench-bare-{os.getpid()}", protocol=paho.MQTTv5
    )
    client.max_inflight_messages_set(inflight)
    client.on_connect = lambda *_: connected.set()
    client.on_publish = on_publish
    handshake()
    t0 = time.perf_counter()
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        if not connected.wait(10):
            raise RuntimeError("bare paho: no CONNACK")
        for sent, (topic, payload) in enumerate(rows):
            # paho's message ids are 16-bit: more than 65,535 queued messages collide and never complete
            while sent - acked[0] >= BARE_QUEUE_MAX:
                time.sleep(0.001)
            client.publish(topic, payload, qos=1)
        done.wait(60 + n / 1000)
        seconds = time.perf_counter() - t0
    finally:
        client.disconnect()
        client.loop_stop()
    return {"n": n, "seconds": seconds, "acked": acked[0], "left": n - acked[0]}


def handshake() -> None:
    """(child) Say `ready` with our pid, then wait for the parent's `go`."""
    print(json.dumps({"ready": os.getpid()}), flush=True)
    sys.stdin.readline()


def run_drain_child(role: str, db: Path, port: int, inflight: int) -> dict[str, Any]:
    """Run one drain child; sample its RSS from `go` to its result line."""
    args = [sys.executable, __file__, "--child", role, "--db", str(db), "--port", str(port)]
    args += ["--inflight", str(inflight)]
    proc = spawn(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    if proc.stdin is None or proc.stdout is None:
        raise RuntimeError("no pipes to the drain child")
    try:
        ready = json.loads(proc.stdout.readline() or "{}")
        if "ready" not in ready:
            raise RuntimeError(f"drain child {role} failed to start (exit {proc.wait()})")
        sampler = RssSampler(proc.pid)
        sampler.start()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        sampler.finish()
        if not line:
            raise RuntimeError(f"drain child {role} crashed (exit {proc.wait()})")
        result: dict[str, Any] = json.loads(line)
        proc.wait(30)
    finally:
        stop(proc)
    s = sampler.samples or [0.0]
    result |= {"msgs_s": result["n"] / result["seconds"], "rss_start": s[0], "rss_max": max(s), "rss_end": s[-1]}
    # the highest RSS seen by the end of each quarter of the drain: a backlog held in memory would make it
    # climb to the end (or start high); one on disk levels off once the caches are warm
    result["rss_quarters"] = [max(s[: max(1, len(s) * q // 4)]) for q in (1, 2, 3, 4)]
    result["rss_at_max"] = sampler.at_max
    result["rss_at_start"] = sampler.at_start
    return result


@dataclass
class DrainReport:
    """Part 1 figures."""

    n: int
    fill_rate: float = 0.0
    payload_bytes: float = 0.0
    rounds: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


def part_drain(out: Path, n: int, repeat: int, inflight: int) -> DrainReport:
    """Fill once, then `repeat` interleaved rounds of edged and bare paho against one fresh broker each."""
    report = DrainReport(n)
    pristine = out / "drain-pristine" / "spool.db"
    pristine.parent.mkdir(parents=True)
    report.fill_rate, report.payload_bytes = fill_spool(pristine, n)
    note(f"drain: filled {n} results at {report.fill_rate:.0f}/s, mean payload {report.payload_bytes:.0f} B")
    for r in range(repeat):
        with mosquitto(out) as port:
            for role in ("edged", "bare"):
                work = out / f"drain-{r}-{role}"
                work.mkdir()
                shutil.copy2(pristine, work / "spool.db")
                res = run_drain_child(role, work / "spool.db", port, inflight)
                res |= {"round": r + 1, "role": role, "load": load()}
                report.rounds.append(res)
                note(
                    f"drain round {r + 1} {role:5}: {res['msgs_s']:8.0f} msgs/s ({res['seconds']:.2f} s, "
                    f"acked {res['acked']}/{res['n']}), RSS {res['rss_start']:.1f}/{res['rss_max']:.1f}/"
                    f"{res['rss_end']:.1f} MiB start/max/end, load {res['load']}"
                )
                shutil.rmtree(work)
    for role in ("edged", "bare"):
        rows = [x for x in report.rounds if x["role"] == role]
        report.summary[role] = {k: statistics.median(x[k] for x in rows) for k in ("msgs_s", "rss_start", "rss_max")}
        report.summary[role]["rss_end"] = statistics.median(x["rss_end"] for x in rows)
    ratios = [e["msgs_s"] / b["msgs_s"] for e, b in pairwise_roles(report.rounds)]
    report.summary["ratio"] = statistics.median(ratios)
    report.summary["ratios"] = ratios
    return report


def pairwise_roles(rounds: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(edged, bare) pairs of the same round."""
    by_round: dict[int, dict[str, dict[str, Any]]] = {}
    for x in rounds:
        by_round.setdefault(x["round"], {})[x["role"]] = x
    return [(v["edged"], v["bare"]) for v in by_round.values() if "edged" in v and "bare" in v]


# -- the daemon (parts 2 and 3) -----------------------------------------------------------------------------


def make_assets(out: Path) -> tuple[Path, Path]:
    """A tiny ONNX classifier and a small looping video (the test suite's generators)."""
    sys.path.insert(0, str(REPO_ROOT / "tests"))
    from conftest import make_tiny_model, make_video

    model = make_tiny_model(out / "tiny.onnx")
    video = make_video(out / "tiny.mp4", 300)
    return model, video


@dataclass
class DaemonRun:
    """A running `python -m edged run` and where its state lives."""

    proc: subprocess.Popen[Any]
    state: Path
    log: IO[bytes]

    def status(self) -> dict[str, Any] | None:
        """The status snapshot; None while the socket does not answer."""
        from edged.core.errors import StatusError
        from edged.ops.status import query

        try:
            return query(self.state / "status.sock", timeout=1.0)
        except (StatusError, OSError):
            return None

    def frames(self) -> int | None:
        """`pipelines[0].frames` from the status socket; None while it does not answer."""
        snap = self.status()
        try:
            return None if snap is None else int(snap["pipelines"][0]["frames"])
        except (KeyError, IndexError, TypeError):
            return None

    def spool_depth(self) -> int | None:
        """`spool.depth` from the status socket (results not yet acknowledged by the broker)."""
        snap = self.status()
        return None if snap is None else snap.get("spool", {}).get("depth")

    def wait_frames(self, target: int, deadline: float) -> int | None:
        """Poll until frames >= target; the last count seen (None if it never answered)."""
        seen = None
        while time.monotonic() < deadline and self.proc.poll() is None:
            seen = self.frames() or seen
            if seen is not None and seen >= target:
                return seen
            time.sleep(STATUS_POLL_S)
        if self.proc.poll() is not None:
            raise RuntimeError(f"the daemon exited with {self.proc.returncode} (log: {self.log.name})")
        return seen


@contextlib.contextmanager
def daemon(
    out: Path,
    name: str,
    assets: tuple[Path, Path],
    port: int | None,
    spool: dict[str, Any],
    *,
    fps: float = 0.0,
) -> Iterator[DaemonRun]:
    """Run the daemon with a fresh state dir under `out`; stopped (SIGTERM) on exit."""
    import yaml

    model, video = assets
    state = out / f"state-{name}"
    shutil.rmtree(state, ignore_errors=True)
    cfg = {
        "device_id": f"bench-{name}",
        "state_dir": str(state),
        "mqtt": {"enabled": port is not None, "host": "127.0.0.1", "port": port or 1883},
        "spool": spool,
        "pipelines": [
            {
                "name": "cam0",
                "source": {"type": "camera", "uri": str(video), "fps": fps, "loop": True},
                "model": {"path": str(model), "providers": ["CPUExecutionProvider"]},
            }
        ],
    }
    path = out / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    with (out / f"{name}.log").open("wb") as log:
        # cwd: `-m` puts the cwd first on sys.path; outside the repo, `--edged-src` (PYTHONPATH) wins
        proc = spawn([sys.executable, "-m", "edged", "run", "--config", str(path)], stdout=log, stderr=log, cwd=out)
        try:
            yield DaemonRun(proc, state, log)
        finally:
            stop(proc, 30)


def part_steady(out: Path, assets: tuple[Path, Path], total: int, timeout: float) -> dict[str, Any]:
    """RSS at total/10 and at total results (MQTT on); as far as it gets within `timeout`."""
    marks = [max(1, total // 10), total]
    report: dict[str, Any] = {"marks": marks, "points": [], "complete": True}
    with mosquitto(out) as port, daemon(out, "steady", assets, port, {}) as d:
        sampler = RssSampler(d.proc.pid)
        sampler.start()
        t0 = time.monotonic()
        deadline = t0 + timeout
        for mark in marks:
            seen = d.wait_frames(mark, deadline)
            rss = rss_mb(d.proc.pid)
            point = {"mark": mark, "frames": seen, "rss": rss, "t": time.monotonic() - t0, "load": load()}
            point["depth"] = d.spool_depth()
            report["points"].append(point)
            note(
                f"steady: {seen} results at {point['t']:.0f} s: RSS {rss:.1f} MiB, spool depth {point['depth']},"
                f" load {point['load']}"
            )
            if seen is None or seen < mark:
                report["complete"] = False
                break
        sampler.finish()
        report["rss_max"] = max(sampler.samples or [0.0])
        report["rate"] = (report["points"][-1]["frames"] or 0) / max(report["points"][-1]["t"], 1e-9)
    return report


def part_io(out: Path, assets: tuple[Path, Path], args: argparse.Namespace) -> list[dict[str, Any]]:
    """write_bytes per result for sync normal/full with MQTT on/off, after a warm-up (see measure_io).

    With `--io-whatif batch_max=256,batch_ms=1000` (any `spool:` keys), two more runs (sync normal, MQTT
    on and off) with those settings show what larger commits would save; the table marks them.
    """
    runs: list[tuple[dict[str, Any], bool]] = [
        ({"sync": sync}, mqtt_on)
        for sync in ("normal", "full")
        for mqtt_on in (False, True)  # off first: it measures the payload
    ]
    runs += [({"sync": sync, "replay_max_bytes": 0}, True) for sync in ("normal", "full")]  # replay off
    if args.io_whatif:
        extra = {k.strip(): yaml_value(v) for k, _, v in (kv.partition("=") for kv in args.io_whatif.split(","))}
        runs += [({"sync": "normal", **extra}, m) for m in (False, True)]
    rows = []
    for n, (spool, mqtt_on) in enumerate(runs):
        name = f"io-{n}-{spool['sync']}-{'mqtt' if mqtt_on else 'nomqtt'}"
        with contextlib.ExitStack() as stack:
            port = stack.enter_context(mosquitto(out)) if mqtt_on else None
            d = stack.enter_context(daemon(out, name, assets, port, spool, fps=args.io_fps))
            row = measure_io(d, name, mqtt_on=mqtt_on, results=args.io_results, timeout=args.io_timeout)
            settings = ",".join(f"{k}={v}" for k, v in spool.items() if k != "sync") or "default"
            rows.append(row | {"sync": spool["sync"], "settings": settings, "fps": args.io_fps})
    return rows


def yaml_value(text: str) -> Any:
    """A config value given on the command line, read as YAML (numbers stay numbers)."""
    import yaml

    return yaml.safe_load(text)


def measure_io(d: DaemonRun, name: str, *, mqtt_on: bool, results: int, timeout: float) -> dict[str, Any]:
    """Sample /proc/<pid>/io between two status readings `results` apart, after a warm-up.

    The warm-up (min(1000, results / 10) results) keeps the spool's creation and its ballast file out.
    """
    deadline = time.monotonic() + timeout
    warm = max(10, min(1000, results // 10))
    f0 = d.wait_frames(warm, deadline) or 0
    t0 = time.monotonic()
    w0, c0 = proc_field(d.proc.pid, "io", "write_bytes") or 0, proc_field(d.proc.pid, "io", "wchar") or 0
    f1 = d.wait_frames(f0 + results, deadline) or f0
    t1 = time.monotonic()
    w1, c1 = proc_field(d.proc.pid, "io", "write_bytes") or 0, proc_field(d.proc.pid, "io", "wchar") or 0
    n = max(1, f1 - f0)
    payload = mean_payload(d.state / "spool.db") or _LAST_PAYLOAD[0]  # MQTT on: the spool may be empty
    _LAST_PAYLOAD[0] = payload
    row = {
        "name": name,
        "mqtt": mqtt_on,
        "results": f1 - f0,
        "complete": f1 - f0 >= results,
        "write_bytes_per_result": (w1 - w0) / n,
        "wchar_per_result": (c1 - c0) / n,
        "payload_bytes": payload,
        "rate": (f1 - f0) / max(t1 - t0, 1e-9),
        "load": load(),
    }
    row["ratio"] = float(row["write_bytes_per_result"]) / payload if payload else float("nan")  # type: ignore[arg-type]
    note(
        f"io {name}: {row['results']} results at {row['rate']:.0f}/s, write_bytes {row['write_bytes_per_result']:.0f}"
        f" B/result ({row['ratio']:.2f}x payload {payload:.0f} B), wchar {row['wchar_per_result']:.0f} B/result,"
        f" load {row['load']}"
    )
    return row


def mean_payload(db: Path) -> float:
    """Mean payload size of the daemon's messages (rows still in the spool, else its last rows seen)."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        value = conn.execute("SELECT AVG(LENGTH(payload)) FROM (SELECT payload FROM results LIMIT 1000)").fetchone()
    return float(value[0]) if value and value[0] else 0.0


# -- report -------------------------------------------------------------------------------------------------


def note(text: str) -> None:
    """A progress line on stderr (the table goes to stdout)."""
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def drain_lines(drain: DrainReport) -> list[str]:
    """Part 1 of the table: the drain, edged beside bare paho."""
    lines: list[str] = []
    s = drain.summary
    lines += [
        f"1. Drain of {drain.n} buffered results (payload {drain.payload_bytes:.0f} B, medians of "
        f"{len(drain.rounds) // 2} rounds; spool filled at {drain.fill_rate:.0f} results/s)",
        f"   {'':22} {'msgs/s':>9} {'RSS start':>10} {'RSS max':>9} {'RSS end':>9}  (MiB)",
    ]
    for role, label in (("edged", "edged Publisher"), ("bare", "bare paho QoS 1 loop")):
        r = s[role]
        lines.append(f"   {label:22} {r['msgs_s']:9.0f} {r['rss_start']:10.1f} {r['rss_max']:9.1f} {r['rss_end']:9.1f}")
    lines.extend(
        f"     round {x['round']} {x['role']:5}: {x['msgs_s']:7.0f} msgs/s, {x['seconds']:.2f} s, acked "
        f"{x['acked']}/{x['n']}, RSS {x['rss_start']:.1f}/{x['rss_max']:.1f}/{x['rss_end']:.1f}, load {x['load']}"
        for x in drain.rounds
    )
    per_round = ", ".join(f"{x:.2f}" for x in s["ratios"])
    lines.append(f"   edged/bare = {s['ratio']:.2f} (target >= 0.8; per round: {per_round})")
    grow = s["edged"]["rss_max"] - s["edged"]["rss_start"]
    lines.append(f"   edged RSS growth during the drain: {grow:+.1f} MiB (target: flat)")
    for role in ("edged", "bare"):
        quarters = [x["rss_quarters"] for x in drain.rounds if x["role"] == role and x.get("rss_quarters")]
        if quarters:
            q = " / ".join(f"{v:.1f}" for v in quarters[-1])
            lines.append(f"   {role} max RSS by the end of each quarter of the drain, last round: {q} MiB")
    last = [x for x in drain.rounds if x["role"] == "edged" and x.get("rss_at_max")]
    if last:
        a, b = last[-1]["rss_at_start"], last[-1]["rss_at_max"]
        split = ", ".join(f"{k} {a.get(k, 0):.1f} -> {v:.1f}" for k, v in b.items())
        lines.append(f"   edged RSS start -> max, last round: {split} MiB")
    return lines


def table(drain: DrainReport | None, steady: dict[str, Any] | None, io: list[dict[str, Any]] | None) -> str:
    """The side-by-side table."""
    lines: list[str] = drain_lines(drain) if drain is not None else []
    if steady is not None:
        lines.append("2. Steady state (daemon, tiny model, looping video, MQTT on)")
        for p in steady["points"]:
            rss = "n/a" if p["rss"] is None else f"{p['rss']:.1f} MiB"
            lines.append(
                f"   RSS at {p['frames']} results (mark {p['mark']}, {p['t']:.0f} s, load {p['load']}): {rss};"
                f" spool depth {p['depth']}"
            )
        pts = steady["points"]
        if steady["complete"] and len(pts) == 2 and pts[0]["rss"] is not None and pts[1]["rss"] is not None:
            lines.append(f"   growth {pts[1]['rss'] - pts[0]['rss']:+.1f} MiB (target <= +5 MB)")
        else:
            lines.append("   INCOMPLETE: the last mark was not reached within --steady-timeout")
        lines.append(f"   max RSS seen {steady['rss_max']:.1f} MiB; {steady['rate']:.0f} results/s overall")
    if io:
        lines += [
            "3. Bytes written per result (/proc/<pid>/io: write_bytes = pages dirtied for the block layer;"
            " wchar = bytes passed to write(2)/pwrite(2))",
            f"   {'sync':6} {'spool settings':30} {'fps':>4} {'mqtt':5} {'results':>8} {'res/s':>7} "
            f"{'write B/res':>11} {'x payload':>9} {'wchar B/res':>11} {'load':>5}",
        ]
        for r in io:
            flag = "" if r["complete"] else "  (incomplete)"
            lines.append(
                f"   {r['sync']:6} {r['settings']:30} {r['fps']:4.0f} {'on' if r['mqtt'] else 'off':5} "
                f"{r['results']:8} {r['rate']:7.0f} "
                f"{r['write_bytes_per_result']:11.0f} {r['ratio']:9.2f} {r['wchar_per_result']:11.0f} "
                f"{r['load']:>5}{flag}"
            )
        lines.append("   target: write_bytes <= 4x payload at default settings (sync normal); fps 0: flat out")
    return "\n".join(lines)


# -- main ---------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--drain", type=int, default=50_000, help="results buffered for the drain (0 = skip)")
    p.add_argument("--repeat", type=int, default=3, help="interleaved drain rounds")
    p.add_argument("--inflight", type=int, default=32, help="in-flight window for both (Publisher default 32)")
    p.add_argument("--steady", type=int, default=100_000, help="results for the steady-state part (0 = skip)")
    p.add_argument("--steady-timeout", type=float, default=300.0, help="seconds at most for the steady part")
    p.add_argument("--io-results", type=int, default=20_000, help="results per bytes-written run (0 = skip)")
    p.add_argument("--io-timeout", type=float, default=180.0, help="seconds at most per bytes-written run")
    p.add_argument("--io-fps", type=float, default=0.0, help="source rate for the bytes-written runs (0 = flat out)")
    p.add_argument("--io-whatif", help="extra runs with these spool settings, e.g. batch_max=256,batch_ms=1000")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT_DIR, help="work dir (on a real disk, not tmpfs)")
    p.add_argument("--keep", action="store_true", help="keep the work dir")
    p.add_argument(
        "--edged-src",
        type=Path,
        help="import edged from this directory (e.g. a `git archive HEAD edged` snapshot) instead of the"
        " installed working tree, when the tree is mid-edit",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--child", choices=["edged", "bare"], help=argparse.SUPPRESS)
    p.add_argument("--db", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def child_main(args: argparse.Namespace) -> int:
    """Entry of a drain child: one JSON line with the result."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us
    if args.child == "edged":
        result = child_drain_edged(args.db, args.port)
    else:
        result = child_drain_bare(args.db, args.port, args.inflight)
    print(json.dumps(result), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the parts asked for and print the table (or JSON)."""
    args = parse_args(argv)
    if args.child:
        return child_main(args)
    if args.edged_src:
        src = str(args.edged_src.resolve())
        os.environ["EDGED_SRC"] = src
        sys.path.insert(0, src)
    args.out.mkdir(parents=True, exist_ok=True)
    out = Path(tempfile.mkdtemp(prefix="store-forward-", dir=args.out))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    import edged

    note(f"work dir {out}; {os.cpu_count()} CPUs, load {load()}; edged from {Path(edged.__file__).parent}")
    drain = steady = io = None
    errors: list[str] = []
    try:
        if args.drain:
            drain = guarded(errors, "drain", lambda: part_drain(out, args.drain, max(1, args.repeat), args.inflight))
        if args.steady or args.io_results:
            assets = make_assets(out)
            if args.steady:
                steady = guarded(errors, "steady", lambda: part_steady(out, assets, args.steady, args.steady_timeout))
            if args.io_results:
                io = guarded(errors, "io", lambda: part_io(out, assets, args))
    except KeyboardInterrupt:
        note("interrupted; stopping children")
        return 130
    finally:
        stop_children()
        if errors:
            note(f"kept {out} for the logs")
        elif not args.keep:
            shutil.rmtree(out, ignore_errors=True)
    emit(args.json, drain, steady, io, errors)
    return 1 if errors else 0


def emit(
    as_json: bool,
    drain: DrainReport | None,
    steady: dict[str, Any] | None,
    io: list[dict[str, Any]] | None,
    errors: list[str],
) -> None:
    """Print the table (or JSON) and the errors."""
    if as_json:
        data = {
            "drain": drain.__dict__ if drain else None,
            "steady": steady,
            "io": io,
            "errors": errors,
            "load_end": load(),
        }
        print(json.dumps(data, indent=2, default=str))
    else:
        print(table(drain, steady, io))
    for e in errors:
        print(f"ERROR {e}")


def guarded(errors: list[str], part: str, fn: Callable[[], Any]) -> Any:
    """Run one part; a crash is recorded (the other parts still run) and makes the exit status 1."""
    try:
        return fn()
    except (RuntimeError, OSError, sqlite3.Error, subprocess.SubprocessError, ValueError) as exc:
        errors.append(f"{part}: {type(exc).__name__}: {exc}")
        note(f"{part} failed: {exc}")
        stop_children()
        return None


if __name__ == "__main__":
    sys.exit(main())
