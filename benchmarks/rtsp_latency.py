"""Capture-to-result latency against the RTSP stream's own clock, with a model slower than the camera:
does edged read the latest frame, or fall behind a growing decoder buffer?

A real RTSP server (GStreamer's, tests/rtspcam.py) pushes frames at `--fps` (default 25) and logs the time it
pushes each one (tests/rtsp_server.py, RTSP_PUSH_LOG): the stream's own clock. Each frame carries its number
in 11 black or white stripes. The model (built here, a real ONNX graph) returns the stripes' means, so the
result says which frame it was made from, and spends about `--model-ms` (default 120 ms, 3 frames at 25/s)
on a convolution over an upscaled copy of the frame: the camera is faster than the model, as on a Pi.

Side by side, one after the other, in one run, for `--seconds` each (default 40):

E  `edged run` on the stream (`fps: 0`, postprocess `raw`), Mosquitto on loopback; a paho subscriber here
   takes each result's arrival time. Latency = arrival - the time the server pushed that frame: transport,
   decode, the model, the spool and MQTT. Also push -> the message's `ts` (when edged took the frame from
   the decoder): what a frame waited for before edged read it.
N  the naive loop a user writes: `cv2.VideoCapture(url)`, read one frame, run the same model, note the time;
   read the next. Latency = result time - push time (no MQTT: flattering N).

Reports p50/p95/max per role, and the median over the first and the last quarter of the window: a reader
that falls behind grows from the first to the last. A measurement, not a test: exit 0 whatever the figures.
Needs `scripts/setup dev`. About 2 minutes.

    .venv/bin/python benchmarks/rtsp_latency.py --json
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from conftest import Broker, base_config, free_port, write_config  # noqa: E402
from rtspcam import RtspCamera  # noqa: E402
from stripes import MODEL_H, MODEL_W, PushClock, frame_number, make_model, write_frames  # noqa: E402

NAIVE = r"""
import sys, time, cv2, numpy as np, onnxruntime as ort
url, model, seconds, w, h = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
options = ort.SessionOptions()
options.intra_op_num_threads = 1
session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
name = session.get_inputs()[0].name
cap = cv2.VideoCapture(url, cv2.CAP_FFMPEG)
end = time.monotonic() + seconds
while time.monotonic() < end:
    ok, image = cap.read()
    if not ok:
        print("read failed", file=sys.stderr); break
    rgb = cv2.cvtColor(cv2.resize(image, (w, h)), cv2.COLOR_BGR2RGB)
    x = (rgb.astype(np.float32) / 255.0).transpose(2, 0, 1)[None]
    means = session.run(None, {name: x})[0].reshape(-1)
    print(" ".join(f"{v:.4f}" for v in means), f"{time.time():.6f}", flush=True)
"""


def run_ms(model: Path) -> float:
    """Median ms of one single-threaded run (edged's CPU default: one thread per run)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    x = np.zeros((1, 3, MODEL_H, MODEL_W), np.float32)
    times = []
    for _ in range(7):
        t0 = time.perf_counter()
        session.run(None, {"image": x})
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def tune_model(work: Path, target_ms: float) -> tuple[Path, float]:
    """The smallest upscale whose run takes at least `target_ms`."""
    for upscale in range(128, 2049, 64):
        model = make_model(work / "stripes.onnx", upscale, 8)
        ms = run_ms(model)
        if ms >= target_ms:
            return model, ms
    return model, ms


def summary(latencies: list[tuple[float, float]], seconds: float) -> dict[str, Any]:
    """Percentiles, results/s and the first and last quarter's medians."""
    if not latencies:
        return {"results": 0}
    ms = sorted(v for _, v in latencies)
    start, end = latencies[0][0], latencies[-1][0]
    quarter = (end - start) / 4
    first = [v for t, v in latencies if t <= start + quarter]
    last = [v for t, v in latencies if t >= end - quarter]
    return {
        "results": len(ms),
        "results_per_s": round(len(ms) / seconds, 1),
        "p50_ms": round(statistics.median(ms)),
        "p95_ms": round(ms[int(0.95 * (len(ms) - 1))]),
        "max_ms": round(ms[-1]),
        "first_quarter_p50_ms": round(statistics.median(first)),
        "last_quarter_p50_ms": round(statistics.median(last)),
    }


def run_edged(
    work: Path, cam: RtspCamera, model: Path, seconds: float
) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """E: the daemon on the stream; (frame number, arrival time) and (frame number, capture ts) per result."""
    broker = Broker("127.0.0.1", free_port(), work / "mq")
    (work / "mq").mkdir()
    broker.start()
    arrivals: list[tuple[int, float]] = []
    captures: list[tuple[int, float]] = []
    lock = threading.Lock()

    def on_message(_c: Any, _u: Any, msg: paho.MQTTMessage) -> None:
        at = time.time()
        body = json.loads(msg.payload)
        values = body["result"]["outputs"][0]["values"]
        with lock:
            arrivals.append((frame_number(values), at))
            captures.append((frame_number(values), float(body["ts"])))

    sub = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id="bench-sub", protocol=paho.MQTTv5)
    sub.on_message = on_message
    sub.connect("127.0.0.1", broker.port)
    sub.subscribe("edged/+/+/results", qos=1)
    sub.loop_start()
    cfg = base_config(work, model, cam.url(), broker=broker, stop_at_end=False)
    pipeline = cfg["pipelines"][0]
    pipeline["postprocess"] = {"type": "raw", "max_values": MODEL_W}
    cfg["spool"].pop("batch_ms", None)  # the default
    config = write_config(work / "edged.yaml", cfg)
    daemon = subprocess.Popen([sys.executable, "-m", "edged", "run", "--config", str(config)],
                              stdout=subprocess.DEVNULL, stderr=(work / "edged.log").open("w"))  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(arrivals) < 10:  # started, warmed up, connected
            time.sleep(0.1)
        with lock:
            arrivals.clear()
            captures.clear()
        time.sleep(seconds)
        with lock:
            return list(arrivals), list(captures)
    finally:
        daemon.terminate()
        daemon.wait(30)
        sub.loop_stop()
        sub.disconnect()
        broker.stop()


def run_naive(cam: RtspCamera, model: Path, seconds: float) -> list[tuple[int, float]]:
    """N: read, run, read; (frame number, result time) per result, after its first 10 (start-up)."""
    argv = [sys.executable, "-c", NAIVE, cam.url(), str(model), str(seconds + 5), str(MODEL_W), str(MODEL_H)]
    out = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=seconds + 120)
    rows = []
    for line in out.stdout.splitlines():
        *means, at = line.split()
        rows.append((frame_number([float(v) for v in means]), float(at)))
    if not rows:
        raise RuntimeError(f"the naive reader gave nothing: {out.stderr[-2000:]}")
    rows = rows[10:]
    return [r for r in rows if r[1] <= rows[0][1] + seconds]


def main() -> int:
    """Measure E then N on one stream; print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fps", type=int, default=25, help="the camera's frames/s")
    parser.add_argument("--model-ms", type=float, default=120.0, help="what one model run should take")
    parser.add_argument("--seconds", type=float, default=40.0, help="measured window per role")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    args = parser.parse_args()
    if not shutil.which("mosquitto") and not Path("/usr/sbin/mosquitto").exists():
        sys.exit("mosquitto is not installed: run scripts/setup dev")
    with tempfile.TemporaryDirectory(prefix="edged-bench-rtsplat-") as tmp:
        work = Path(tmp)
        model, ms = tune_model(work, args.model_ms)
        push_log = work / "pushes.log"
        cam = RtspCamera(work / "cam", fps=args.fps, push_log=push_log)
        write_frames(cam.frames)
        cam.start()
        clock = PushClock(push_log)
        try:
            arrivals, captures = run_edged(work, cam, model, args.seconds)
            edged = summary(clock.latencies(arrivals), args.seconds)
            edged["push_to_capture_p50_ms"] = round(statistics.median(v for _, v in clock.latencies(captures)))
            naive = summary(clock.latencies(run_naive(cam, model, args.seconds)), args.seconds)
        finally:
            cam.stop()
    figures = {
        "camera_fps": args.fps,
        "model_run_ms": round(ms),
        "seconds_per_role": args.seconds,
        "edged": edged,
        "naive": naive,
        "p50_naive_over_edged": round(naive["p50_ms"] / edged["p50_ms"], 1) if edged.get("p50_ms") else None,
    }
    if not args.json:
        print(__doc__.split("\n\n")[0])
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
