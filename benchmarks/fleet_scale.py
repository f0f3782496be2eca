"""Fleet at scale (issue "Replay that costs nothing when nothing is lost"): 10,000 devices, shared ingests.

`--devices` light simulated devices (benchmarks/fleetsim.py: one MQTT connection each, many per process, a
replay window in memory, no spool, no ballast) publish through one Mosquitto (persistence on, saved only at its
own clean stop) into `edged ingest` on PostgreSQL (Debian's package, a fresh cluster in a temporary folder),
once with 1 ingest and once with `--ingests` (3) in one shared group. During `--duration` seconds of load the
broker is restarted cleanly at 1/3 (its sessions saved: nothing may be lost, nothing asked for) and killed
with -9 at 2/3 (what it acknowledged and had not delivered to an ingest is gone, and so are the ingests'
sessions until they subscribe again: the ingests find the holes and ask the devices, which send again from
their windows).

Reported per run: rows/s the database took, lag (results produced and not in the database yet, in seconds of
the fleet's rate: median and max of per-second samples), the ingests' peak memory (VmRSS), lost (numbered by
the devices and not in the database), duplicates absorbed, the seqs asked for in each phase (steady, after the
clean restart, after the kill) and whether any seq was asked for by two ingests. Targets: 0 lost, every row
once, 0 seqs asked for in the steady phase, none asked twice. (Mosquitto 2.0 loses some results it had
acknowledged even at a clean restart; those are asked for, and `recovered` says they came that way.)

A measurement, not a test: it exits 0 whatever the figures are, non-zero only when something crashed.

    python benchmarks/fleet_scale.py                        # 10,000 devices, 1 and 3 ingests (~10 min)
    python benchmarks/fleet_scale.py --devices 2000 --duration 45 --json
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import os
import resource
import signal
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
sys.path.insert(0, str(REPO_ROOT / "tests"))  # the PostgreSQL server helper the tests use
PER_PROCESS = 2500  # simulated devices per process (a socket each; one asyncio loop)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(predicate: Any, timeout: float, what: str, step: float = 0.5) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        time.sleep(step)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")


def _raise_fd_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class Broker:
    """A Mosquitto for the fleet: persistence saved only at a clean stop, no limits on queues."""

    def __init__(self, workdir: Path) -> None:
        self.workdir, self.port = workdir, free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        (workdir / "mosquitto.conf").write_text(
            f"listener {self.port} 127.0.0.1\nallow_anonymous true\nuser {getpass.getuser()}\n"
            f"persistence true\npersistence_location {workdir}/\nautosave_interval 0\n"
            "max_inflight_messages 0\nmax_queued_messages 0\nmax_connections -1\nlog_type error\n",
            encoding="utf-8",
        )

    def start(self) -> None:
        with (self.workdir / "mosquitto.log").open("ab") as out:
            self.proc = subprocess.Popen(["mosquitto", "-c", str(self.workdir / "mosquitto.conf")],
                                         stdout=out, stderr=out,
                                         preexec_fn=_raise_fd_limit)  # noqa: PLW1509  # fmt: skip
        wait_until(self._answers, 20, "mosquitto", 0.1)

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return True
        except OSError:
            return False

    def restart(self) -> None:
        """A clean stop (it saves its sessions and queues) and a start."""
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(120)
        self.start()

    def kill(self) -> None:
        """kill -9 (what it acknowledged and did not save is gone) and a start."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(60)
        self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(120)


@contextlib.contextmanager
def postgres() -> Iterator[Any]:
    from pgserver import PgServer, postgres_bin

    bindir = postgres_bin()
    if bindir is None:
        raise SystemExit("PostgreSQL is not installed (scripts/setup dev installs it)")
    home = Path(tempfile.mkdtemp(prefix="edged-pg-"))
    if os.geteuid() == 0:
        import pwd

        user = pwd.getpwnam("postgres")
        os.chown(home, user.pw_uid, user.pw_gid)
    server = PgServer(bindir, home / "pgdata", free_port())
    server.init()
    server.start()
    try:
        yield server
    finally:
        server.stop()
        subprocess.run(["rm", "-rf", str(home)], check=False)


def new_database(server: Any, name: str) -> str:
    import psycopg

    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return str(server.url.rsplit("/", 1)[0] + f"/{name}")


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text(encoding="utf-8").splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class Sims:
    """The simulated fleet: a few processes, their progress lines read on threads."""

    def __init__(self, args: argparse.Namespace, port: int) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        self.produced: dict[int, int] = {}
        self.last: dict[str, int] = {}
        self.ends: list[dict[str, Any]] = []
        self.lasts = 0  # processes that said their last seqs
        self._lock = threading.Lock()
        for i, first in enumerate(range(0, args.devices, PER_PROCESS)):
            cmd = [sys.executable, str(REPO_ROOT / "benchmarks" / "fleetsim.py"), "--port", str(port),
                   "--first", str(first), "--count", str(min(PER_PROCESS, args.devices - first)),
                   "--rate", str(args.rate), "--duration", str(args.duration + 3600), "--linger", "900",
                   "--spread", str(args.spread)]  # fmt: skip
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
            self.procs.append(proc)
            threading.Thread(target=self._read, args=(i, proc), name=f"sim-reader-{i}", daemon=True).start()

    def _read(self, i: int, proc: subprocess.Popen[str]) -> None:
        for line in proc.stdout or ():
            data = json.loads(line)
            with self._lock:
                if "produced" in data:
                    self.produced[i] = int(data["produced"])
                elif "last" in data:
                    self.last.update(data["last"])
                    self.lasts += 1
                else:
                    self.ends.append(data)

    def total(self) -> int:
        with self._lock:
            return sum(self.produced.values())

    def stop_producing(self) -> dict[str, int]:
        for proc in self.procs:
            proc.send_signal(signal.SIGTERM)
        wait_until(lambda: self.lasts >= len(self.procs), 60, "the last seqs of every process")
        with self._lock:
            return dict(self.last)

    def close(self) -> list[dict[str, Any]]:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
            if proc.poll() is None:
                proc.kill()
        return self.ends


def start_ingest(port: int, url: str, name: str, group: str, log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "edged", "ingest", "--db", url, "--port", str(port), "--client-id", name,
           "--group", group, "--session-expiry", "3600"]  # fmt: skip
    with log.open("ab") as err:
        proc = subprocess.Popen(cmd, stderr=err)
    wait_until(lambda: b"writing to" in log.read_bytes(), 60, f"{name} subscribed")
    return proc


def stop_ingest(proc: subprocess.Popen[bytes], log: Path) -> dict[str, Any]:
    proc.send_signal(signal.SIGTERM)
    proc.wait(120)
    import re

    found = re.findall(rb"ingest: stopped: (\{.*\})", log.read_bytes())
    return json.loads(found[-1]) if found else {}


class Db:
    def __init__(self, url: str) -> None:
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True)

    def count(self) -> int:
        row = self.conn.execute("SELECT COUNT(*) FROM results").fetchone()
        return int(row[0]) if row else 0

    def recovered(self) -> int:
        """Rows that arrived in a range asked for (what `edged ingest --report` calls recovered)."""
        from edged.fleet.ingestdb import RECOVERED

        return sum(int(n) for _, n in self.conn.execute(RECOVERED))

    def asked(self) -> list[tuple[str, int, int, str, float]]:
        return [(str(d), int(a), int(b), str(c), float(t)) for d, a, b, c, t in self.conn.execute(
            "SELECT device, first, last, client, ts FROM replay_ranges WHERE outcome = 'asked'")]  # fmt: skip


def _load(  # noqa: PLR0917
    args: argparse.Namespace, broker: Broker, sims: Sims, db: Db, procs: list[subprocess.Popen[bytes]],
    samples: list[tuple[float, int, int]], rss: list[float],
) -> dict[str, float]:  # fmt: skip
    """`--duration` s of load, sampled each second; the broker restarted at 1/3, killed at 2/3. When each
    happened (epoch s)."""
    t0 = time.monotonic()
    events = {"start": time.time()}
    phases = [("restart", args.duration / 3), ("kill", 2 * args.duration / 3), ("end", args.duration)]
    for name, at in phases:
        while time.monotonic() - t0 < at:
            samples.append((time.monotonic() - t0, sims.total(), db.count()))
            rss.append(max(rss_mib(p.pid) for p in procs))
            time.sleep(1.0)
        events[name] = time.time()
        print(f"fleet_scale: {len(procs)} ingest(s): {name} at {at:.0f} s", file=sys.stderr)
        if name == "restart":
            broker.restart()
        elif name == "kill":
            broker.kill()
    return events


def run(args: argparse.Namespace, server: Any, ingests: int, workdir: Path) -> dict[str, Any]:
    """One run: the fleet, `ingests` ingests in one group, a clean broker restart and a kill -9 under load."""
    workdir.mkdir(parents=True)
    url = new_database(server, f"fleet{ingests}")
    broker = Broker(workdir)
    broker.start()
    group = f"scale{ingests}"
    logs = [workdir / f"ingest-{i}.log" for i in range(ingests)]
    procs = [start_ingest(broker.port, url, f"ingest-{i}", group, logs[i]) for i in range(ingests)]
    db = Db(url)
    sims = Sims(args, broker.port)
    samples: list[tuple[float, int, int]] = []  # (t, produced, rows)
    rss: list[float] = []
    rate = args.devices * args.rate
    events: dict[str, float] = {}
    try:
        wait_until(lambda: sims.total() >= rate * 5, 300, "the fleet connected and producing")
        events.update(_load(args, broker, sims, db, procs, samples, rss))
        last = sims.stop_producing()
        expected = sum(last.values())
        t_end = time.monotonic()
        with contextlib.suppress(RuntimeError):
            wait_until(lambda: db.count() >= expected, args.settle, "every row in the database")
        caught_up = time.monotonic() - t_end
        rows = db.count()
        rss.append(max(rss_mib(p.pid) for p in procs))
        counters = [stop_ingest(p, log) for p, log in zip(procs, logs, strict=True)]
        asked, recovered = db.asked(), db.recovered()
    finally:
        ends = sims.close()
        for p in procs:
            if p.poll() is None:
                p.kill()
        broker.stop()
    lags = [max(0, produced - rows_) / rate for _, produced, rows_ in samples]
    seqs: dict[str, list[int]] = {}
    for device, first, last_, _, _ in asked:
        seqs.setdefault(device, []).extend(range(first, last_ + 1))
    twice = sum(len(v) - len(set(v)) for v in seqs.values())

    def phase(since: float, until: float) -> int:
        return sum(last_ - first + 1 for _, first, last_, _, ts in asked if since <= ts < until)

    replay = [c.get("replay") or {} for c in counters]
    return {
        "devices": args.devices,
        "rate_per_device": args.rate,
        "ingests": ingests,
        "duration_s": args.duration,
        "results": expected,
        "rows": rows,
        "lost": expected - rows,
        "rows_per_s": round(rows / (args.duration + caught_up), 1),
        "catch_up_s_after_end": round(caught_up, 1),
        "lag_s_median": round(statistics.median(lags), 2) if lags else None,
        "lag_s_max": round(max(lags), 2) if lags else None,
        "ingest_rss_mib_max": round(max(rss), 1) if rss else None,
        "duplicates_absorbed": sum(int(c.get("duplicates") or 0) for c in counters),
        "seqs_asked_steady": phase(events["start"] - 3600, events["restart"]),
        "seqs_asked_after_restart": phase(events["restart"], events["kill"]),
        "seqs_asked_after_kill": phase(events["kill"], time.time() + 3600),
        "requests": sum(int(r.get("requests", 0)) for r in replay),
        "asked_seqs": sum(int(r.get("asked", 0)) for r in replay),
        "checked_seqs": sum(int(r.get("checked", 0)) for r in replay),
        "recovered_in_report": recovered,
        "seqs_asked_twice": twice,
        "devices_replayed": sum(int(e.get("replayed", 0)) for e in ends),
        "load_at_end": os.getloadavg()[0],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=10_000)
    ap.add_argument("--rate", type=float, default=0.1, help="results/s per device")
    ap.add_argument("--duration", type=float, default=90.0, help="seconds of load per run")
    ap.add_argument("--ingests", type=int, default=3, help="ingests in the shared group of the second run")
    ap.add_argument("--spread", type=float, default=15.0, help="reconnect spread of every device (s)")
    ap.add_argument("--settle", type=float, default=240.0, help="seconds to wait for every row after the load")
    ap.add_argument("--only", type=int, help="one run with this many ingests")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    _raise_fd_limit()
    out = []
    with tempfile.TemporaryDirectory(prefix="edged-fleet-scale-") as tmp, postgres() as server:
        for n in [args.only] if args.only else [1, args.ingests]:
            out.append(run(args, server, n, Path(tmp) / f"run{n}"))
            print(f"fleet_scale: {json.dumps(out[-1])}", file=sys.stderr)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        keys = list(out[0])
        print("| " + " | ".join(keys) + " |")
        print("|" + "---|" * len(keys))
        for row in out:
            print("| " + " | ".join(str(row[k]) for k in keys) + " |")
    return 0


if __name__ == "__main__":
    threading.current_thread().name = "fleet-scale"
    sys.exit(main())
