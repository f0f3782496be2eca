"""A neighbour floods the device (issue "Neighbours on the broker, round two"): result delivery and signed
commands during a flood, side by side with no flood, in one run.

`edged run` with remote control on (the bundled digits int8 model on the bundled sample video at 20 frames/s,
one Mosquitto on loopback). Each round lasts `--seconds` (15): flooding processes (`--flood-procs`, 2) publish
1-byte QoS 0 messages on one topic, as fast as they can (or `--flood-rate` a second in all; the issue measured
340,000 in 15 s: `--flood-rate 22700`), and meanwhile this process counts the results that reach a subscriber
and sends a signed `status` command every second, timing each answer. Rounds: no flood; a flood on a topic the
device does not read; on `edged/<dev>/replay/request`; on `edged/<dev>/cmd/reload` (beside the command's topic);
on `edged/<dev>/cmd/status` (the command's own topic: it shares that topic's budget, see the table).

Reported per round: messages flooded, results delivered per second (against the 20 produced), signed commands
answered and their median and worst answer time, and what the device dropped (status `mqtt.inbound`).
Target: during every flood on a topic other than the command's own, results at their normal rate and every
signed command answered within a second.

A measurement, not a test: it exits 0 whatever the figures are.

    python benchmarks/flood.py
    python benchmarks/flood.py --seconds 10 --json
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import multiprocessing as mp
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
DEVICE = "flooded"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def mosquitto(workdir: Path) -> Iterator[int]:
    port = free_port()
    conf = workdir / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\nuser {getpass.getuser()}\n", encoding="utf-8")
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


def flooder(port: int, topic: str, seconds: float, rate: float, out: Any) -> None:
    """One flooding process: QoS 0, 1 byte, `rate` a second (0: as fast as paho goes), for `seconds`; how many
    it sent."""
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2)
    client.max_queued_messages_set(0)
    client.connect("127.0.0.1", port)
    client.loop_start()
    start = time.monotonic()
    sent, end = 0, start + seconds
    while time.monotonic() < end:
        for _ in range(1000):
            client.publish(topic, b"x", qos=0)
        sent += 1000
        if rate:
            time.sleep(max(0.0, start + sent / rate - time.monotonic()))
    client.loop_stop()
    client.disconnect()
    out.put(sent)


def start_daemon(workdir: Path, port: int, public: str) -> subprocess.Popen[bytes]:
    import yaml

    cfg = {
        "device_id": DEVICE,
        "state_dir": str(workdir / "state"),
        "status": {"socket": str(workdir / "status.sock")},
        "mqtt": {"host": "127.0.0.1", "port": port, "stats_interval_s": 0},
        "control": {"public_keys": [public]},
        "pipelines": [{
            "name": "cam0",
            "source": {"type": "camera", "uri": str(ASSETS / "sample.mp4"), "fps": 20, "loop": True},
            "model": {"path": str(ASSETS / "digits.int8.onnx"), "providers": ["CPUExecutionProvider"]},
        }],
    }  # fmt: skip
    path = workdir / "edged.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    log = (workdir / "daemon.log").open("ab")
    return subprocess.Popen([sys.executable, "-m", "edged", "run", "--config", str(path)], stderr=log)


def status(workdir: Path) -> dict[str, Any]:
    from edged.core.errors import StatusError
    from edged.ops.status import query

    try:
        return query(workdir / "status.sock", timeout=2.0)
    except StatusError:
        return {}


class Results:
    """A subscriber counting the device's results."""

    def __init__(self, port: int) -> None:
        import paho.mqtt.client as paho
        from paho.mqtt.enums import CallbackAPIVersion

        self.count = 0
        self.client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2)
        self.client.on_connect = lambda c, *_: c.subscribe(f"edged/{DEVICE}/+/results", qos=1)
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()

    def _on_message(self, *_: Any) -> None:
        self.count += 1

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def one_round(port: int, workdir: Path, fleet: Any, name: str, topic: str | None,  # noqa: PLR0917
              args: argparse.Namespace, results: Results) -> dict[str, Any]:  # fmt: skip
    from edged.control.envelope import new_command

    before = status(workdir).get("mqtt", {}).get("inbound", {}).get("subscriptions", {})
    queue: Any = mp.Queue()
    rate = args.flood_rate / args.flood_procs
    procs = [mp.Process(target=flooder, args=(port, topic, args.seconds, rate, queue))
             for _ in range(args.flood_procs)]  # fmt: skip
    if topic is not None:
        for p in procs:
            p.start()
    time.sleep(0.5)
    n0, t0 = results.count, time.monotonic()
    answers: list[float] = []
    asked = 0
    while time.monotonic() - t0 < args.seconds - 1.0:
        sent = time.monotonic()
        asked += 1
        got = fleet.wait(fleet.send(new_command("status", DEVICE)), expect=1, timeout=5.0)
        if got.get(DEVICE, {}).get("ok"):
            answers.append((time.monotonic() - sent) * 1000)
        time.sleep(max(0.0, 1.0 - (time.monotonic() - sent)))
    delivered = (results.count - n0) / (time.monotonic() - t0)
    flooded = 0
    if topic is not None:
        for p in procs:
            p.join(args.seconds + 30)
        flooded = sum(queue.get() for _ in procs)
    after = status(workdir).get("mqtt", {}).get("inbound", {}).get("subscriptions", {})
    dropped = sum(v.get("dropped", 0) for v in after.values()) - sum(v.get("dropped", 0) for v in before.values())
    return {"round": name, "topic": topic, "flooded": flooded, "results_per_s": round(delivered, 1),
            "commands": asked, "answered": len(answers),
            "answer_ms_median": round(statistics.median(answers), 1) if answers else None,
            "answer_ms_max": round(max(answers), 1) if answers else None, "device_dropped": dropped}  # fmt: skip


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from edged.core.signing import generate_key, load_private_key
    from edged.fleet.send import BrokerOptions, FleetClient

    with tempfile.TemporaryDirectory(prefix="edged-flood-") as tmp:
        work = Path(tmp)
        public = generate_key(work / "fleet.key")
        with mosquitto(work) as port:
            daemon = start_daemon(work, port, public)
            fleet = FleetClient(BrokerOptions("127.0.0.1", port), load_private_key(work / "fleet.key"))
            results = Results(port)
            try:
                deadline = time.monotonic() + 60
                while not status(work).get("control", {}).get("listening") and time.monotonic() < deadline:
                    time.sleep(0.2)
                rounds = [("no flood", None), ("a topic it does not read", "elsewhere/noise"),
                          ("replay/request", f"edged/{DEVICE}/replay/request"),
                          ("cmd/reload (beside the command's)", f"edged/{DEVICE}/cmd/reload"),
                          ("cmd/status (the command's own)", f"edged/{DEVICE}/cmd/status")]  # fmt: skip
                out = []
                for name, topic in rounds:
                    out.append(one_round(port, work, fleet, name, topic, args, results))
                    print(f"flood: {json.dumps(out[-1])}", file=sys.stderr)
                    time.sleep(2.0)
                return out
            finally:
                results.close()
                fleet.close()
                daemon.terminate()
                daemon.wait(30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=15.0, help="seconds per round")
    ap.add_argument("--flood-procs", type=int, default=2, help="flooding processes")
    ap.add_argument(
        "--flood-rate",
        type=float,
        default=0.0,
        help="messages a second from all of them (0: as fast as they go; the issue measured 22,700)",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = run(args)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print("| round | flooded | results/s | signed status answered | answer ms median / max | dropped by the device |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in out:
        print(f"| {r['round']} | {r['flooded']:,} | {r['results_per_s']} | {r['answered']}/{r['commands']} | "
              f"{r['answer_ms_median']} / {r['answer_ms_max']} | {r['device_dropped']:,} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    threading.current_thread().name = "flood-bench"
    sys.exit(main())
