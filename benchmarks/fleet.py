"""Fleet benchmark (issue 16): many devices against one Mosquitto through broker restarts; the ingest's rate.

One run, two parts (JSON with `--json`):

1. Ingest rate. With the ingest away, a bare paho QoS 1 publisher queues `--burst` results (default 50,000,
   from 100 device names) in the ingest's persistent session on the broker; then `edged ingest` starts
   and is timed until the database holds all of them: results/s into SQLite, and into PostgreSQL when
   Debian's package is installed (a fresh cluster in a temporary folder). Target: >= 5,000/s each.
2. Fleet. `--sim` simulated devices (default 1,000), each a real `edged.store.spool.Spool` and
   `edged.uplink.publisher.Publisher` (edged's own store-and-forward code, one SQLite spool and one MQTT
   connection per device) in `--procs` worker processes, producing `--rate` results/s each, plus `--real`
   `edged run` daemons (default 20; the bundled digits int8 model on the bundled video). One
   `edged ingest` writes everything into SQLite. The broker (persistence on) is stopped and started
   again `--restarts` times under load. Reported: for each restart, the seconds until every device is
   connected again and the most connections the broker accepted in one second (from its log) as a
   share of the fleet; the ingest's duplicates absorbed; and results lost = what the devices numbered
   minus the rows in the database (target 0; also no gap in `edged ingest --report`).
   Targets: 0 lost, every row once, no second with more than 10% of the fleet connecting.

A measurement, not a test: it exits 0 whatever the figures are, non-zero only when something crashed.

    python benchmarks/fleet.py
    python benchmarks/fleet.py --sim 200 --real 5 --duration 40 --burst 20000 --json
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import os
import re
import resource
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
ASSETS = REPO_ROOT / "edged" / "assets"
sys.path.insert(0, str(REPO_ROOT / "tests"))  # the PostgreSQL server helper the tests use


SIMS_PER_PROCESS = 100


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(predicate: Any, timeout: float, what: str, step: float = 0.2) -> float:
    """Seconds it took; RuntimeError on timeout."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        time.sleep(step)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")


class Broker:
    """A Mosquitto with persistence and room for a fleet's queues."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.log = workdir / "mosquitto.log"
        self.proc: subprocess.Popen[bytes] | None = None
        (workdir / "mosquitto.conf").write_text(
            f"listener {self.port} 127.0.0.1\nallow_anonymous true\nuser {getpass.getuser()}\n"
            f"persistence true\npersistence_location {workdir}/\nautosave_interval 0\n"
            "max_inflight_messages 0\nmax_queued_messages 0\nmax_connections -1\n"
            "log_type notice\nlog_type information\nconnection_messages true\n",
            encoding="utf-8",
        )

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(["mosquitto", "-c", str(self.workdir / "mosquitto.conf")],
                                         stdout=out, stderr=out)  # fmt: skip
        wait_until(self._answers, 20, "mosquitto")

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()  # saves the persistent sessions (the ingest's queue)
            self.proc.wait(60)
            self.proc = None

    def connects(self, since: float, prefixes: tuple[str, ...]) -> list[tuple[int, str]]:
        """(epoch second, client id) of each connection accepted at or after `since`."""
        out = []
        pattern = re.compile(r"^(\d+): New client connected from \S+ as (\S+) ")
        for line in self.log.read_text(encoding="utf-8", errors="replace").splitlines():
            m = pattern.match(line)
            if m and int(m.group(1)) >= int(since) and m.group(2).startswith(prefixes):
                out.append((int(m.group(1)), m.group(2)))
        return out


INGEST_GROUP = ["bench"]  # --ingest-group


def ingest_cmd(port: int, db: str, client_id: str) -> list[str]:
    return [sys.executable, "-m", "edged", "ingest", "--db", db, "--port", str(port), "--client-id", client_id,
            "--group", INGEST_GROUP[0], "--session-expiry", "3600"]  # fmt: skip


def start_ingest(port: int, db: str, client_id: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as err:
        proc = subprocess.Popen(ingest_cmd(port, db, client_id), stderr=err)
    wait_until(lambda: b"writing to" in log.read_bytes(), 60, "the ingest subscribed")
    return proc


def stop_ingest(proc: subprocess.Popen[bytes], log: Path) -> dict[str, Any]:
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)
    found = re.findall(rb"ingest: stopped: (\{.*\})", log.read_bytes())
    return json.loads(found[-1]) if found else {}


_HANDLES: dict[str, Any] = {}


def db_count(db: str) -> int:
    """Rows in the database (one connection per database, kept: polling must not cost the ingest much)."""
    from edged.core.errors import IngestError
    from edged.fleet.ingestdb import open_database

    try:
        if db not in _HANDLES:
            _HANDLES[db] = open_database(db)
        return int(_HANDLES[db].count())
    except IngestError:
        _HANDLES.pop(db, None)
        return -1


# -- part 1: the ingest's rate --------------------------------------------------------------------------------


def burst(port: int, n: int) -> None:
    """Queue `n` results from 100 devices on the broker (QoS 1, every PUBACK awaited)."""
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id=f"burst-{os.getpid()}",
                         protocol=paho.MQTTv5)  # fmt: skip
    client.max_inflight_messages_set(1000)
    client.connect("127.0.0.1", port)
    client.loop_start()
    infos = []
    for i in range(n):
        device, seq = f"burst{i % 100:03d}", i // 100 + 1
        body = {"v": 1, "device": device, "pipeline": "cam0", "seq": seq, "ts": time.time(),
                "model": {"name": "digits", "sha256": "0" * 64}, "provider": "CPUExecutionProvider",
                "latency_ms": {"pre": 0.4, "infer": 3.1, "post": 0.1},
                "result": {"top": [{"index": seq % 10, "label": str(seq % 10), "score": 0.98}]}}  # fmt: skip
        infos.append(client.publish(f"edged/{device}/cam0/results", json.dumps(body), qos=1))
    for info in infos:
        info.wait_for_publish(120)
    client.loop_stop()
    client.disconnect()


def ingest_rate(workdir: Path, db: str, n: int) -> dict[str, Any]:
    broker = Broker(workdir)
    broker.start()
    log = workdir / "ingest.log"
    try:
        stop_ingest(start_ingest(broker.port, db, "ingest-rate", log), log)  # the session now exists
        burst(broker.port, n)
        proc = start_ingest(broker.port, db, "ingest-rate", log)  # subscribed: the queue is flowing
        t0, n0 = time.monotonic(), max(0, db_count(db))
        took = time.monotonic() - t0 + wait_until(lambda: db_count(db) >= n, 600, f"{n} rows", 0.25)
        n -= n0  # timed from the first count on: the process start is not the ingest's rate
        counters = stop_ingest(proc, log)
    finally:
        broker.stop()
    return {"results_timed": n, "seconds": round(took, 2), "results_per_s": round(n / took), "rows": db_count(db),
            "duplicates": counters.get("duplicates")}  # fmt: skip


@contextlib.contextmanager
def postgres() -> Iterator[str | None]:
    from pgserver import postgres_bin

    bindir = postgres_bin()
    if bindir is None:
        yield None
        return
    from pgserver import PgServer

    home = Path(tempfile.mkdtemp(prefix="edged-pg-"))
    if os.geteuid() == 0:
        import pwd

        user = pwd.getpwnam("postgres")
        os.chown(home, user.pw_uid, user.pw_gid)
    server = PgServer(bindir, home / "pgdata", free_port())
    server.init()
    server.start()
    try:
        yield server.url
    finally:
        server.stop()
        subprocess.run(["rm", "-rf", str(home)], check=False)


# -- part 2: the fleet ------------------------------------------------------------------------------------------


def sim_worker(args: argparse.Namespace) -> int:
    """One worker process: `--count` simulated devices (Spool + Publisher each) producing for `--duration` s,
    then draining; prints {device: last seq} and the results left in spools as JSON."""
    from edged.store.spool import Spool, SpoolConfig
    from edged.uplink.mqttstats import MqttStats
    from edged.uplink.publisher import Publisher
    from edged.uplink.settings import MqttConfig

    devices = []
    for i in range(args.first, args.first + args.count):
        name = f"sim{i:04d}"
        spool = Spool(Path(args.dir) / f"{name}.db", SpoolConfig(batch_ms=200))
        spool.start()
        cfg = MqttConfig.model_validate({"host": "127.0.0.1", "port": args.port, "client_id": name,
                                         "reconnect_spread_s": args.spread, "reconnect_min_s": 1.0,
                                         "reconnect_max_s": 10.0, "stats_interval_s": 0})  # fmt: skip
        pub = Publisher(cfg, name, spool, MqttStats())
        pub.start()
        devices.append((name, spool, pub))
    topic = "edged/{}/cam0/results"
    period = 1.0 / (args.rate * len(devices))
    deadline = time.monotonic() + args.duration
    i = 0
    appended: dict[str, int] = {}  # the last seq each device numbered (a fresh spool starts at 1)
    tick = time.monotonic()
    while time.monotonic() < deadline:
        name, spool, _ = devices[i % len(devices)]
        seq = spool.next_seq("cam0")
        appended[name] = seq
        body = {"v": 1, "device": name, "pipeline": "cam0", "seq": seq, "ts": time.time(), "result": {"n": seq}}
        spool.append("cam0", seq, time.time(), topic.format(name), json.dumps(body).encode())
        i += 1
        tick += period
        time.sleep(max(0.0, tick - time.monotonic()))
    for _, spool, _ in devices:
        spool.flush()
    end = time.monotonic() + args.drain
    while time.monotonic() < end and any(spool.depth for _, spool, _ in devices):
        time.sleep(0.5)
    left = 0
    for name, spool, pub in devices:
        pub.request_stop(1.0)
        pub.join(10)
        spool.close()
        with sqlite3.connect(Path(args.dir) / f"{name}.db") as conn:  # committed, not acknowledged: kept
            left += int(conn.execute("SELECT COUNT(*) FROM results").fetchone()[0])
    sys.stdout.write(json.dumps({"last": appended, "left": left}) + "\n")
    return 0


def real_daemon(workdir: Path, index: int, port: int, spread: float) -> tuple[subprocess.Popen[bytes], Path]:
    import yaml

    state = workdir / f"real{index:02d}"
    state.mkdir()
    body = {
        "device_id": f"real{index:02d}", "state_dir": str(state),
        "mqtt": {"host": "127.0.0.1", "port": port, "reconnect_spread_s": spread, "reconnect_min_s": 1.0,
                 "reconnect_max_s": 10.0, "stats_interval_s": 5},
        "pipelines": [{
            "name": "cam0",
            "source": {"type": "camera", "uri": str(ASSETS / "sample.mp4"), "fps": 2, "loop": True},
            "model": {"path": str(ASSETS / "digits.int8.onnx"), "providers": ["CPUExecutionProvider"]},
        }],
    }  # fmt: skip
    cfg = state / "edged.yaml"
    cfg.write_text(yaml.safe_dump(body), encoding="utf-8")
    with (state / "daemon.log").open("ab") as err:
        proc = subprocess.Popen([sys.executable, "-m", "edged", "run", "--config", str(cfg)], stderr=err)
    return proc, state


def restart_figures(broker: Broker, restarted_at: float, fleet: int, until: float) -> dict[str, Any]:
    connects = [(t, c) for t, c in broker.connects(restarted_at, DEVICES) if t < until]
    first: dict[str, int] = {}
    for second, client in connects:
        first.setdefault(client, second)
    per_second = Counter(first.values())
    back = (max(first.values()) - restarted_at) if len(first) >= fleet else None
    return {"devices_back": len(first), "fleet": fleet, "seconds_until_all_back": back,
            "peak_connects_per_s": max(per_second.values()) if per_second else 0,
            "peak_share": round(max(per_second.values()) / fleet, 3) if per_second else 0.0}  # fmt: skip


class FleetRun:
    """Part 2, step by step: start everything, restart the broker under load, stop, count."""

    def __init__(self, workdir: Path, args: argparse.Namespace) -> None:
        self.workdir, self.args = workdir, args
        self.broker = Broker(workdir)
        self.db = str(workdir / "fleet.db")
        self.log = workdir / "ingest.log"
        self.fleet = args.sim + args.real
        self.sims: list[subprocess.Popen[str]] = []
        self.reals: list[tuple[subprocess.Popen[bytes], Path]] = []
        self.restarted_at: list[float] = []
        self.loaded_at = time.monotonic()
        self.last: dict[str, int] = {}  # the highest seq each device numbered
        self.left = 0  # results still in a device's spool at the end
        self.ingest: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        args = self.args
        self.broker.start()
        self.ingest = start_ingest(self.broker.port, self.db, "ingest-fleet", self.log)
        # paho polls with select(): descriptors past 1023 break it. A simulated device holds about six
        # (spool database, WAL, shared memory; socket; paho's socket pair), so at most 100 per process.
        per = min(-(-args.sim // args.procs), SIMS_PER_PROCESS)
        for first in range(0, args.sim, per):
            sim_dir = self.workdir / f"sims{first}"
            sim_dir.mkdir()
            cmd = [sys.executable, __file__, "--sim-worker", "--first", str(first), "--count",
                   str(min(per, args.sim - first)), "--port", str(self.broker.port), "--rate", str(args.rate),
                   "--duration", str(args.duration), "--spread", str(args.spread), "--dir", str(sim_dir),
                   "--drain", str(args.drain)]  # fmt: skip
            self.sims.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))
        self.loaded_at = time.monotonic()  # the simulated devices produce for `duration` from about now
        self.reals = [real_daemon(self.workdir, i, self.broker.port, args.spread) for i in range(args.real)]
        started = time.time()
        wait_until(lambda: len({c for _, c in self.broker.connects(started - 5, DEVICES)}) >= self.fleet,
                   180, "every device connected")  # fmt: skip

    def restart_broker(self, n: int) -> None:
        """At (n+1)/(restarts+1) of the load: down for `--down` s, then up again (figures from its log later)."""
        due = self.loaded_at + (n + 1) * self.args.duration / (self.args.restarts + 1)
        time.sleep(max(0.0, due - time.monotonic()))
        print(f"fleet: restarting the broker ({n + 1}/{self.args.restarts})", file=sys.stderr)
        self.broker.stop()
        time.sleep(self.args.down)
        self.restarted_at.append(time.time())
        self.broker.start()

    def restart_figures(self) -> list[dict[str, Any]]:
        """Per restart: devices back before the next restart, how long that took, the busiest second."""
        ends = [*self.restarted_at[1:], time.time() + 1]
        pairs = zip(self.restarted_at, ends, strict=True)
        return [restart_figures(self.broker, at, self.fleet, until) for at, until in pairs]

    def finish(self) -> dict[str, Any]:
        """Let the simulated devices drain, stop the daemons, wait for the database to settle, stop ingest."""
        outputs = [json.loads(p.communicate(timeout=self.args.duration + self.args.drain + 300)[0])
                   for p in self.sims]  # fmt: skip
        self.last = {name: top for out in outputs for name, top in out["last"].items()}
        self.left = sum(out["left"] for out in outputs)
        for proc, _ in self.reals:
            proc.send_signal(signal.SIGTERM)
        for proc, state in self.reals:
            proc.wait(60)
            with sqlite3.connect(state / "spool.db") as conn:  # what a daemon still holds after its stop
                held, top = conn.execute("SELECT COUNT(*), MAX(seq) FROM results").fetchone()
            self.left += int(held)
            self.last[state.name] = int(top or 0)  # else the database's highest seq, below
        with contextlib.suppress(RuntimeError):
            wait_until(lambda: db_count(self.db) >= sum(self.last.values()) - self.left, 300, "the ingest")
        settled = [db_count(self.db), time.monotonic()]

        def still() -> bool:  # the real daemons' last results: until the count stays put for 3 s
            now = db_count(self.db)
            if now != settled[0]:
                settled[:] = [now, time.monotonic()]
            return time.monotonic() - settled[1] >= 3.0

        with contextlib.suppress(RuntimeError):
            wait_until(still, 120, "the database settled")
        counters = stop_ingest(self.ingest, self.log) if self.ingest is not None else {}
        for device, top in _HANDLES[self.db].conn.execute("SELECT device, MAX(seq) FROM results GROUP BY device"):
            if device.startswith("real"):
                self.last[device] = max(self.last.get(device, 0), int(top))
        return counters

    def close(self) -> None:
        procs: list[subprocess.Popen[Any]] = [*self.sims, *(p for p, _ in self.reals)]
        if self.ingest is not None:
            procs.append(self.ingest)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        self.broker.stop()


DEVICES = ("sim", "edged-real")  # the client ids of the fleet's devices


def fleet_run(workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    run = FleetRun(workdir, args)
    try:
        run.start()
        for n in range(args.restarts):
            run.restart_broker(n)
        counters = run.finish()
        restarts = run.restart_figures()
    finally:
        run.close()
    report = json.loads(subprocess.run([sys.executable, "-m", "edged", "ingest", "--report", "--json", "--db", run.db],
                                       capture_output=True, text=True, check=False).stdout)  # fmt: skip
    rows, expected = db_count(run.db), sum(run.last.values())
    return {"sim_devices": args.sim, "real_daemons": args.real, "ingest_group": args.ingest_group or None,
            "results_numbered": expected, "rows": rows, "left_in_spools": run.left,
            "lost": expected - rows - run.left, "duplicates_absorbed": counters.get("duplicates"),
            "unexplained_gaps": report.get("unexplained"), "restarts": restarts}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sim", type=int, default=1000, help="simulated devices (edged's spool and publisher)")
    ap.add_argument("--real", type=int, default=20, help="real edged daemons")
    ap.add_argument("--procs", type=int, default=4, help="worker processes for simulated devices (1+ per 100)")
    ap.add_argument("--rate", type=float, default=0.5, help="results/s per simulated device")
    ap.add_argument("--duration", type=float, default=90.0, help="seconds of load")
    ap.add_argument("--restarts", type=int, default=2, help="broker restarts under load")
    ap.add_argument("--down", type=float, default=2.0, help="seconds the broker stays down")
    ap.add_argument("--spread", type=float, default=15.0, help="mqtt.reconnect_spread_s of every device")
    ap.add_argument("--drain", type=float, default=120.0, help="seconds the devices get to drain at the end")
    ap.add_argument("--burst", type=int, default=50_000, help="results queued for the ingest-rate part")
    ap.add_argument("--ingest-group", default="bench", help="the ingest's shared-subscription group ('' = plain)")
    ap.add_argument("--skip-fleet", action="store_true", help="only the ingest rate")
    ap.add_argument("--keep", type=Path, help="work in this folder and keep it (databases, logs, spools)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--sim-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--dir", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # a connection and a spool per device
    if args.sim_worker:
        return sim_worker(args)
    INGEST_GROUP[0] = args.ingest_group
    out: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        work = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="edged-fleet-")))
        work.mkdir(parents=True, exist_ok=True)
        (work / "sqlite").mkdir()
        out["ingest_sqlite"] = ingest_rate(work / "sqlite", str(work / "sqlite" / "rate.db"), args.burst)
        (work / "pg").mkdir()
        with postgres() as url:
            out["ingest_postgresql"] = ingest_rate(work / "pg", url, args.burst) if url else "not installed"
        if not args.skip_fleet:
            (work / "fleet").mkdir()
            out["fleet"] = fleet_run(work / "fleet", args)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for part, figures in out.items():
            print(f"{part}: {json.dumps(figures)}")
    return 0


if __name__ == "__main__":
    threading.current_thread().name = "fleet-bench"
    sys.exit(main())
