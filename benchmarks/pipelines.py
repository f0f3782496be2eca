"""Two pipelines on one daemon vs two separate daemons, on the same two videos: total frames/s and RSS.

Both layouts process video A and video B (default 300 frames each, 640x480, made by
scripts/make_bench_video.py with seeds 0 and 1) with the same int8 MobileNetV2-sized model (random
weights, scripts/make_bench_model.py) on the CPU provider, MQTT off, `stop_at_end: true`, `fps: 0` (each
file read at its model's pace):

one  `edged run` with two pipelines (a: video A, b: video B). edged shares the usable cores between
     its CPU pipelines (README, *Threads*), so each pipeline plans its runs within half of them.
two  two `edged run` processes started together, one pipeline each. Each daemon sees every core and
     plans for all of them, so together they run twice as many frames at once as there are cores.

Frames/s is the steady state read back from the spools: all results of the layout divided by the span
of their capture timestamps (first to last result of any pipeline), so process start, model load and
warm-up are excluded; the wall-clock rate including them is reported too. RSS is the peak resident set
(VmHWM, polled from /proc while the processes run): of the one daemon, or the sum of the two.
The layouts run interleaved `--repeat` times (default 3); medians are reported. A measurement, not a
test: it exits 0 whatever the figures are.

    python benchmarks/pipelines.py                  # builds bench-out/ model and videos when missing
    python benchmarks/pipelines.py --frames 200 --repeat 5 --json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

from pipeline import DEFAULT_OUT_DIR, load_script, read_vmhwm_kib  # noqa: E402

LAYOUTS = ("one", "two")
POLL_S = 0.02
PIPELINE = """\
  - name: {name}
    source: {{type: camera, uri: {video}, fps: 0, stop_at_end: true}}
    model: {{path: {model}, providers: [CPUExecutionProvider]}}
    postprocess: {{type: classify, top_k: 3}}
"""
HEADER = "device_id: {device}\nstate_dir: {state_dir}\nmqtt: {{enabled: false}}\npipelines:\n"


@dataclass
class Run:
    """One layout, one repetition."""

    layout: str
    repeat: int
    fps: float = 0.0
    wall_fps: float = 0.0
    rss_mib: float = 0.0
    rows: int = 0
    detail: dict[str, Any] = field(default_factory=dict)


def write_config(path: Path, state_dir: Path, pipelines: list[tuple[str, Path]], model: Path) -> Path:
    """A daemon config with the given (name, video) pipelines."""
    text = HEADER.format(device=path.stem, state_dir=json.dumps(str(state_dir)))
    for name, video in pipelines:
        text += PIPELINE.format(name=name, video=json.dumps(str(video)), model=json.dumps(str(model)))
    path.write_text(text, encoding="utf-8")
    return path


def run_together(configs: list[Path], logs: list[Path], timeout_s: float) -> tuple[list[int], list[int], float]:
    """Start one `edged run` per config at once; poll their peak RSS; (exit codes, peak KiB each, wall s)."""
    start = time.perf_counter()
    procs = []
    for cfg, log in zip(configs, logs, strict=True):
        with log.open("wb") as err:
            cmd = [sys.executable, "-m", "edged", "run", "--config", str(cfg)]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL))
    peaks = [0] * len(procs)
    while any(p.poll() is None for p in procs):
        for i, p in enumerate(procs):
            if p.poll() is None:
                peaks[i] = max(peaks[i], read_vmhwm_kib(p.pid))
        if time.perf_counter() - start > timeout_s:
            for p in procs:
                p.kill()
        time.sleep(POLL_S)
    return [int(p.returncode) for p in procs], peaks, time.perf_counter() - start


def spool_span(paths: list[Path]) -> tuple[int, float, float]:
    """Rows, min(ts), max(ts) over several spools."""
    rows, lo, hi = 0, float("inf"), float("-inf")
    for path in paths:
        conn = sqlite3.connect(path)
        try:
            n, a, b = conn.execute("SELECT COUNT(*), MIN(ts), MAX(ts) FROM results").fetchone()
        finally:
            conn.close()
        rows += int(n)
        lo, hi = min(lo, float(a)), max(hi, float(b))
    return rows, lo, hi


def run_layout(layout: str, repeat: int, args: argparse.Namespace, work: Path) -> Run:
    """Run one layout on both videos with fresh state dirs."""
    run_dir = work / f"{layout}{repeat}"
    run_dir.mkdir()
    pairs = [("a", args.videos[0]), ("b", args.videos[1])]
    groups = [pairs] if layout == "one" else [[pairs[0]], [pairs[1]]]
    configs, logs, spools = [], [], []
    for i, group in enumerate(groups):
        state = run_dir / f"state{i}"
        configs.append(write_config(run_dir / f"d{i}.yaml", state, group, args.model))
        logs.append(run_dir / f"d{i}.log")
        spools.append(state / "spool.db")
    codes, peaks, wall = run_together(configs, logs, timeout_s=120 + 2 * args.frames)
    if any(codes) or not all(s.exists() for s in spools):
        tail = "\n".join(logs[0].read_text(errors="replace").splitlines()[-10:])
        raise RuntimeError(f"layout {layout}: exit codes {codes}; log tail:\n{tail}")
    rows, lo, hi = spool_span(spools)
    return Run(
        layout,
        repeat,
        fps=rows / (hi - lo),
        wall_fps=rows / wall,
        rss_mib=sum(peaks) / 1024,
        rows=rows,
        detail={"peaks_mib": [p / 1024 for p in peaks], "wall_s": wall, "steady_s": hi - lo},
    )


def prepare_inputs(args: argparse.Namespace) -> None:
    """Build the model and the two videos into the output folder when they are missing."""
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if args.model is None:
        model_script = load_script("make_bench_model")
        args.model = args.out_dir / model_script.INT8_FILE
        if not args.model.exists():
            print(f"building {args.model} ...", file=sys.stderr)
            model_script.build(args.out_dir)
    video_script = load_script("make_bench_video")
    args.videos = []
    for seed in (0, 1):
        path = args.out_dir / f"bench-640x480-{args.frames}-seed{seed}.mp4"
        if not path.exists():
            print(f"writing {path} ...", file=sys.stderr)
            video_script.write_video(path, args.frames, (640, 480), seed=seed)
        args.videos.append(path.resolve())
    args.model = args.model.resolve()


def summarize(runs: list[Run], args: argparse.Namespace) -> dict[str, Any]:
    """Medians per layout."""
    medians: dict[str, dict[str, float]] = {}
    for layout in LAYOUTS:
        mine = [r for r in runs if r.layout == layout]
        medians[layout] = {
            "fps": statistics.median(r.fps for r in mine),
            "wall_fps": statistics.median(r.wall_fps for r in mine),
            "rss_mib": statistics.median(r.rss_mib for r in mine),
            "rows": statistics.median(r.rows for r in mine),
        }
    return {
        "frames_per_video": args.frames,
        "repeat": args.repeat,
        "cores": len(os.sched_getaffinity(0)),
        "model": str(args.model.name),
        "medians": medians,
        "runs": [r.__dict__ for r in runs],
    }


def print_table(summary: dict[str, Any]) -> None:
    """The comparison as a Markdown table."""
    m = summary["medians"]
    print(
        f"{summary['frames_per_video']} frames x 2 videos, {summary['model']}, {summary['cores']} cores, "
        f"median of {summary['repeat']}"
    )
    print("| layout | total frames/s (steady) | total frames/s (wall) | peak RSS MiB (sum) |")
    print("| --- | --- | --- | --- |")
    names = {"one": "one daemon, two pipelines", "two": "two daemons, one pipeline each"}
    for layout in LAYOUTS:
        r = m[layout]
        print(f"| {names[layout]} | {r['fps']:.1f} | {r['wall_fps']:.1f} | {r['rss_mib']:.1f} |")
    print(
        f"one/two: frames/s {m['one']['fps'] / m['two']['fps']:.2f}, "
        f"RSS {m['one']['rss_mib'] / m['two']['rss_mib']:.2f}"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frames", type=int, default=300, help="frames per video (default 300)")
    p.add_argument("--repeat", type=int, default=3, help="interleaved repetitions (default 3)")
    p.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR, help="model, videos, scratch")
    p.add_argument("--model", type=Path, help="an int8 model to use instead of the built one")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--keep", action="store_true", help="keep the scratch folder (logs, spools)")
    args = p.parse_args(argv)
    if args.frames < 2 or args.repeat < 1:
        p.error("need --frames >= 2 and --repeat >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    """Prepare, run the layouts interleaved, report."""
    args = parse_args(argv)
    prepare_inputs(args)
    work = Path(tempfile.mkdtemp(prefix="pipelines-", dir=args.out_dir))
    runs: list[Run] = []
    try:
        for repeat in range(args.repeat):
            for layout in LAYOUTS:
                print(f"run {repeat + 1}/{args.repeat} layout {layout} ...", file=sys.stderr)
                runs.append(run_layout(layout, repeat, args, work))
    finally:
        if args.keep:
            print(f"scratch kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    summary = summarize(runs, args)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_table(summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
