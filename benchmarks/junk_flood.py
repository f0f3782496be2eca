"""Junk on a results topic while real results flow (issue "Neighbours on the broker, round two"): what the
ingest lands per second, and how much its database grows, side by side with no junk, in one run.

One Mosquitto on loopback and `edged ingest` into a fresh SQLite file per round. A device stand-in publishes
`--results` real result messages at `--rate` a second (QoS 1, ~400 bytes); in the junk round a second client
publishes 60 kB of non-JSON bytes on `edged/junk/cam0/results` as fast as it can, for as long. Reported per
round: real rows landed per second (until the last one is in), junk messages sent, the ingest's counters
(quarantined, written to the quarantine, only counted), and the database file's size at the end.
Target: the real rows land at the rate they are sent with junk as without, and the file stays small.

A measurement, not a test: it exits 0 whatever the figures are.

    python benchmarks/junk_flood.py
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def mosquitto(workdir: Path) -> Iterator[int]:
    port = free_port()
    conf = workdir / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\nuser {getpass.getuser()}\n"
                    "max_queued_messages 0\n", encoding="utf-8")  # fmt: skip
    proc = subprocess.Popen([shutil.which("mosquitto") or "/usr/sbin/mosquitto", "-c", str(conf)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
            time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


def client(port: int, name: str) -> Any:
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    c = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id=name)
    c.max_inflight_messages_set(100)
    c.max_queued_messages_set(0)
    c.connect("127.0.0.1", port)
    c.loop_start()
    return c


def junk(port: int, stop: threading.Event, sent: list[int], rate: float) -> None:
    c = client(port, "junk")
    blob = b"\xff" * 60_000
    start = time.monotonic()
    while not stop.is_set():
        c.publish("edged/junk/cam0/results", blob, qos=0)
        sent[0] += 1
        if rate:
            time.sleep(max(0.0, start + sent[0] / rate - time.monotonic()))
        elif sent[0] % 50 == 0:
            time.sleep(0.001)
    c.loop_stop()
    c.disconnect()


def one_round(workdir: Path, port: int, args: argparse.Namespace, *, with_junk: bool) -> dict[str, Any]:
    from edged.fleet.ingest import Ingest, IngestOptions
    from edged.fleet.ingestdb import open_database

    db_path = workdir / f"{'junk' if with_junk else 'clean'}.db"
    opts = IngestOptions(host="127.0.0.1", port=port, client_id=f"bench-{with_junk}", group="", replay_topic="",
                         session_expiry_s=60)  # fmt: skip
    ingest = Ingest(opts, open_database(str(db_path)))
    ingest.start()
    stop, sent = threading.Event(), [0]
    flood = threading.Thread(target=junk, args=(port, stop, sent, args.junk_rate), name="junk")
    if with_junk:
        flood.start()
        time.sleep(1.0)
    device = client(port, "device")
    t0 = time.monotonic()
    for seq in range(1, args.results + 1):
        body = {"v": 1, "device": "real", "pipeline": "cam0", "seq": seq, "ts": time.time(), "result": {"n": seq}}
        device.publish("edged/real/cam0/results", json.dumps(body), qos=1)
        time.sleep(max(0.0, t0 + seq / args.rate - time.monotonic()))
    deadline = time.monotonic() + 300
    while ingest.snapshot()["inserted"] < args.results and time.monotonic() < deadline:
        time.sleep(0.1)
    took = time.monotonic() - t0
    stop.set()
    if with_junk:
        flood.join(30)
    device.loop_stop()
    device.disconnect()
    snap = ingest.snapshot()
    ingest.stop()
    ingest.db.close()
    size = sum(p.stat().st_size for p in workdir.glob(db_path.name + "*"))
    return {"round": "junk" if with_junk else "no junk", "real_rows": snap["inserted"],
            "real_rows_per_s": round(snap["inserted"] / took, 1), "junk_sent": sent[0],
            "quarantined": sum(snap["quarantined"].values()), "only_counted": snap["quarantine_skipped"],
            "db_mib": round(size / 2**20, 1)}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=int, default=400)
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--junk-rate", type=float, default=0.0, help="junk messages a second (0: as fast as it goes)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="edged-junk-") as tmp, mosquitto(Path(tmp)) as port:
        out = [one_round(Path(tmp), port, args, with_junk=False), one_round(Path(tmp), port, args, with_junk=True)]
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print("| round | real rows | real rows/s | junk sent | quarantined | only counted | database |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in out:
        print(f"| {r['round']} | {r['real_rows']} | {r['real_rows_per_s']} | {r['junk_sent']:,} | "
              f"{r['quarantined']:,} | {r['only_counted']:,} | {r['db_mib']} MiB |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
