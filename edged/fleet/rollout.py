"""`edged fleet rollout MODEL`: a new model to a group, the canary first, the rest only if it holds.

1. The model's sha256 is signed with the fleet key; the file is offered over HTTP (`--serve`, a small
   server in this process, or `--url` of one you run) or left retained in chunks on the broker
   (`--via mqtt`, cleared at the end).
2. The group's members are found from their retained state (`edged/+/state`), or named with `--device`.
3. The canary devices (`--canary`, a count or a share like `10%`) get the `model` command first. Each
   fetches, verifies, validates on its own frames, swaps and watches (edged/control/rollout.py). Only when
   every canary kept the model do the others get it; one that refused, rejected or rolled back stops the
   rollout there, and the rest never see the model.
4. Progress comes from the devices' events (`edged/+/events`), one line per step.
"""

from __future__ import annotations

import hashlib
import http.server
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edged.control.envelope import new_command
from edged.core.errors import EdgedError
from edged.core.signing import sign_file_digest
from edged.fleet.send import FleetClient

MQTT_CHUNK_BYTES = 256 * 1024
MODELS_PREFIX = "edged/fleet/models"  # edged/control/modelfetch.py MQTT_PREFIX: the same tree
DISCOVERY_QUIET_S = 1.0
Progress = Callable[[str], None]


@dataclass
class RolloutPlan:
    """What to roll out where, and the device-side knobs of the `model` command."""

    model: Path
    group: str | None = None
    devices: list[str] = field(default_factory=list)
    canary: str = "1"  # a count, or a share of the devices: "10%"
    pipeline: str | None = None
    via: str = "url"
    url: str | None = None
    serve: str | None = None  # HOST:PORT to serve the file from this process
    device_args: dict[str, Any] = field(default_factory=dict)  # watch_s, min_fps_ratio, max_slowdown, gates, ...
    wait_s: float = 900.0  # per phase


@dataclass
class RolloutResult:
    """Per device: the answer to its `model` command (absent: never sent or never answered)."""

    sha256: str
    canary: list[str]
    rest: list[str]
    answers: dict[str, dict[str, Any]] = field(default_factory=dict)
    stopped: str | None = None  # why the rest did not get the model
    offline: list[str] = field(default_factory=list)  # members of the group that were offline: not sent
    took_s: float | None = None

    @property
    def ok(self) -> bool:
        """Every device kept (or already ran) the model."""
        return self.stopped is None and all(self.answers.get(d, {}).get("ok") for d in self.canary + self.rest)

    def as_dict(self) -> dict[str, Any]:
        """For --json."""
        return {"sha256": self.sha256, "canary": self.canary, "rest": self.rest, "stopped": self.stopped,
                "offline": self.offline, "ok": self.ok, "took_s": self.took_s, "answers": self.answers}  # fmt: skip


def canary_count(spec: str, devices: int) -> int:
    """`3` or `10%` of `devices`: at least 1, at most all."""
    text = spec.strip()
    try:
        n = math.ceil(devices * float(text[:-1]) / 100) if text.endswith("%") else int(text)
    except ValueError as exc:
        raise EdgedError(f"--canary {spec!r}: a count or a share like 10%") from exc
    return max(1, min(devices, n))


def discover(fleet: FleetClient, group: str, timeout: float = 10.0) -> tuple[list[str], list[str]]:
    """The members of `group` from the devices' retained state: (online, offline), each sorted. A device is
    offline when its retained availability (`edged/<device>/status`) says so."""
    members: dict[str, float] = {}
    offline: set[str] = set()
    lock = threading.Condition()

    def on_state(_topic: str, body: dict[str, Any]) -> None:
        if group in (body.get("groups") or []):
            with lock:
                members[str(body.get("device"))] = time.monotonic()
                lock.notify_all()

    def on_availability(topic: str, body: dict[str, Any]) -> None:
        device = topic.split("/")[1]
        with lock:
            (offline.add if body.get("text") == "offline" else offline.discard)(device)

    started = time.monotonic()
    fleet.listen("edged/+/status", on_availability)
    fleet.listen("edged/+/state", on_state)
    with lock:  # retained messages come right after the grant: wait until they stop coming
        while True:
            last = max(members.values(), default=started)
            left = min(last + DISCOVERY_QUIET_S, started + timeout) - time.monotonic()
            if left <= 0:
                break
            lock.wait(left)
        return sorted(set(members) - offline), sorted(set(members) & offline)


@contextmanager
def serve_file(data: bytes, sha256: str, bind: str) -> Iterator[str]:
    """Serve the model at http://HOST:PORT/<sha256>.onnx while the rollout runs; yields the URL."""
    host, _, port = bind.rpartition(":")
    name = f"/{sha256}.onnx"

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != name:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
            pass

    server = http.server.ThreadingHTTPServer((host or "0.0.0.0", int(port)), Handler)  # noqa: S104 (operator's choice)
    thread = threading.Thread(target=server.serve_forever, name="edged-fleet-http", daemon=True)
    thread.start()
    try:
        yield f"http://{host or 'localhost'}:{server.server_address[1]}{name}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def publish_chunks(fleet: FleetClient, data: bytes, sha256: str) -> list[str]:
    """Leave the model retained in chunks (and its manifest); the topics, to clear afterwards."""
    topics = []
    chunks = [data[i : i + MQTT_CHUNK_BYTES] for i in range(0, len(data), MQTT_CHUNK_BYTES)] or [b""]
    for i, chunk in enumerate(chunks):
        topics.append(f"{MODELS_PREFIX}/{sha256}/{i}")
        fleet.client.publish(topics[-1], chunk, qos=1, retain=True).wait_for_publish(30)
    topics.append(f"{MODELS_PREFIX}/{sha256}/manifest")
    manifest = f'{{"chunks": {len(chunks)}, "size": {len(data)}}}'.encode()
    fleet.client.publish(topics[-1], manifest, qos=1, retain=True).wait_for_publish(30)
    return topics


def clear_retained(fleet: FleetClient, topics: list[str]) -> None:
    """An empty retained message removes each."""
    for topic in topics:
        fleet.client.publish(topic, b"", qos=1, retain=True).wait_for_publish(30)


def run_rollout(fleet: FleetClient, plan: RolloutPlan, progress: Progress) -> RolloutResult:
    """The whole rollout (see the module docstring)."""
    data = plan.model.read_bytes()
    sha256 = hashlib.sha256(data).hexdigest()
    devices, offline = (
        (discover(fleet, plan.group) if plan.group else ([], [])) if not plan.devices else (plan.devices, [])
    )
    if not devices:
        raise EdgedError(f"no device of group {plan.group!r} is online" if plan.group else "no device given")
    n = canary_count(plan.canary, len(devices))
    result = RolloutResult(sha256, devices[:n], devices[n:], offline=offline)
    started = time.monotonic()
    report, progress = progress, lambda line: report(f"{time.monotonic() - started:7.1f}s  {line}")
    if offline:
        progress(f"skipped, offline: {', '.join(offline)} (roll out to them when they are back)")

    def on_event(_topic: str, body: dict[str, Any]) -> None:
        name = str(body.get("event", ""))
        if name.startswith("model_") and body.get("sha256") == sha256:
            extra = body.get("reason") or body.get("why") or ""
            progress(f"{body.get('device')}: {name.removeprefix('model_')} {extra}".rstrip())

    fleet.listen("edged/+/events", on_event)
    progress(f"model {plan.model.name} sha256 {sha256[:16]}...: {len(devices)} device(s), canary {result.canary}")
    args = {**plan.device_args, "sha256": sha256, "signature": sign_file_digest(sha256, fleet.key), "via": plan.via}
    if plan.pipeline:
        args["pipeline"] = plan.pipeline
    with _offer(fleet, plan, data, sha256) as url:
        if url is not None:
            args["url"] = url
        for phase in (result.canary, result.rest):
            if not phase:
                continue
            _phase(fleet, phase, args, plan.wait_s, result)
            failed = [d for d in phase if not result.answers.get(d, {}).get("ok")]
            if failed:
                first = result.answers.get(failed[0], {})
                why = f"{first.get('reason')}: {first.get('detail')}" if first else "no answer"
                result.stopped = f"{len(failed)} of {len(phase)} device(s) did not keep the model ({failed[0]}: {why})"
                progress(f"stopped: {result.stopped}")
                break
            progress(f"{len(phase)} device(s) kept the model")
    result.took_s = round(time.monotonic() - started, 1)
    return result


@contextmanager
def _offer(fleet: FleetClient, plan: RolloutPlan, data: bytes, sha256: str) -> Iterator[str | None]:
    if plan.via == "mqtt":
        topics = publish_chunks(fleet, data, sha256)
        try:
            yield None
        finally:
            clear_retained(fleet, topics)
    elif plan.serve:
        with serve_file(data, sha256, plan.serve) as url:
            yield url
    elif plan.url:
        yield plan.url
    else:
        raise EdgedError("say where devices get the model: --serve HOST:PORT, --url URL or --via mqtt")


def _phase(fleet: FleetClient, devices: list[str], args: dict[str, Any], wait_s: float, result: RolloutResult) -> None:
    pending = {device: fleet.send(new_command("model", device, args)) for device in devices}
    deadline = time.monotonic() + wait_s
    for device, replies in pending.items():
        answers = fleet.wait(replies, expect=1, timeout=max(0.0, deadline - time.monotonic()))
        if device in answers:
            result.answers[device] = answers[device]
