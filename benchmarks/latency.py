"""Capture-to-subscriber latency and bytes written per result (issue "Publish at the speed of the edge").

One run, side by side, Mosquitto on loopback, a paho subscriber in this process measuring
`time.time() - ts` (the capture time in the message) for every message:

E  `python -m edged run` with the default config (only broker, state_dir and the pipeline set): the bundled
   digits int8 model on the bundled sample video at 30 frames/s, looping. Also its /proc/<pid>/io
   write_bytes per result over the measured window (broker up), and the same with no broker (buffering).
B  the ceiling: a bare script that reads the same video at 30 frames/s with OpenCV, runs the same model on
   each frame (resize, scale, `session.run`, softmax top-1) and publishes the result with paho QoS 1 as soon
   as it has it: no spool, no threads of its own.
I  idle: `edged run` with one pipeline at 1 frame/s, broker up: CPU (utime + stime of the process) and
   wake-ups per second over `--idle-s` seconds, per thread name (edged names its threads for the OS).
   A wake-up is a voluntary context switch (from /proc/<pid>/task/*/status): a thread going to sleep, on
   a timer, a lock, the GIL or I/O, and waking later. The figure includes paho's and FFmpeg's threads.

L  the live path: `edged run` with `--live` pipelines (default 8) on the bundled video read at the model's
   pace (flat out), broker up: results produced and acknowledged per second over `--live-s` seconds, and
   the spool depth (all results not yet acknowledged) during that time.

Targets: E p50 <= 15 ms, p99 <= 50 ms, E p50 within 2x of B's; write_bytes per result <= 1x the payload
with the broker up, <= 4x with it down; idle CPU <= 1 % of a core and <= 20 wake-ups/s;
live path: acknowledged = produced, the spool depth level.
A measurement, not a test: exit 0 whatever the figures are.

    python benchmarks/latency.py --messages 600
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
ASSETS = REPO_ROOT / "edged" / "assets"
MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"

BARE = r"""
import json, sys, time, cv2, numpy as np, onnxruntime as ort, paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
port, video, model, n = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
inp = session.get_inputs()[0]
_, _, h, w = inp.shape
c = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id="bare", protocol=paho.MQTTv5)
c.connect("127.0.0.1", port); c.loop_start()
cap = cv2.VideoCapture(video); due = time.monotonic(); seq = 0
while seq < n:
    ok, frame = cap.read()
    if not ok:
        cap.set(cv2.CAP_PROP_POS_FRAMES, 0); continue
    ts = time.time(); seq += 1
    x = cv2.resize(frame, (w, h))[:, :, ::-1].astype(np.float32).transpose(2, 0, 1)[None] / 255.0
    logits = session.run(None, {inp.name: x})[0][0]
    p = np.exp(logits - logits.max()); p /= p.sum(); top = int(p.argmax())
    body = {"seq": seq, "ts": ts, "result": {"top": [{"index": top, "score": float(p[top])}]}, "pad": "x" * 300}
    c.publish("bare/results", json.dumps(body), qos=1)
    due += 1 / 30.0
    time.sleep(max(0.0, due - time.monotonic()))
time.sleep(1); c.loop_stop()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def mosquitto(work: Path) -> Iterator[int]:
    port = free_port()
    conf = work / f"mosquitto-{port}.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n", encoding="utf-8")
    proc = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            break
        time.sleep(0.05)
    try:
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


class Latencies:
    """A subscriber collecting `time.time() - ts` (ms) of every message on a topic filter."""

    def __init__(self, port: int, topic: str) -> None:
        import paho.mqtt.client as paho
        from paho.mqtt.enums import CallbackAPIVersion

        self.values: list[float] = []
        self.sizes: list[int] = []
        self.ready = threading.Event()
        self.client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda *_a: self.ready.set()
        self.client.connect("127.0.0.1", port)
        self.client.subscribe(topic, qos=1)
        self.client.loop_start()
        self.ready.wait(10)

    def _on_message(self, _c: Any, _u: Any, msg: Any) -> None:
        now = time.time()
        with contextlib.suppress(ValueError, KeyError, TypeError):
            self.values.append((now - float(json.loads(msg.payload)["ts"])) * 1e3)
            self.sizes.append(len(msg.payload))

    def wait(self, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.values) < n and time.monotonic() < deadline:
            time.sleep(0.05)

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def write_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text(encoding="utf-8").splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    return 0


def frames(state: Path) -> int:
    from edged.core.errors import StatusError
    from edged.ops.status import query

    try:
        return int(query(state / "status.sock", timeout=1.0)["pipelines"][0]["frames"])
    except (StatusError, OSError, KeyError, IndexError):
        return 0


def start_edged(
    work: Path, name: str, port: int, fps: int = 30, pipelines: int = 1
) -> tuple[subprocess.Popen[bytes], Path]:
    import yaml

    state = work / f"state-{name}"
    cfg = {
        "device_id": f"lat-{name}",
        "state_dir": str(state),
        "mqtt": {"host": "127.0.0.1", "port": port},
        "pipelines": [
            {
                "name": f"cam{i}",
                "source": {"type": "camera", "uri": str(ASSETS / "sample.mp4"), "fps": fps, "loop": True},
                "model": {"path": str(ASSETS / "digits.int8.onnx"), "providers": ["CPUExecutionProvider"]},
            }
            for i in range(pipelines)
        ],
    }
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    log = (work / f"{name}.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "edged", "run", "--config", str(path)], stdout=log, stderr=log)
    deadline = time.monotonic() + 60
    while (
        frames(state) < (min(30, 3 * fps) if fps else 30) and time.monotonic() < deadline
    ):  # warmed up, spool and ballast made
        time.sleep(0.1)
    return proc, state


def measure_edged(work: Path, port: int | None, n: int) -> dict[str, Any]:
    """Latency (broker up) and write_bytes per result (up, or down when port is None)."""
    target = port if port is not None else free_port()
    sub = Latencies(port, "edged/#") if port is not None else None
    proc, state = start_edged(work, "up" if port else "down", target)
    try:
        f0, w0 = frames(state), write_bytes(proc.pid)
        if sub is not None:
            sub.values.clear()
            sub.sizes.clear()
            sub.wait(n, n / 30 * 3 + 30)
        else:
            deadline = time.monotonic() + n / 30 * 3 + 30
            while frames(state) < f0 + n and time.monotonic() < deadline:
                time.sleep(0.2)
        f1, w1 = frames(state), write_bytes(proc.pid)
    finally:
        proc.terminate()
        proc.wait(30)
        if sub is not None:
            sub.close()
    out: dict[str, Any] = {"results": f1 - f0, "write_bytes_per_result": (w1 - w0) / max(1, f1 - f0)}
    if sub is not None:
        out |= {"p50": pct(sub.values, 0.5), "p99": pct(sub.values, 0.99), "payload": statistics.mean(sub.sizes)}
    return out


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8").rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime (fields 14 and 15 of stat)


def switches(pid: int) -> dict[str, int]:
    """Voluntary context switches per thread name, summed over threads of one name: each is a thread going
    to sleep, so each is one wake-up later (involuntary switches are preemptions of a running thread)."""
    out: dict[str, int] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            text = (task / "status").read_text(encoding="utf-8")
            fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
            name = fields["Name"].strip()
            count = int(fields["voluntary_ctxt_switches"])
            out[name] = out.get(name, 0) + count
    return out


FOREIGN_THREADS = ("paho-", "av:")  # paho's network thread and FFmpeg's decoders: not edged's own


def measure_idle(work: Path, port: int, seconds: float) -> dict[str, Any]:
    """CPU share and wake-ups/s of `edged run` with one pipeline at 1 frame/s, broker up."""
    proc, _state = start_edged(work, "idle", port, fps=1)
    try:
        time.sleep(2.0)  # past start-up (imports, model load, first commit)
        t0, c0, s0 = time.monotonic(), cpu_ticks(proc.pid), switches(proc.pid)
        time.sleep(seconds)
        t1, c1, s1 = time.monotonic(), cpu_ticks(proc.pid), switches(proc.pid)
    finally:
        proc.terminate()
        proc.wait(30)
    span = t1 - t0
    per_thread = {name: (s1.get(name, 0) - s0.get(name, 0)) / span for name in s1}
    per_thread = {k: round(v, 2) for k, v in sorted(per_thread.items(), key=lambda kv: -kv[1]) if v > 0}
    own = {k: v for k, v in per_thread.items() if not k.startswith(FOREIGN_THREADS)}
    return {
        "seconds": round(span, 1),
        "cpu_percent": 100.0 * (c1 - c0) / os.sysconf("SC_CLK_TCK") / span,
        "wakeups_s": sum(own.values()),
        "wakeups_all_s": sum(per_thread.values()),
        "wakeups_by_thread": per_thread,
    }


def live_counts(state: Path) -> tuple[int, int, int]:
    """(results produced by every pipeline, results the broker acknowledged, spool depth) from the status."""
    from edged.core.errors import StatusError
    from edged.ops.status import query

    try:
        snap = query(state / "status.sock", timeout=2.0)
    except (StatusError, OSError):
        return 0, 0, 0
    produced = sum(int(p["frames"]) for p in snap["pipelines"])
    return produced, int(snap["mqtt"]["published"]), int(snap["spool"]["depth"])


def measure_live(work: Path, port: int, pipelines: int, seconds: float) -> dict[str, Any]:
    """`pipelines` pipelines flat out (each video read at its model's pace), broker up: does publishing
    keep up with production, and does the spool stay level?"""
    proc, state = start_edged(work, f"live{pipelines}", port, fps=0, pipelines=pipelines)
    try:
        time.sleep(2.0)
        (p0, a0, d0), t0 = live_counts(state), time.monotonic()
        depths = [d0]
        while time.monotonic() - t0 < seconds:
            time.sleep(0.5)
            depths.append(live_counts(state)[2])
        (p1, a1, d1), t1 = live_counts(state), time.monotonic()
    finally:
        proc.terminate()
        proc.wait(30)
    span = t1 - t0
    return {
        "pipelines": pipelines,
        "produced_s": (p1 - p0) / span,
        "published_s": (a1 - a0) / span,
        "depth_start": d0,
        "depth_end": d1,
        "depth_max": max(depths),
    }


def measure_bare(port: int, n: int) -> dict[str, Any]:
    sub = Latencies(port, "bare/#")
    model = str(ASSETS / "digits.int8.onnx")
    subprocess.run([sys.executable, "-c", BARE, str(port), str(ASSETS / "sample.mp4"), model, str(n + 30)], check=True)
    sub.wait(n + 30, 10)
    sub.close()
    values = sub.values[30:]
    return {"p50": pct(values, 0.5), "p99": pct(values, 0.99), "messages": len(values)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--messages", type=int, default=600, help="messages measured per run (30 per second)")
    parser.add_argument("--idle-s", type=float, default=20.0, help="seconds the idle daemon is measured (0: skip)")
    parser.add_argument("--live", type=int, default=8, help="pipelines run flat out for the live path (0: skip)")
    parser.add_argument("--live-s", type=float, default=15.0, help="seconds the live path is measured")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="edged-latency-", dir=os.environ.get("TMPDIR")) as tmp:
        work = Path(tmp)
        with mosquitto(work) as port:
            edged = measure_edged(work, port, args.messages)
            bare = measure_bare(port, args.messages)
            idle = measure_idle(work, port, args.idle_s) if args.idle_s > 0 else None
            live = measure_live(work, port, args.live, args.live_s) if args.live > 0 else None
        down = measure_edged(work, None, args.messages)
    report = {
        "edged": edged, "bare": bare, "broker_down": down, "idle": idle, "live": live, "load": os.getloadavg()[0]
    }  # fmt: skip
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    payload = edged.get("payload", float("nan"))
    print(f"capture -> subscriber, 30 frames/s, {args.messages} messages, load {report['load']:.2f}")
    print(f"  edged  p50 {edged['p50']:6.2f} ms  p99 {edged['p99']:6.2f} ms   (targets <= 15 / <= 50)")
    ratio = edged["p50"] / bare["p50"]
    print(f"  bare   p50 {bare['p50']:6.2f} ms  p99 {bare['p99']:6.2f} ms   edged/bare p50 {ratio:.2f}x")
    print(f"write_bytes per result, payload {payload:.0f} B")
    up, dn = edged["write_bytes_per_result"], down["write_bytes_per_result"]
    print(f"  broker up    {up:8.0f} B  ({up / payload:.2f}x payload, target <= 1x)")
    print(f"  broker down  {dn:8.0f} B  ({dn / payload:.2f}x payload, target <= 4x)")
    if live is not None:
        print(f"live path, {live['pipelines']} pipelines flat out, broker up")
        print(f"  produced {live['produced_s']:.0f} results/s, acknowledged {live['published_s']:.0f}/s "
              f"({live['published_s'] / max(1e-9, live['produced_s']):.3f}); spool depth {live['depth_start']} -> "
              f"{live['depth_end']} (max {live['depth_max']})")  # fmt: skip
    if idle is not None:
        print(f"idle, one pipeline at 1 frame/s, broker up, {idle['seconds']:.0f} s")
        print(f"  CPU {idle['cpu_percent']:.2f} % of a core (target <= 1 %)")
        print(
            f"  wake-ups of edged's own threads {idle['wakeups_s']:.1f}/s (target <= 20/s); "
            f"{idle['wakeups_all_s']:.1f}/s with paho's and FFmpeg's: "
            + ", ".join(f"{name} {rate:.1f}" for name, rate in idle["wakeups_by_thread"].items())
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
