"""A light fleet simulator for benchmarks/fleet_scale.py: thousands of devices in one process, one asyncio loop.

Not edged's code: a stand-in for what a device does on the wire, light enough that 10,000 of them fit a 2-core
machine beside the broker, the database and the ingests (benchmarks/fleet.py runs edged's own spool and
publisher per simulated device, and real daemons, at up to ~2,000). Each device here has one MQTT 3.1.1
connection (one socket: no thread, no spool file, no ballast) and

- publishes result messages shaped like the daemon's at `--rate` results/s with its own seq (1, 2, ...), QoS 1;
  a message not acknowledged yet is sent again (DUP) after a reconnect, so delivery is at-least-once;
- keeps what the broker acknowledged in a window (the last WINDOW results, in memory, as edged's window);
- subscribes to `edged/<device>/replay/request` and answers as edged does (uplink/replay.py): the results
  asked for are sent again from the window, the rest answered `pending` or `gone`, on `.../replay/answer`;
- reconnects after a lost connection at a random moment within `--spread` seconds (as
  `mqtt.reconnect_spread_s`).

It prints a line `{"produced": N, "t": ...}` every second; when it stops producing (SIGTERM or `--duration`)
one line `{"last": {device: last seq}}`; then it stays connected, answering replay requests, for `--linger`
seconds or until a second SIGTERM, and prints `{"requests": ..., "replayed": ..., "gone": ...}` as it ends.

    python benchmarks/fleetsim.py --port 1883 --first 0 --count 2500 --rate 0.1 --duration 60
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import resource
import signal
import struct
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

WINDOW = 2000  # acknowledged results a device keeps for replay requests
KEEPALIVE_S = 60
CONNECTS_PER_S = 500  # a process's first connections at most this fast (the broker's accept queue)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _text(s: str) -> bytes:
    raw = s.encode("utf-8")
    return struct.pack("!H", len(raw)) + raw


def packet(kind: int, body: bytes) -> bytes:
    return bytes([kind]) + _varint(len(body)) + body


def connect_packet(client_id: str) -> bytes:
    return packet(0x10, _text("MQTT") + bytes([4, 0x02]) + struct.pack("!H", KEEPALIVE_S) + _text(client_id))


def publish_packet(topic: str, payload: bytes, pid: int | None, *, dup: bool = False) -> bytes:
    if pid is None:
        return packet(0x30, _text(topic) + payload)
    return packet(0x32 | (0x08 if dup else 0), _text(topic) + struct.pack("!H", pid) + payload)


async def read_packet(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    first = (await reader.readexactly(1))[0]
    length, shift = 0, 0
    while True:
        byte = (await reader.readexactly(1))[0]
        length += (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    return first, await reader.readexactly(length)


@dataclass
class Device:
    """One simulated device."""

    name: str
    seq: int = 0
    next_due: float = 0.0
    pid: int = 0
    unacked: dict[int, tuple[int, str, bytes]] = field(default_factory=dict)  # pid -> (seq, topic, payload)
    window: OrderedDict[int, bytes] = field(default_factory=OrderedDict)  # seq -> payload, acknowledged
    writer: asyncio.StreamWriter | None = None

    def next_pid(self) -> int:
        while True:
            self.pid = self.pid % 65535 + 1
            if self.pid not in self.unacked:
                return self.pid

    def send(self, topic: str, payload: bytes, seq: int) -> None:
        pid = self.next_pid()
        self.unacked[pid] = (seq, topic, payload)
        if self.writer is not None:
            self.writer.write(publish_packet(topic, payload, pid))


def result(device: str, seq: int) -> bytes:
    body = {"v": 1, "device": device, "pipeline": "cam0", "seq": seq, "ts": round(time.time(), 3),
            "model": {"name": "digits", "sha256": "0" * 64}, "provider": "CPUExecutionProvider",
            "latency_ms": {"pre": 0.4, "infer": 3.1, "post": 0.1},
            "result": {"top": [{"index": seq % 10, "label": str(seq % 10), "score": 0.98}]}}  # fmt: skip
    return json.dumps(body, separators=(",", ":")).encode()


class Fleet:
    """The devices of this process and their loop."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.devices = [Device(f"{args.prefix}{i:05d}") for i in range(args.first, args.first + args.count)]
        self.producing = True
        self.stopping = False
        self.requests = 0
        self.replayed = 0
        self.gone = 0
        self.connects = 0
        self._done: asyncio.Event | None = None

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self._stop_producing)
        tasks = []
        for i, dev in enumerate(self.devices):
            tasks.append(asyncio.create_task(self._connection(dev, i / CONNECTS_PER_S)))
        report = asyncio.create_task(self._report())
        await self._produce()
        report.cancel()
        sys.stdout.write(json.dumps({"last": {d.name: d.seq for d in self.devices}}) + "\n")
        sys.stdout.flush()
        self._done = asyncio.Event()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._done.wait(), self.args.linger)  # acknowledgements and replays
        self.stopping = True
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, report, return_exceptions=True)
        sys.stdout.write(json.dumps({"requests": self.requests, "replayed": self.replayed, "gone": self.gone,
                                     "connects": self.connects}) + "\n")  # fmt: skip
        sys.stdout.flush()

    def _stop_producing(self) -> None:
        if not self.producing and self._done is not None:
            self._done.set()
        self.producing = False

    async def _report(self) -> None:
        while True:
            produced = sum(d.seq for d in self.devices)
            sys.stdout.write(json.dumps({"produced": produced, "t": time.time()}) + "\n")
            sys.stdout.flush()
            await asyncio.sleep(1.0)

    async def _produce(self) -> None:
        """Each device a result every 1/rate s (a random phase each), until the duration or SIGTERM."""
        period = 1.0 / self.args.rate
        start = time.monotonic()
        for dev in self.devices:
            dev.next_due = start + random.uniform(0, period)
        end = start + self.args.duration
        while self.producing and time.monotonic() < end:
            now = time.monotonic()
            for dev in self.devices:
                if dev.next_due <= now:
                    dev.next_due += period
                    dev.seq += 1
                    dev.send(f"edged/{dev.name}/cam0/results", result(dev.name, dev.seq), dev.seq)
            await asyncio.sleep(0.05)

    async def _connection(self, dev: Device, delay: float) -> None:
        await asyncio.sleep(delay)
        while not self.stopping:
            with contextlib.suppress(OSError, asyncio.IncompleteReadError, ValueError):
                await self._session(dev)
            dev.writer = None
            await asyncio.sleep(random.uniform(0.5, max(0.5, self.args.spread)))

    async def _session(self, dev: Device) -> None:
        reader, writer = await asyncio.open_connection(self.args.host, self.args.port)
        try:
            writer.write(connect_packet(dev.name))
            kind, body = await asyncio.wait_for(read_packet(reader), 30)
            if kind >> 4 != 2 or body[1] != 0:
                raise ValueError("refused")
            self.connects += 1
            topic = f"edged/{dev.name}/replay/request"
            writer.write(packet(0x82, struct.pack("!H", 1) + _text(topic) + b"\x01"))
            for pid, (_, t, payload) in sorted(dev.unacked.items()):  # not acknowledged: again, as a DUP
                writer.write(publish_packet(t, payload, pid, dup=True))
            dev.writer = writer
            pinger = asyncio.create_task(self._ping(writer))
            try:
                while True:
                    kind, body = await read_packet(reader)
                    self._handle(dev, kind, body)
            finally:
                pinger.cancel()
        finally:
            dev.writer = None
            writer.close()

    @staticmethod
    async def _ping(writer: asyncio.StreamWriter) -> None:
        while True:
            await asyncio.sleep(KEEPALIVE_S / 2 + random.uniform(0, 5))
            writer.write(b"\xc0\x00")

    def _handle(self, dev: Device, kind: int, body: bytes) -> None:
        if kind >> 4 == 4:  # PUBACK
            (pid,) = struct.unpack("!H", body[:2])
            sent = dev.unacked.pop(pid, None)
            if sent is not None and sent[0] not in dev.window:
                dev.window[sent[0]] = sent[2]
                while len(dev.window) > WINDOW:
                    dev.window.popitem(last=False)
        elif kind >> 4 == 3:  # PUBLISH: a replay request
            qos = (kind >> 1) & 3
            (tlen,) = struct.unpack("!H", body[:2])
            at = 2 + tlen
            if qos:
                (pid,) = struct.unpack("!H", body[at : at + 2])
                at += 2
                if dev.writer is not None:
                    dev.writer.write(packet(0x40, struct.pack("!H", pid)))
            self._replay(dev, body[at:])

    def _replay(self, dev: Device, payload: bytes) -> None:
        try:
            req = json.loads(payload)
            ranges = [(int(a), int(b)) for a, b in req["ranges"]][:64]
        except (ValueError, KeyError, TypeError):
            return
        self.requests += 1
        pending_seqs = {s for s, _, _ in dev.unacked.values()}
        replayed, pending, gone = [], [], []
        for a, b in ranges:
            for seq in range(a, min(b, a + 5000) + 1):
                if seq in dev.window:
                    dev.send(f"edged/{dev.name}/cam0/results", dev.window[seq], seq)
                    replayed.append(seq)
                elif seq in pending_seqs:
                    pending.append(seq)
                else:
                    gone.append(seq)
        self.replayed += len(replayed)
        self.gone += len(gone)
        answer: dict[str, Any] = {"v": 1, "device": dev.name, "id": req.get("id"), "pipeline": "cam0",
                                  "ts": time.time(), "replayed": _ranges(replayed), "pending": _ranges(pending),
                                  "gone": _ranges(gone)}  # fmt: skip
        if dev.writer is not None:
            dev.writer.write(publish_packet(f"edged/{dev.name}/replay/answer", json.dumps(answer).encode(), None))


def _ranges(seqs: list[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for seq in sorted(seqs):
        if out and seq == out[-1][1] + 1:
            out[-1][1] = seq
        else:
            out.append([seq, seq])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--prefix", default="sim")
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--rate", type=float, default=0.1, help="results/s per device")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of results (SIGTERM ends it earlier)")
    ap.add_argument("--linger", type=float, default=60.0, help="seconds to stay connected after the last result")
    ap.add_argument("--spread", type=float, default=15.0, help="reconnect within this many seconds")
    args = ap.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    asyncio.run(Fleet(args).run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
