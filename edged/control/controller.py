"""The control plane on the device: signed commands in, results and events out, the retained state.

    paho's thread ──deliver()──▶ (bounded queue) ──▶ edged-control thread: gate ─▶ status: answered at once
                                                                              └─▶ others: edged-control-job

The `edged-control` thread checks every command (signature, replay, arguments) as it comes. `status`
is answered there and then; every other command runs on the `edged-control-job` thread, one at a time,
so a slow one (a reload with a model build, a recording, a rollout) never holds up MQTT, the pipelines
or a `status`. A command that comes while a job runs is answered `busy` at once, naming what runs and
for how long, instead of waiting behind it. Each one is answered: on the MQTT 5 response topic
when the command named one (with its correlation data), and always as an event on
`edged/{device_id}/events`. The reported state (`edged/{device_id}/state`, retained) goes on every
connect, after every command and whenever health changes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import queue
import threading
import time
from pathlib import Path
from typing import Any, Protocol

import paho.mqtt.client as paho
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from edged import __version__
from edged.control.gate import Command, CommandGate
from edged.control.modelfetch import MQTT_PREFIX, ChunkCollector, write_chunks
from edged.control.remoteconfig import apply_remote_config, restore_config
from edged.control.rollout import Rollout, RolloutTarget
from edged.control.rolloutspec import ModelArgs
from edged.control.settings import ControlConfig
from edged.core.errors import CommandError, EdgedError
from edged.core.threads import Restart, Supervised
from edged.pipeline.frametap import FrameTap, save_frames
from edged.uplink.hooks import Hook, Session
from edged.uplink.mqttclient import topic_for
from edged.uplink.sidechannel import SideMessage

log = logging.getLogger(__name__)

QUEUE_MAX = 16  # command messages waiting at most; beyond, they are refused as `busy`
MAX_RESPONSE_TOPIC = 1024  # characters of an MQTT 5 response topic edged answers on
BUSY_ANSWER_EVERY_S = 1.0  # refusals of a full queue are answered at most this often (all are counted)
REFUSALS = frozenset({"bad_model_signature", "hash_mismatch", "too_large", "malformed"})  # counted as refused
ROLLOUT_OUTCOMES = {"validation_failed": "rejected", "too_slow": "rejected", "check_failed": "rejected",
                    "rolled_back": "rolled_back"}  # fmt: skip
RELOAD_WAIT_S = 120.0
Handler = Any


class ControlTarget(RolloutTarget, Protocol):
    """What the control plane needs of the daemon: what a rollout needs (status, reload, config file,
    frame taps, pipeline configs) is all of it."""


class SideSender(Protocol):
    """Where replies, events and the state go (the publisher's side channel)."""

    def send(self, message: SideMessage) -> None:
        """Queue one message."""
        ...


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NoArgs(_Args):
    """reload, status."""


class ConfigArgs(_Args):
    """config: a partial config merged into the file, or the whole file with `replace`."""

    config: dict[str, Any]
    replace: bool = False


class RecordArgs(_Args):
    """record: save frames the model sees to <state_dir>/records/<pipeline>-<time>.npz."""

    pipeline: str | None = None
    frames: int = Field(50, ge=1, le=500)
    every: int = Field(1, ge=1, le=1000)
    timeout_s: float = Field(60.0, gt=0, le=600)


class Controller(Supervised, Hook):
    """The `edged-control` thread, riding on the publisher's connection as a hook (uplink/hooks.py)."""

    def __init__(
        self, cfg: ControlConfig, device_id: str, state_dir: Path, *, target: ControlTarget, side: SideSender | None
    ) -> None:
        # restarts after a death: the queue, the gate and its nonces are the object's, so a new body goes on
        # where the old one stopped (_handle answers any one message's failure as `internal`: a death is a bug)
        super().__init__("edged-control", restart=Restart())
        self.cfg = cfg
        self.device_id = device_id
        self.state_dir = state_dir
        self.target = target
        self.gate = CommandGate(cfg, device_id, state_dir)
        self.side = side  # None: nothing goes out (a controller tested alone)
        self.replies_topic = topic_for(cfg.replies_topic, device_id)
        self.state_topic = topic_for(cfg.state_topic, device_id)
        self._queue: queue.Queue[tuple[str, bytes, str | None, bytes | None] | None] = queue.Queue(QUEUE_MAX)
        self._lock = threading.Lock()
        self._busy = 0
        self._busy_answered = -BUSY_ANSWER_EVERY_S
        self._job: Supervised | None = None  # the command running on edged-control-job, if any (busy until answered)
        self._job_thread: Supervised | None = None  # its thread, until it ended (a stop waits for it)
        self._job_what = ""
        self._job_since = 0.0
        self._tap: FrameTap | None = None  # the one a `record` waits on: a stop ends the recording early
        self._last_state: str | None = None
        self._started_sent = False
        self._listening = False  # the broker granted the command subscriptions on the current connection
        self._stopping = threading.Event()
        self._collector: ChunkCollector | None = None
        self.rollouts = {"kept": 0, "rejected": 0, "rolled_back": 0}
        self._handlers: dict[str, tuple[type[BaseModel], Handler]] = {
            "status": (NoArgs, self._status),
            "reload": (NoArgs, self._reload),
            "config": (ConfigArgs, self._config),
            "record": (RecordArgs, self._record),
            "model": (ModelArgs, self._model),
        }

    # -- on the connection (paho's thread and the edged-mqtt thread) -------------------------------------

    def message(self, message: paho.MQTTMessage) -> None:
        """A message on a command topic or a rollout's chunk topic (paho's thread): queued, see deliver()."""
        props = getattr(message, "properties", None)
        response = getattr(props, "ResponseTopic", None) if props is not None else None
        correlation = getattr(props, "CorrelationData", None) if props is not None else None
        try:
            topic = message.topic
        except UnicodeDecodeError:  # a broker that lets a topic which is not UTF-8 through: not a command topic
            log.warning("control: a message on a topic that is not UTF-8 was dropped")
            return
        if not isinstance(response, str) or len(response) > MAX_RESPONSE_TOPIC or any(c in response for c in "+#\0"):
            response, correlation = None, None  # no answer to a topic that is no topic (a filter, too long)
        self.deliver(topic, bytes(message.payload), response, correlation)

    def topics(self) -> list[str]:
        """Command topic filters: this device's and its groups'."""
        return self.gate.topics()

    def deliver(self, topic: str, payload: bytes, response_topic: str | None, correlation: bytes | None) -> None:
        """Queue a command message; a full queue refuses it at once (never blocks paho). A rollout's model
        chunks go straight to its collector."""
        if topic.startswith(MQTT_PREFIX + "/"):
            collector = self._collector
            if collector is not None and topic.startswith(f"{MQTT_PREFIX}/{collector.sha256}/"):
                collector.offer(topic, payload)
            return
        try:
            self._queue.put_nowait((topic, payload, response_topic, correlation))
        except queue.Full:
            now = time.monotonic()
            with self._lock:
                self._busy += 1
                answer = now - self._busy_answered >= BUSY_ANSWER_EVERY_S  # a flood gets one answer a second
                if answer:
                    self._busy_answered = now
            log.warning("control: %d commands wait already; one on %s refused (busy)", QUEUE_MAX, topic)
            if answer:  # unread (reading it is what is overloaded): no id to echo
                self._answer(None, None, None, ok=False, reason="busy",
                             detail=f"{QUEUE_MAX} commands wait already; send it again later")  # fmt: skip

    def listening(self, on: bool) -> None:
        """Commands can arrive (the broker granted the subscriptions), or not (the connection is gone)."""
        with self._lock:
            self._listening = on

    def connected(self, session: Session) -> None:
        """A connection is up: the command topics subscribed (status says when the broker granted them), the
        retained state again, and `started` once."""
        session.subscribe(self.topics(), self.listening)
        if not self._started_sent:
            self._started_sent = True
            self.event("started", version=__version__)
        collector = self._collector
        if collector is not None and self.side is not None:  # a new connection: subscribe to the chunks again
            self.side.send(SideMessage(f"{MQTT_PREFIX}/{collector.sha256}/#", b"", op="subscribe"))
        self.report_state(force=True)

    def stop(self, timeout: float) -> None:
        """Finish the command in progress (within `timeout`; a rollout's watch ends early), then end."""
        deadline = time.monotonic() + timeout
        self.end_restarts()
        self._stopping.set()
        tap = self._tap
        if tap is not None:
            tap.cancel()
        self._queue.put(None)
        if self.is_alive():
            self.join(timeout)
        job = self._job_thread
        if job is not None and job.is_alive():
            job.join(max(0.0, deadline - time.monotonic()))

    # -- the threads -------------------------------------------------------------------------------------

    def body(self) -> None:
        """Check each command as it comes, until stopped."""
        while True:
            item = self._queue.get()  # asleep until a command comes
            if item is None:
                return
            self._handle(*item)

    def _handle(self, topic: str, payload: bytes, response_topic: str | None, correlation: bytes | None) -> None:
        """One command message, whatever it holds: every failure is caught here, counted and answered, so no
        message can end this thread."""
        try:
            self._admit_and_run(topic, payload, response_topic, correlation)
        except Exception as exc:  # a bug meets an input nobody foresaw: answer it and take the next one
            log.exception("control: a command on %s failed unexpectedly", topic)
            self.gate.count_refusal(CommandError("internal", f"{type(exc).__name__}: {exc}"), topic)
            self._answer(None, None, None, ok=False, reason="internal", detail=f"internal error: {type(exc).__name__}",
                         command_sha256=hashlib.sha256(payload).hexdigest())  # fmt: skip

    def _admit_and_run(self, topic: str, payload: bytes, response_topic: str | None, correlation: bytes | None) -> None:
        started = time.monotonic()
        try:
            command = self.gate.admit(
                topic, payload, response_topic=response_topic, correlation=correlation, check_args=self._parse_args
            )
        except CommandError as exc:  # no id to echo (unsigned, tampered...): the sender knows its bytes' hash
            self._answer(None, response_topic, correlation, ok=False, reason=exc.reason, detail=str(exc),
                         command_sha256=hashlib.sha256(payload).hexdigest())  # fmt: skip
            return
        if command.name == "status":  # read-only and quick: answered even while a job runs
            self._run(command, topic, response_topic, correlation, started)
            return
        busy = self._start_job(command, topic, response_topic, correlation, started)
        if busy is not None:
            log.info("control: %s refused: %s", command.name, busy)
            self._answer(command, response_topic, correlation, ok=False, reason="busy", detail=busy)

    def _start_job(
        self, command: Command, topic: str, response_topic: str | None, correlation: bytes | None, started: float
    ) -> str | None:
        """Start the command on a new edged-control-job thread; or, while one runs, say what runs (and the
        command is not started)."""
        with self._lock:
            job = self._job
            if job is not None and job.is_alive():
                self._busy += 1
                took = started - self._job_since
                return f"busy with {self._job_what} for {took:.0f} s; send it again once that is answered"
            self._job_what, self._job_since = f"{command.name} (id {command.id})", started
            job = self._job = self._job_thread = Supervised(
                "edged-control-job",
                target=lambda: self._run(command, topic, response_topic, correlation, started, job=True),
                on_death=lambda why: self._answer(
                    command, response_topic, correlation, ok=False, reason="failed", detail=f"internal error: {why}"
                ),
            )
        job.start()
        return None

    def _run(
        self,
        command: Command,
        topic: str,
        response_topic: str | None,
        correlation: bytes | None,
        started: float,
        *,
        job: bool = False,
    ) -> None:
        """Run an admitted command and answer it (a job is over before its answer goes: whoever reads the answer
        may send the next command at once, and must not find this one still busy)."""
        _, handler = self._handlers[command.name]
        try:
            try:
                ok, detail = handler(self._parse_args(command.name, command.args))
            finally:
                if job:
                    with self._lock:
                        self._job = None
        except CommandError as exc:
            if exc.reason in REFUSALS:
                self.gate.count_refusal(exc, topic)
            self._count_rollout(command.name, exc.reason)
            self._answer(command, response_topic, correlation, ok=False, reason=exc.reason, detail=str(exc),
                         **({"report": exc.detail} if exc.detail is not None else {}))  # fmt: skip
        except EdgedError as exc:
            self._answer(command, response_topic, correlation, ok=False, reason="failed", detail=str(exc))
        else:
            took = round(time.monotonic() - started, 3)
            self._count_rollout(command.name, "kept" if ok and command.name == "model" else None)
            self._answer(command, response_topic, correlation, ok=ok, reason=None if ok else "failed",
                         detail=detail, took_s=took)  # fmt: skip
        self.report_state()

    def _count_rollout(self, name: str, reason: str | None) -> None:
        outcome = "kept" if reason == "kept" else ROLLOUT_OUTCOMES.get(reason or "")
        if name == "model" and outcome is not None:
            with self._lock:
                self.rollouts[outcome] += 1

    def _parse_args(self, name: str, args: dict[str, Any]) -> BaseModel:
        model, _ = self._handlers[name]
        try:
            return model.model_validate(args)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise CommandError("malformed", f"args.{'.'.join(map(str, first['loc']))}: {first['msg']}") from None

    def _answer(self, command: Command | None, response_topic: str | None, correlation: bytes | None,
                **fields: Any) -> None:  # fmt: skip
        body = {"v": 1, "device": self.device_id, "ts": round(time.time(), 3), "event": "command",
                "cmd": command.name if command else None, "id": command.id if command else None, **fields}  # fmt: skip
        payload = json.dumps(body, default=str).encode("utf-8")
        if self.side is None:
            return
        if response_topic and command is not None:  # an unauthenticated sender gets no private reply
            self.side.send(SideMessage(response_topic, payload, correlation=correlation))
        self.side.send(SideMessage(self.replies_topic, payload))

    # -- events and state --------------------------------------------------------------------------------

    def event(self, name: str, **fields: Any) -> None:
        """A lifecycle event on the events topic (started, degraded, recovered, reloaded, ...)."""
        if self.side is None:
            return
        body = {"v": 1, "device": self.device_id, "ts": round(time.time(), 3), "event": name, **fields}
        self.side.send(SideMessage(self.replies_topic, json.dumps(body, default=str).encode("utf-8")))

    def reported_state(self) -> dict[str, Any]:
        """The retained state: what runs here (no timestamp inside, so an unchanged state is not re-sent)."""
        snap = self.target.snapshot()
        path = self.target.config_file()
        try:
            config_sha = hashlib.sha256(path.read_bytes()).hexdigest() if path else None
        except OSError:
            config_sha = None
        pipelines = [{"name": p["name"], "model": p.get("model"), "provider": p.get("provider"),
                      "state": p.get("state")} for p in snap.get("pipelines", [])]  # fmt: skip
        return {"v": 1, "device": self.device_id, "version": snap.get("version"), "health": snap.get("state"),
                "reasons": snap.get("reasons", []), "config_sha256": config_sha, "groups": self.cfg.groups,
                "pipelines": pipelines}  # fmt: skip

    def report_state(self, *, force: bool = False) -> None:
        """Publish the retained state if it changed (or `force`); a health change is also an event."""
        if self.side is None:
            return
        state = self.reported_state()
        text = json.dumps(state, sort_keys=True, default=str)
        with self._lock:
            previous, self._last_state = self._last_state, text
        if previous is not None:
            was = json.loads(previous).get("health")
            if was != state["health"] and state["health"] in ("degraded", "running"):
                self.event("degraded" if state["health"] == "degraded" else "recovered", reasons=state["reasons"])
        if force or text != previous:
            self.side.send(SideMessage(self.state_topic, text.encode("utf-8"), retain=True))

    def snapshot(self) -> dict[str, Any]:
        """The `control` entry of the status JSON."""
        snap = self.gate.snapshot()
        with self._lock:
            if self._busy:
                snap["refused"]["busy"] = snap["refused"].get("busy", 0) + self._busy
            snap["rollouts"] = dict(self.rollouts)
            snap["listening"] = self._listening
        snap["topics"] = self.topics()
        return snap

    # -- the commands ------------------------------------------------------------------------------------

    def _status(self, _args: NoArgs) -> tuple[bool, Any]:
        return True, self.target.snapshot()

    def _reload(self, _args: NoArgs) -> tuple[bool, Any]:
        result = self.target.reload_and_wait(RELOAD_WAIT_S)
        return result.get("result") == "applied", result

    def _config(self, args: ConfigArgs) -> tuple[bool, Any]:
        path = self.target.config_file()
        if path is None:
            raise CommandError("failed", "this daemon was not started from a config file")
        previous = apply_remote_config(path, args.config, replace=args.replace, check=self.target.check_config)
        result = self.target.reload_and_wait(RELOAD_WAIT_S)
        if result.get("result") in ("rejected", "failed"):  # the file passed the check but does not run here
            restore_config(path, previous)
            again = self.target.reload_and_wait(RELOAD_WAIT_S)  # what a partial apply changed goes back too
            raise CommandError(
                "rolled_back",
                f"the new config did not reload ({'; '.join(map(str, result.get('notes') or []))}); the previous "
                "file is back",
                detail={"reload": result, "after_rollback": again},
            )
        return result.get("result") == "applied", result

    def _record(self, args: RecordArgs) -> tuple[bool, Any]:
        name, tap = self.target.frame_tap(args.pipeline)
        self._tap = tap
        try:
            if self._stopping.is_set():
                raise CommandError("failed", "the daemon is stopping")
            frames = tap.record(args.frames, args.every, args.timeout_s, name)
        finally:
            self._tap = None
        folder = self.state_dir / "records"
        folder.mkdir(mode=0o750, exist_ok=True)
        path = save_frames(folder / f"{name}-{time.strftime('%Y%m%dT%H%M%S')}.npz", frames)
        return True, {"path": str(path), "frames": len(frames), "complete": len(frames) >= args.frames}

    def _model(self, args: ModelArgs) -> tuple[bool, Any]:
        rollout = Rollout(args, target=self.target, public_keys=self.cfg.public_keys, state_dir=self.state_dir,
                          max_bytes=self.cfg.model_max_bytes, event=self.event, fetch_chunks=self._fetch_chunks,
                          stopping=self._stopping, ca_file=self.cfg.model_ca_file)  # fmt: skip
        return rollout.run()

    def _fetch_chunks(self, sha256: str, max_bytes: int, timeout: float) -> Path:
        """A model's retained chunks through the publisher's connection (subscribed for the download only)."""
        if self.side is None:
            raise CommandError("failed", "no MQTT connection to fetch the model over")
        collector = ChunkCollector(sha256, max_bytes)
        topic = f"{MQTT_PREFIX}/{sha256}/#"
        self._collector = collector
        self.side.send(SideMessage(topic, b"", op="subscribe"))
        try:
            collector.done.wait(timeout)
        finally:
            self._collector = None
            self.side.send(SideMessage(topic, b"", op="unsubscribe"))
        return write_chunks(collector, self.state_dir / "models", max_bytes=max_bytes)
