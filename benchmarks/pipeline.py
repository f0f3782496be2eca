"""End-to-end throughput and memory: the edged daemon against a bare session and a naive script.

Three roles process the same video (default 600 frames, 640x480) with the same int8 MobileNetV2-sized
model (random weights, built by scripts/make_bench_model.py) on the CPU execution provider:

C  ceiling: every frame is decoded and preprocessed first; only a bare `session.run` loop is timed,
   with ONNX Runtime's default threading (one run at a time, intra-op threads on every core).
P  parallel ceiling (a reference, no target): the same ready input, but run the way the daemon runs the
   CPU provider by default: one single-threaded `session.run` loop per core (at most 4) on a shared
   session. D can beat C (frame-level parallelism beats intra-op threads for such models); D/P shows
   what the daemon's own work (decode, preprocess, JSON, spool) costs on top of that strategy.
N  naive: the single-threaded script a user would write. VideoCapture.read -> preprocess ->
   session.run -> JSON message (softmax top-3) -> sqlite3 INSERT with Python's default settings and a
   commit per row. The whole loop is timed.
D  the daemon: `python -m edged run --config CFG` with MQTT off and `stop_at_end: true`. Frames/s is
   the steady state read back from its spool, (rows - 1) / (max(ts) - min(ts)) over the capture
   timestamps, so process start, model load and warm-up are excluded; the wall-clock rate including
   all of that is reported too.

Each role runs in its own process, so its peak RSS is its own: the parent polls the child's
/proc/<pid>/status VmHWM while it runs, and C and N also report their own VmHWM just before they
exit; the larger wins. (Not ru_maxrss: Linux seeds a child's maxrss with the parent's at fork/exec,
so a parent that has just quantized a model would inflate every child.) C holds all preprocessed
inputs in memory (600 x 3 x 224 x 224 float32 = 361 MB by default), which says nothing about the
session's footprint, so C's RSS is reported without that buffer (the raw figure is in the JSON) and
RSS(D) / RSS(C) compares against the bare session.

The roles run interleaved, C P N D C P N D ..., `--repeat` times (default 3), and the median per role is
reported, which tames a noisy shared machine. Targets: D >= 0.9 x C, D >= 1.1 x N,
RSS(D) <= 1.5 x RSS(C). This is a measurement, not a test: it exits 0 whatever the figures are, and
non-zero only when C or N crashed. When the daemon cannot run, D is skipped with the reason.

    python benchmarks/pipeline.py                 # builds bench-out/ models and video when missing
    python benchmarks/pipeline.py --frames 300 --repeat 5 --json
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPTS_DIR = REPO_ROOT / "scripts"
DEFAULT_OUT_DIR = REPO_ROOT / "bench-out"
ROLES = ("C", "P", "N", "D")
ROLE_NAMES = {
    "C": "ceiling: session.run on ready input",
    "P": "parallel ceiling: 1 run per core",
    "N": "naive single-threaded script",
    "D": "edged run (steady state)",
}
TOP_K = 3
POLL_S = 0.02
WARMUP_RUNS = 2  # as the daemon's default model.warmup_runs
NOISY_CPUS = 0.25  # other tenants' CPU use (in CPUs) above which the report warns
DAEMON_CONFIG = """\
device_id: bench
state_dir: {state_dir}
mqtt: {{enabled: false}}
pipelines:
  - name: bench
    source: {{type: camera, uri: {video}, fps: 0, stop_at_end: true}}
    model: {{path: {model}, providers: [CPUExecutionProvider]}}
    postprocess: {{type: classify, top_k: {top_k}}}
"""


# --------------------------------------------------------------------------- shared helpers


def load_script(name: str) -> ModuleType:
    """Import scripts/<name>.py (the scripts folder is not a package)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS_DIR / f"{name}.py")
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {SCRIPTS_DIR / name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


def read_vmhwm_kib(pid: int | str = "self") -> int:
    """Peak resident set (VmHWM) of a live process in KiB; 0 when it has gone or is a zombie."""
    try:
        text = Path(f"/proc/{pid}/status").read_text(encoding="ascii")
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def make_session(model: Path, threads: int = 0) -> Any:
    """An ORT CPU session: ORT-chosen threads (or `threads`), ORT_ENABLE_ALL."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 0
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(model), sess_options=opts, providers=["CPUExecutionProvider"])


def make_preprocessor(session: Any) -> Any:
    """edged's Preprocessor, resolved from the model's metadata and input, as the daemon does it."""
    from edged.model.preprocess import Preprocessor, PreprocessSpec

    inp = session.get_inputs()[0]
    meta = dict(session.get_modelmeta().custom_metadata_map)
    return Preprocessor(PreprocessSpec.resolve(None, meta, list(inp.shape), inp.type))


# --------------------------------------------------------------------------- role C (in a child)


def role_ceiling(model: Path, video: Path, frames: int, *, parallel: bool = False) -> dict[str, Any]:
    """Decode and preprocess every frame up front, then time only the session.run loop(s)."""
    import threading

    import cv2
    import numpy as np

    loops = max(1, min(len(os.sched_getaffinity(0)), 4)) if parallel else 1
    session = make_session(model, threads=1 if parallel else 0)
    preprocess = make_preprocessor(session)
    name = session.get_inputs()[0].name
    output = session.get_outputs()[0].name
    spec = preprocess.spec
    inputs = np.empty((frames, *spec.tensor_shape[1:]), dtype=np.dtype(spec.dtype))
    cap = cv2.VideoCapture(str(video))
    try:
        for i in range(frames):
            ok, frame = cap.read()
            if not ok:
                raise RuntimeError(f"{video} ended after {i} frames; {frames} were asked for")
            inputs[i] = preprocess(frame)[0]
    finally:
        cap.release()
    for i in range(WARMUP_RUNS):
        session.run([output], {name: inputs[i : i + 1]})

    def loop(first: int) -> None:
        for i in range(first, frames, loops):
            session.run([output], {name: inputs[i : i + 1]})

    workers = [threading.Thread(target=loop, args=(k,), name=f"bench-run-{k}") for k in range(loops)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    seconds = time.perf_counter() - start
    return {
        "frames": frames,
        "seconds": seconds,
        "fps": frames / seconds,
        "infer_ms": 1000.0 * seconds / frames * loops,
        "loops": loops,
        "input_bytes": int(inputs.nbytes),
        "self_vmhwm_kib": read_vmhwm_kib(),
    }


# --------------------------------------------------------------------------- role N (in a child)


def role_naive(model: Path, video: Path, frames: int, workdir: Path) -> dict[str, Any]:
    """The straightforward script: read, preprocess, infer, JSON, INSERT + commit, one frame at a time."""
    import cv2
    import numpy as np

    session = make_session(model)
    preprocess = make_preprocessor(session)
    name = session.get_inputs()[0].name
    meta = dict(session.get_modelmeta().custom_metadata_map)
    model_info = {
        "name": meta.get("edged.name", model.stem),
        "sha256": hashlib.sha256(model.read_bytes()).hexdigest(),
    }
    db_path = workdir / "naive.db"
    db_path.unlink(missing_ok=True)
    conn = sqlite3.connect(db_path)  # Python's defaults: rollback journal, synchronous=FULL
    conn.execute("CREATE TABLE results (seq INTEGER PRIMARY KEY, ts REAL NOT NULL, payload TEXT NOT NULL)")
    conn.commit()
    start = time.perf_counter()
    cap = cv2.VideoCapture(str(video))
    seq = 0
    while seq < frames:
        ok, frame = cap.read()
        if not ok:
            break
        ts = time.time()
        t0 = time.perf_counter()
        x = preprocess(frame)
        t1 = time.perf_counter()
        logits = session.run(None, {name: x})[0][0]
        t2 = time.perf_counter()
        e = np.exp(logits - logits.max())
        probs = e / e.sum()
        top = np.argsort(probs)[::-1][:TOP_K]
        t3 = time.perf_counter()
        seq += 1
        message = {
            "v": 1,
            "device": "bench",
            "pipeline": "bench",
            "seq": seq,
            "ts": ts,
            "model": model_info,
            "provider": "CPUExecutionProvider",
            "latency_ms": {
                "pre": round((t1 - t0) * 1000, 3),
                "infer": round((t2 - t1) * 1000, 3),
                "post": round((t3 - t2) * 1000, 3),
            },
            "result": {"top": [{"index": int(i), "label": str(int(i)), "score": float(probs[i])} for i in top]},
        }
        conn.execute("INSERT INTO results (seq, ts, payload) VALUES (?, ?, ?)", (seq, ts, json.dumps(message)))
        conn.commit()
    cap.release()
    seconds = time.perf_counter() - start
    conn.close()
    if seq != frames:
        raise RuntimeError(f"{video} ended after {seq} frames; {frames} were asked for")
    return {"frames": seq, "seconds": seconds, "fps": seq / seconds, "self_vmhwm_kib": read_vmhwm_kib()}


# --------------------------------------------------------------------------- the parent


@dataclass
class Watched:
    """How a child process ended and how much memory it held at most."""

    returncode: int
    peak_rss_kib: int
    wall_s: float
    timed_out: bool
    cpu_s: float  # user + system time of the child
    other_cpus: float  # CPUs busy with anything else meanwhile (other tenants, steal): noise


def busy_cpu_seconds() -> float:
    """CPU seconds the whole machine has been busy (all CPUs, incl. hypervisor steal), from /proc/stat."""
    fields = Path("/proc/stat").read_text(encoding="ascii").splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


@dataclass
class RunResult:
    """One role, one repetition."""

    role: str
    repeat: int
    ok: bool
    fps: float = 0.0
    rss_mib: float = 0.0
    frames: int = 0
    detail: dict[str, Any] = field(default_factory=dict)


def watch(cmd: list[str], stdout_path: Path, stderr_path: Path, timeout_s: float) -> Watched:
    """Run cmd, poll its VmHWM until it exits, reap it with wait4 (for its CPU time)."""
    start = time.perf_counter()
    busy0, self0 = busy_cpu_seconds(), time.process_time()
    with stdout_path.open("wb") as out, stderr_path.open("wb") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
    polled = 0
    timed_out = False
    start_kill = 0.0
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            break
        polled = max(polled, read_vmhwm_kib(proc.pid))
        if not timed_out and time.perf_counter() - start > timeout_s:
            timed_out = True
            proc.send_signal(signal.SIGTERM)
            start_kill = time.perf_counter()
        if timed_out and time.perf_counter() - start_kill > 10.0:
            proc.kill()
        time.sleep(POLL_S)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here; tell Popen
    wall = time.perf_counter() - start
    cpu = usage.ru_utime + usage.ru_stime
    other = busy_cpu_seconds() - busy0 - cpu - (time.process_time() - self0)
    return Watched(proc.returncode, polled, wall, timed_out, cpu, max(0.0, other) / wall)


def _tail(path: Path, lines: int = 15) -> str:
    text = path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""
    return "\n".join(text.strip().splitlines()[-lines:])


def run_child_role(role: str, repeat: int, args: argparse.Namespace, work: Path) -> RunResult:
    """Run role C or N in a child process of this script and collect what it reports."""
    out, err = work / f"{role}{repeat}.out", work / f"{role}{repeat}.err"
    cmd = [
        sys.executable, str(Path(__file__).resolve()), "--role", role,
        "--model", str(args.model), "--video", str(args.video),
        "--frames", str(args.frames), "--workdir", str(work),
    ]  # fmt: skip
    watched = watch(cmd, out, err, timeout_s=120 + args.frames)
    if watched.returncode != 0:
        raise RuntimeError(f"role {role} failed (exit {watched.returncode}):\n{_tail(err)}")
    report = json.loads(out.read_text(encoding="utf-8").strip().splitlines()[-1])
    rss_kib = max(watched.peak_rss_kib, report["self_vmhwm_kib"])
    report |= {"peak_rss_raw_mib": rss_kib / 1024, "cpu_s": watched.cpu_s, "other_cpus": watched.other_cpus}
    if role in ("C", "P"):
        rss_kib -= report["input_bytes"] // 1024  # the preprocessed-input buffer is not the session
    return RunResult(role, repeat, True, report["fps"], rss_kib / 1024, report["frames"], report)


def read_spool(path: Path) -> tuple[int, float, float]:
    """Rows, min(ts), max(ts) of the daemon's spool."""
    conn = sqlite3.connect(path)
    try:
        rows, lo, hi = conn.execute("SELECT COUNT(*), MIN(ts), MAX(ts) FROM results").fetchone()
    finally:
        conn.close()
    return int(rows), float(lo or 0.0), float(hi or 0.0)


def run_daemon(repeat: int, args: argparse.Namespace, work: Path) -> RunResult:
    """Run `python -m edged run` on the video with a fresh state dir; throughput from its spool."""
    run_dir = work / f"D{repeat}"
    state_dir = run_dir / "state"
    run_dir.mkdir()
    cfg = run_dir / "edged.yaml"
    cfg.write_text(
        DAEMON_CONFIG.format(
            state_dir=json.dumps(str(state_dir)),
            video=json.dumps(str(args.video)),
            model=json.dumps(str(args.model)),
            top_k=TOP_K,
        ),
        encoding="utf-8",
    )
    cmd = [sys.executable, "-m", "edged", "run", "--config", str(cfg)]
    err = run_dir / "daemon.log"
    watched = watch(cmd, run_dir / "daemon.out", err, timeout_s=120 + args.frames)
    detail: dict[str, Any] = {
        "wall_s": watched.wall_s,
        "returncode": watched.returncode,
        "cpu_s": watched.cpu_s,
        "other_cpus": watched.other_cpus,
    }
    spool = state_dir / "spool.db"
    if watched.timed_out or watched.returncode != 0 or not spool.exists():
        why = "did not stop at the end of the video" if watched.timed_out else f"exit {watched.returncode}"
        if watched.returncode == 0 and not spool.exists():
            why = f"no spool at {spool}"
        detail["error"] = f"`edged run` {why}; log tail:\n{_tail(err)}"
        return RunResult("D", repeat, False, detail=detail)
    rows, lo, hi = read_spool(spool)
    if rows < 2 or hi <= lo:
        detail["error"] = f"spool has {rows} rows, too few to time; log tail:\n{_tail(err)}"
        return RunResult("D", repeat, False, frames=rows, detail=detail)
    detail |= {"rows": rows, "steady_s": hi - lo, "wall_fps": rows / watched.wall_s}
    if rows != args.frames:
        detail["warning"] = f"spool holds {rows} results for {args.frames} frames"
    return RunResult("D", repeat, True, (rows - 1) / (hi - lo), watched.peak_rss_kib / 1024, rows, detail)


def prepare_inputs(args: argparse.Namespace) -> None:
    """Build the model and the video into the output folder when they are missing."""
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if args.model is None:
        model_script = load_script("make_bench_model")
        args.model = args.out_dir / model_script.INT8_FILE
        if not args.model.exists():
            print(f"building {args.model} ...", file=sys.stderr)
            model_script.build(args.out_dir)
    w, h = args.size
    args.video = args.out_dir / f"bench-{w}x{h}-{args.frames}.mp4"
    if not args.video.exists():
        print(f"writing {args.video} ...", file=sys.stderr)
        load_script("make_bench_video").write_video(args.video, args.frames, (w, h))
    args.model = args.model.resolve()
    args.video = args.video.resolve()


def run_all(args: argparse.Namespace, work: Path) -> list[RunResult]:
    """The roles interleaved, `repeat` times. A daemon that cannot run is skipped after its first failure."""
    results: list[RunResult] = []
    daemon_broken = False
    for repeat in range(args.repeat):
        for role in args.roles:
            if role == "D" and daemon_broken:
                continue
            print(f"run {repeat + 1}/{args.repeat} role {role} ...", file=sys.stderr)
            result = run_daemon(repeat, args, work) if role == "D" else run_child_role(role, repeat, args, work)
            if not result.ok:
                daemon_broken = True
                print(f"SKIP D: {result.detail['error']}", file=sys.stderr)
            elif "warning" in result.detail:
                print(f"warning: D {result.detail['warning']}", file=sys.stderr)
            results.append(result)
    return results


def summarize(args: argparse.Namespace, results: list[RunResult]) -> dict[str, Any]:
    """Medians per role and the three target checks."""
    import onnxruntime as ort

    medians: dict[str, dict[str, Any]] = {}
    for role in args.roles:
        runs = [r for r in results if r.role == role and r.ok]
        if not runs:
            failed = [r for r in results if r.role == role]
            medians[role] = {"skipped": failed[0].detail.get("error", "not run") if failed else "not run"}
            continue
        med: dict[str, Any] = {
            "fps": statistics.median(r.fps for r in runs),
            "rss_mib": statistics.median(r.rss_mib for r in runs),
            "runs": len(runs),
        }
        if role in ("C", "P"):
            med["infer_ms"] = statistics.median(r.detail["infer_ms"] for r in runs)
            med["input_buffer_mib"] = runs[0].detail["input_bytes"] / 2**20
        if role == "D":
            med["wall_fps"] = statistics.median(r.detail["wall_fps"] for r in runs)
        medians[role] = med
    other = [r.detail["other_cpus"] for r in results if "other_cpus" in r.detail]
    return {
        "model": str(args.model),
        "video": str(args.video),
        "frames": args.frames,
        "size": list(args.size),
        "repeat": args.repeat,
        "onnxruntime": ort.__version__,
        "cpus": os.cpu_count(),
        "other_load_cpus": {"median": statistics.median(other), "max": max(other)} if other else None,
        "median": medians,
        "checks": checks(medians),
        "runs": [asdict(r) for r in results],
    }


def checks(medians: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """D >= 0.9 C, D >= 1.1 N, RSS(D) <= 1.5 RSS(C); SKIP where a side is missing."""
    specs = [
        ("D/C frames/s", "D", "C", "fps", ">=", 0.9),
        ("D/N frames/s", "D", "N", "fps", ">=", 1.1),
        ("RSS(D)/RSS(C)", "D", "C", "rss_mib", "<=", 1.5),
        ("D/P frames/s", "D", "P", "fps", "info", None),
    ]
    out = []
    for label, a, b, key, op, target in specs:
        va, vb = medians.get(a, {}).get(key), medians.get(b, {}).get(key)
        if va is None or vb is None or vb == 0:
            out.append({"check": label, "ratio": None, "op": op, "target": target, "result": "SKIP"})
            continue
        ratio = va / vb
        if target is None:
            out.append({"check": label, "ratio": ratio, "op": op, "target": "", "result": "(reference)"})
            continue
        ok = ratio >= target if op == ">=" else ratio <= target
        out.append({"check": label, "ratio": ratio, "op": op, "target": target, "result": "PASS" if ok else "FAIL"})
    return out


def print_table(summary: dict[str, Any]) -> None:
    """The human-readable report."""
    w, h = summary["size"]
    print(
        f"edged pipeline benchmark: {Path(summary['model']).name}, {summary['frames']} frames {w}x{h}, "
        f"median of {summary['repeat']}, onnxruntime {summary['onnxruntime']}, {summary['cpus']} CPUs"
    )
    print(f"{'role':<5}{'what':<38}{'frames/s':>10}{'peak RSS MiB':>14}")
    for role, med in summary["median"].items():
        if "skipped" in med:
            print(f"{role:<5}{ROLE_NAMES[role]:<38}{'skipped':>10}{'-':>14}")
            continue
        note = ""
        if role in ("C", "P"):
            note = f"  (+{med['input_buffer_mib']:.0f} input buffer; {med['infer_ms']:.2f} ms/run)"
        if role == "D":
            note = f"  (wall clock incl. startup: {med['wall_fps']:.1f} frames/s)"
        print(f"{role:<5}{ROLE_NAMES[role]:<38}{med['fps']:>10.1f}{med['rss_mib']:>14.1f}{note}")
    print()
    print(f"{'check':<16}{'value':>8}  {'target':<9}result")
    for c in summary["checks"]:
        value = "-" if c["ratio"] is None else f"{c['ratio']:.2f}"
        print(f"{c['check']:<16}{value:>8}  {c['op']} {c['target']:<6}{c['result']}")
    print_noise(summary)
    for role, med in summary["median"].items():
        if "skipped" in med:
            print(f"\n{role} skipped: {med['skipped']}")


def print_noise(summary: dict[str, Any]) -> None:
    """Each run's frames/s next to the CPU other processes used meanwhile, and a warning when busy."""
    load = summary["other_load_cpus"]
    if load is None:
        return
    print("\nper run: frames/s [CPUs used by other processes meanwhile]")
    for repeat in range(summary["repeat"]):
        cells = [
            f"{r['role']} {r['fps']:6.1f} [{r['detail']['other_cpus']:.2f}]" if r["ok"] else f"{r['role']} failed"
            for r in summary["runs"]
            if r["repeat"] == repeat
        ]
        if cells:
            print(f"  {repeat + 1}: " + "   ".join(cells))
    if load["max"] > NOISY_CPUS:
        print(
            f"warning: other processes kept up to {load['max']:.2f} of {summary['cpus']} CPUs busy; "
            "the figures are noisy, run again on an idle machine"
        )


def _parse_size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"size must look like 640x480, got {text!r}") from exc
    return w, h


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line (the --role/--workdir/--video options are for the child processes)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frames", type=int, default=600, help="frames per role and run (default 600)")
    p.add_argument("--repeat", type=int, default=3, help="interleaved repetitions (default 3)")
    p.add_argument("--size", type=_parse_size, default=(640, 480), help="video WIDTHxHEIGHT")
    p.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR, help="models, video, scratch")
    p.add_argument("--model", type=Path, help="an int8 model to use instead of the built one")
    p.add_argument("--roles", default="CPND", help="which roles to run, e.g. CN (default CPND)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--keep", action="store_true", help="keep the scratch folder (logs, spools)")
    p.add_argument("--role", choices=("C", "P", "N"), help=argparse.SUPPRESS)
    p.add_argument("--video", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.roles = [r for r in ROLES if r in args.roles.upper()]
    if args.frames < 2 or args.repeat < 1 or not args.roles:
        p.error("need --frames >= 2, --repeat >= 1 and at least one of C, P, N, D in --roles")
    return args


def main(argv: list[str] | None = None) -> int:
    """Parent: prepare, run the roles, report. Child (--role): run one role, print its JSON line."""
    args = parse_args(argv)
    if args.role in ("C", "P"):
        print(json.dumps(role_ceiling(args.model, args.video, args.frames, parallel=args.role == "P")))
        return 0
    if args.role == "N":
        print(json.dumps(role_naive(args.model, args.video, args.frames, args.workdir)))
        return 0
    prepare_inputs(args)
    work = Path(tempfile.mkdtemp(prefix="run-", dir=args.out_dir))  # same disk as a real state_dir
    try:
        summary = summarize(args, run_all(args, work))
    finally:
        if args.keep:
            print(f"scratch kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_table(summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
