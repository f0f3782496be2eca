"""An RTSP camera's faults as an operator sees them, with edged's defaults (`stall_s` 5, `reconnect_max_s` 4):
how long a frozen stream looks healthy, and how long after a camera is back its frames flow again.

A real RTSP server (GStreamer's, tests/rtspcam.py) serves the sample video at 10 frames/s to `edged run`;
`edged status --json` is read every 0.1 s. Faults: the server frozen (SIGSTOP: its connection stays open,
no data) for 20 s, then thawed; the server gone for 30 s (the reconnect backoff grows), then back.
The camera sends Motion JPEG, H.264 or H.265 (x264enc / x265enc, a key frame a second, no B-frames), each
measured in turn. Needs `scripts/setup dev`. About 1.5 minutes per codec.

    .venv/bin/python benchmarks/rtsp.py [mjpeg] [h264] [h265]
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from conftest import base_config, make_tiny_model, write_config  # noqa: E402
from rtspcam import RtspCamera  # noqa: E402

from edged.core.errors import StatusError  # noqa: E402
from edged.ops.status import query  # noqa: E402


def until(check: Callable[[], bool], timeout: float) -> float:
    """Seconds until `check` holds (polled every 0.1 s)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if check():
            return time.monotonic() - started
        time.sleep(0.1)
    raise TimeoutError(f"not within {timeout} s")


def measure(codec: str) -> dict[str, float]:
    """The three figures for a camera sending `codec`."""
    with tempfile.TemporaryDirectory(prefix="edged-bench-rtsp-") as tmp:
        work = Path(tmp)
        cam = RtspCamera(work / "cam", codec=codec)
        cam.start()
        cfg = base_config(work, make_tiny_model(work / "tiny.onnx"), cam.url(), stop_at_end=False)
        for key in ("reconnect_min_s", "reconnect_max_s"):  # the defaults, not the tests' quick ones
            cfg["pipelines"][0]["source"].pop(key, None)
        config = write_config(work / "edged.yaml", cfg)
        daemon = subprocess.Popen([sys.executable, "-m", "edged", "run", "--config", str(config)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        sock = work / "state" / "status.sock"

        def status() -> dict[str, Any]:
            try:
                return query(sock, timeout=1.0)
            except StatusError:
                return {}

        def frames() -> int:
            snap = status()
            return int(snap["pipelines"][0]["frames"]) if snap else -1

        try:
            until(lambda: frames() > 30, 60)
            cam.freeze()
            frozen_running = until(lambda: status().get("state") == "degraded", 60)
            time.sleep(20 - frozen_running)
            seen = frames()
            cam.thaw()
            thaw_to_frames = until(lambda: frames() > seen + 5, 60)
            cam.stop()
            until(lambda: status().get("state") == "degraded", 60)
            time.sleep(30)
            seen = frames()
            cam.start()
            back_to_frames = until(lambda: frames() > seen + 5, 120)
        finally:
            daemon.terminate()
            daemon.wait(30)
            cam.stop()
    return {
        "frozen_stream_looked_healthy_s": round(frozen_running, 1),
        "thawed_stream_frames_again_after_s": round(thaw_to_frames, 1),
        "camera_back_after_30_s_away_frames_after_s": round(back_to_frames, 1),
    }


def main() -> int:
    """Run the faults for each codec named (default: all three), print the figures (JSON)."""
    codecs = sys.argv[1:] or ["mjpeg", "h264", "h265"]
    print(json.dumps({codec: measure(codec) for codec in codecs}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
