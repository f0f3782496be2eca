"""Costs that could grow with the backlog (issue "Publish at the speed of the edge"): a 1,000,000-result spool.

One run, side by side (ratios; this machine is shared and noisy):

1. TTL expiry. A spool of `--rows` results (default 1,000,000, ~460-byte payloads shaped like the
   daemon's, filled once with `edged.store.spool.Spool` and copied fresh for every round) under
   `python -m edged run` flat out (mqtt off, the bundled digits model on the bundled video read at the
   model's pace): results/s over `--seconds`, with `spool.max_age` set so that the oldest rows expire all
   through the round (E) and with no expiry (N). The backlog's spool clock is that of a daemon that
   wrote it at `--fill-rate` results/s, so rows expire at about the rate new ones come (a TTL's steady
   state). `--rounds` interleaved rounds (E N E N ...), medians.
   Target: E/N >= 0.9. The same for the spool alone (`append` + commit in a child process, no model,
   `--append` results: the writer is then the bottleneck), reported beside it.
2. Start-up to READY. `python -m edged run` (mqtt off, one pipeline on the bundled video) on a copy of
   that spool: seconds from exec to `READY=1` on a NOTIFY_SOCKET this script listens on; after a clean
   stop (the large clean file is checked in the background while results flow) and after a `kill -9`
   (an unclean file is checked before start), beside the same on a 10,000-result spool.
   Target: <= 5 s on the large spool (or publishing starts while the check proceeds).

A measurement, not a test: exit 0 whatever the figures are. Needs ~3 GB free in --work (default a temp
dir) for 1,000,000 rows.

    python benchmarks/backlog.py                      # ~5 min
    python benchmarks/backlog.py --rows 100000 --append 20000 --rounds 1
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
ASSETS = REPO_ROOT / "edged" / "assets"
TOPIC = "edged/bench/cam0/results"
BIG_BYTES = 8 * 2**30  # max_bytes: the bound must not evict (eviction is a different cost)


def make_payload(seq: int, rng: random.Random) -> bytes:
    body = {
        "v": 1, "device": "bench", "pipeline": "cam0", "seq": seq, "ts": round(time.time(), 3), "frame": seq,
        "model": {"name": "digits", "sha256": f"{rng.getrandbits(256):064x}"},
        "provider": "CPUExecutionProvider",
        "latency_ms": {"pre": round(rng.random(), 3), "infer": round(rng.random() * 4, 3), "post": 0.05},
        "result": {"top": [{"index": rng.randrange(10), "label": str(rng.randrange(10)), "score": rng.random()}
                           for _ in range(3)]},
    }  # fmt: skip
    return json.dumps(body, separators=(",", ":")).encode()


def spool(path: Path, max_age_s: float) -> Any:
    from edged.store.settings import SpoolConfig
    from edged.store.spool import Spool

    return Spool(path, SpoolConfig(max_bytes=BIG_BYTES, max_age=max_age_s))


def fill(path: Path, n: int, rate: float) -> dict[str, float]:
    """n results into a new spool (closed cleanly), written as a daemon producing `rate` results/s would
    have written them: each row's spool clock 1/rate after the previous one (the spool is filled far
    faster than that; the clock is what TTL expiry looks at). Returns the spool clock at the end."""
    rng = random.Random(7)
    s = spool(path, 365 * 86400.0)
    written = [0]
    base = s.clock()
    s.clock = lambda: base + written[0] / rate  # the synthetic history
    s.start()
    t0 = time.perf_counter()
    try:
        for _ in range(n):
            written[0] += 1
            seq = s.next_seq("cam0")
            s.append("cam0", seq, time.time(), TOPIC, make_payload(seq, rng))
        if not s.flush(600):
            raise RuntimeError("flush timed out")
        clock = s.clock()
    finally:
        s.close()
    return {"rows": n, "seconds": time.perf_counter() - t0, "clock": clock}


def cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def child_append(db: Path, n: int, max_age_s: float) -> dict[str, Any]:
    """(child) n results appended flat out and committed; results/s, CPU ms per result, rows expired."""
    rng = random.Random(11)
    payloads = [make_payload(i, rng) for i in range(1000)]
    s = spool(db, max_age_s)
    s.start()
    expired0 = int(s.stats().get("dropped_by_reason", {}).get("expired", 0))
    c0, t0 = cpu_s(), time.perf_counter()
    for i in range(n):
        seq = s.next_seq("cam0")
        s.append("cam0", seq, time.time(), TOPIC, payloads[i % 1000])
    if not s.flush(600):
        raise RuntimeError("flush timed out")
    seconds, cpu = time.perf_counter() - t0, cpu_s() - c0
    expired = int(s.stats().get("dropped_by_reason", {}).get("expired", 0)) - expired0
    s.close()
    return {"results_s": n / seconds, "cpu_ms_per_result": cpu / n * 1e3, "expired": expired, "seconds": seconds}


def run_child(db: Path, n: int, max_age_s: float) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(db), str(n), repr(max_age_s)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def copy_spool(src: Path, dst_dir: Path) -> Path:
    if dst_dir.exists():
        shutil.rmtree(dst_dir)
    dst_dir.mkdir(parents=True)
    for f in src.parent.iterdir():
        if f.name.startswith(src.name) and not f.name.endswith(".ballast"):
            shutil.copy(f, dst_dir / f.name)
    return dst_dir / src.name


def part_expiry(pristine: Path, clock: float, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    # the oldest rows are a little older than max_age at the start, and as many cross it every second as
    # the daemon that wrote them produced: the steady state of a TTL
    max_age = max(1.0, clock - 2.0)
    out: dict[str, Any] = {"max_age_s": max_age}
    for kind, measure in (("daemon", daemon_round), ("spool", spool_round)):
        rounds: dict[str, list[dict[str, Any]]] = {"expiry": [], "none": []}
        for r in range(args.rounds):
            for role, age in (("expiry", max_age), ("none", 365 * 86400.0)):
                db = copy_spool(pristine, work / f"round-{kind}-{role}")
                res = measure(db, age, args)
                rounds[role].append(res)
                print(
                    f"   {kind:6} round {r + 1} {role:6}: {res['results_s']:8.0f} results/s, "
                    f"{res['cpu_ms_per_result']:.3f} ms CPU/result, {res['expired']} expired",
                    flush=True,
                )
        med = {k: statistics.median(x["results_s"] for x in v) for k, v in rounds.items()}
        out[kind] = {"rounds": rounds, "median": med, "ratio": med["expiry"] / med["none"]}
    return out


def spool_round(db: Path, max_age_s: float, args: argparse.Namespace) -> dict[str, Any]:
    return run_child(db, args.append, max_age_s)


def daemon_config(state: Path, *, fps: int, max_age_s: float | None = None) -> Path:
    import yaml

    spool_cfg: dict[str, Any] = {"max_bytes": BIG_BYTES}
    if max_age_s is not None:
        spool_cfg["max_age"] = max_age_s
    body = {
        "device_id": "bench", "state_dir": str(state), "mqtt": {"enabled": False}, "spool": spool_cfg,
        "pipelines": [{
            "name": "cam0",
            "source": {"type": "camera", "uri": str(ASSETS / "sample.mp4"), "fps": fps, "loop": True},
            "model": {"path": str(ASSETS / "digits.int8.onnx"), "providers": ["CPUExecutionProvider"]},
        }],
    }  # fmt: skip
    cfg = state / "edged.yaml"
    cfg.write_text(yaml.safe_dump(body), encoding="utf-8")
    return cfg


def daemon_status(state: Path) -> dict[str, Any] | None:
    from edged.core.errors import StatusError
    from edged.ops.status import query

    try:
        return query(state / "status.sock", timeout=2.0)
    except (StatusError, OSError):
        return None


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8").rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def daemon_round(db: Path, max_age_s: float, args: argparse.Namespace) -> dict[str, Any]:
    """`edged run` flat out on the spool in db's folder: results/s over args.seconds after a warm-up."""
    state = db.parent
    cfg = daemon_config(state, fps=0, max_age_s=max_age_s)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc, _ = start_ready(cfg, state, env)
    try:

        def frames() -> tuple[int, int]:
            snap = daemon_status(state) or {}
            pipes = snap.get("pipelines") or [{}]
            dropped = (snap.get("spool") or {}).get("dropped_by_reason", {}).get("expired", 0)
            return int(pipes[0].get("frames", 0)), int(dropped)

        deadline = time.monotonic() + 120
        while frames()[0] < 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        (f0, e0), c0, t0 = frames(), proc_cpu_s(proc.pid), time.perf_counter()
        time.sleep(args.seconds)
        (f1, e1), c1, t1 = frames(), proc_cpu_s(proc.pid), time.perf_counter()
    finally:
        proc.terminate()
        proc.wait(120)
    n = max(1, f1 - f0)
    return {"results_s": n / (t1 - t0), "cpu_ms_per_result": (c1 - c0) / n * 1e3, "expired": e1 - e0}


def ready_seconds(state: Path, port_cfg: Path, *, kill9_first: bool) -> float:
    """exec -> READY=1 of `edged run` on the spool in `state`; with kill9_first, after one killed run."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    if kill9_first:
        proc, _ = start_ready(port_cfg, state, env)
        proc.kill()
        proc.wait(30)
    proc, seconds = start_ready(port_cfg, state, env)
    proc.terminate()
    proc.wait(120)
    return seconds


def start_ready(cfg: Path, state: Path, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], float]:
    sock_path = state / "notify.sock"
    sock_path.unlink(missing_ok=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(sock_path))
        sock.settimeout(300)
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "edged", "run", "--config", str(cfg)],
            env={**env, "NOTIFY_SOCKET": str(sock_path)},
            stdout=subprocess.DEVNULL, stderr=(state / "daemon.log").open("ab"),
        )  # fmt: skip
        while True:
            msg = sock.recv(4096).decode(errors="replace")
            if "READY=1" in msg.split("\n"):
                return proc, time.perf_counter() - t0


def part_startup(pristine: Path, small: Path, work: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, src in (("small", small), ("large", pristine)):
        for kill9 in (False, True):
            state = work / f"state-{name}-{'kill9' if kill9 else 'clean'}"
            copy_spool(src, state)
            cfg = daemon_config(state, fps=5)
            key = f"{name}_{'after_kill9' if kill9 else 'after_clean_stop'}"
            out[key] = ready_seconds(state, cfg, kill9_first=kill9)
            print(f"   start-up to READY, {name} spool, {key.split('_', 1)[1]}: {out[key]:.2f} s", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=1_000_000, help="results in the backlog")
    parser.add_argument("--append", type=int, default=30_000, help="results appended per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--fill-rate", type=float, default=2500.0, help="results/s of the daemon that wrote the backlog (its clock)"
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per daemon round")
    parser.add_argument("--work", type=Path, default=None, help="where the spools go (default: a temp dir)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", nargs=3, metavar=("DB", "N", "MAX_AGE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        db, n, age = args.child
        print(json.dumps(child_append(Path(db), int(n), float(age))))
        return 0
    with tempfile.TemporaryDirectory(prefix="edged-backlog-", dir=args.work) as tmp:
        work = Path(tmp)
        print(f"filling {args.rows} results ...", flush=True)
        big = fill(work / "pristine" / "spool.db", args.rows, args.fill_rate)
        fill(work / "small" / "spool.db", 10_000, args.fill_rate)
        print(f"   {big['rows'] / big['seconds']:.0f} results/s, spool clock {big['clock']:.1f} s", flush=True)
        print("TTL expiry while appending (mqtt off, flat out):", flush=True)
        expiry = part_expiry(work / "pristine" / "spool.db", big["clock"], args, work)
        print("start-up:", flush=True)
        startup = part_startup(work / "pristine" / "spool.db", work / "small" / "spool.db", work)
    report = {"rows": args.rows, "fill": big, "expiry": expiry, "startup": startup, "load": os.getloadavg()[0]}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"\n{args.rows} results in the spool, load {report['load']:.2f}")
    for kind in ("daemon", "spool"):
        med = expiry[kind]["median"]
        print(f"  {kind}: expiring {med['expiry']:.0f} results/s, none {med['none']:.0f} results/s, "
              f"ratio {expiry[kind]['ratio']:.2f}" + (" (target >= 0.9)" if kind == "daemon" else ""))  # fmt: skip
    print(
        "  start-up to READY: "
        + ", ".join(f"{k.replace('_', ' ')} {v:.2f} s" for k, v in startup.items())
        + " (target <= 5 s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
