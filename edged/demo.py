"""`edged demo`: the bundled digits model on the bundled sample video, state in a local folder."""

from __future__ import annotations

import csv
import logging
import sys
from importlib.resources import files
from pathlib import Path
from typing import Any, TextIO

from edged.config import Config, config_from_dict
from edged.daemon import Daemon, run_daemon

log = logging.getLogger(__name__)


def asset(name: str) -> Path:
    """Path of a file shipped in edged/assets."""
    return Path(str(files("edged") / "assets" / name))


def demo_config(state_dir: Path, host: str, port: int, fps: float | None, loop: bool) -> Config:
    """The embedded default config: one pipeline, bundled model and video, broker on host:port."""
    return config_from_dict(
        {
            "device_id": "demo",
            "state_dir": str(state_dir.resolve()),
            "mqtt": {"host": host, "port": port, "shutdown_grace_s": 3.0},
            "pipelines": [
                {
                    "name": "demo",
                    "source": {
                        "type": "camera",
                        "uri": str(asset("sample.mp4")),
                        "fps": 10.0 if fps is None else fps,
                        "loop": loop,
                        "stop_at_end": not loop,
                    },
                    "model": {"path": str(asset("digits.int8.onnx"))},
                    "postprocess": {"type": "classify", "top_k": 3},
                }
            ],
        },
        source="edged demo",
    )


def load_truth() -> dict[int, str]:
    """frame index -> true digit, from the video's sidecar file."""
    with asset("sample.labels.csv").open(encoding="utf-8") as fh:
        return {int(row["frame"]): row["label"] for row in csv.DictReader(fh)}


class Printer:
    """Prints one line per result and keeps score against the sidecar labels."""

    def __init__(self, truth: dict[int, str], out: TextIO, quiet: bool) -> None:
        self.truth = truth
        self.out = out
        self.quiet = quiet
        self.seen = 0
        self.correct = 0

    def __call__(self, msg: dict[str, Any]) -> None:
        """The daemon's result hook."""
        best = msg["result"]["top"][0]
        want = self.truth.get(msg["frame"])
        self.seen += 1
        self.correct += int(best["label"] == want)
        if not self.quiet:
            mark = "" if want is None else ("  ok" if best["label"] == want else f"  MISS (true {want})")
            lat = msg["latency_ms"]
            print(
                f"seq {msg['seq']:>5}  frame {msg['frame']:>4}  -> {best['label']} ({best['score']:.2f})"
                f"  {lat['pre'] + lat['infer'] + lat['post']:.1f} ms{mark}",
                file=self.out,
                flush=True,
            )


def run_demo(*, state_dir: Path, host: str, port: int, fps: float | None, loop: bool, quiet: bool) -> int:
    """Run the demo to the end of the video (or until Ctrl-C with --loop) and print a summary."""
    config = demo_config(state_dir, host, port, fps, loop)
    printer = Printer(load_truth(), sys.stdout, quiet)
    daemon = Daemon(config, on_result=printer)
    print(
        f"edged demo: {asset('sample.mp4').name} -> {asset('digits.int8.onnx').name}, "
        f"state in {config.state_dir}, broker {host}:{port}\n"
        f"  in another shell: edged status --socket {config.status_socket}",
        flush=True,
    )
    code = run_daemon(daemon)
    snap_mqtt = daemon.mqtt_stats.snapshot()
    accuracy = printer.correct / printer.seen if printer.seen else 0.0
    print(f"\n{printer.seen} frames, top-1 accuracy {accuracy:.1%} against the video's labels")
    print(f"published {snap_mqtt['published']} result(s) to {host}:{port}")
    left = daemon.left_in_spool
    if left:
        print(f"{left} result(s) wait in {config.state_dir / 'spool.db'}; they go out when a broker answers")
    return code
