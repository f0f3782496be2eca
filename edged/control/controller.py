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

The command path, each part one module: gate.py (signature, replay, target, size) → dispatch.py (the
arguments' model and handler by name) → handlers/NAME.py (what the command does, with context.py's
`CommandContext`) → the answer, here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edged import __version__
from edged.control.chunkfetch import ChunkFetch
from edged.control.context import CommandContext, ControlTarget, SideSender
from edged.control.dispatch import dispatch, parse_args
from edged.control.gate import Command, CommandGate
from edged.control.jobs import JobSlot
from edged.control.settings import ControlConfig
from edged.control.statereport import StateReporter
from edged.control.trial import Recovered
from edged.core.errors import CommandError, EdgedError
from edged.core.threads import Restart, Supervised
from edged.uplink.hooks import Hook, Incoming, Session
from edged.uplink.mqttclient import TokenBucket
from edged.uplink.sidechannel import SideMessage

log = logging.getLogger(__name__)

QUEUE_MAX = 16  # command messages waiting at most; beyond, they are refused as `busy`
MAX_RESPONSE_TOPIC = 1024  # characters of an MQTT 5 response topic edged answers on
BUSY_ANSWER_EVERY_S = 1.0  # refusals of a full queue are answered at most this often (all are counted)
REFUSAL_ANSWERS_PER_S = 5.0  # refusals before a command could be trusted: answered at most this often ...
REFUSAL_ANSWERS_BURST = 20.0  # ... after a burst of this many (an operator's mistakes all get theirs)
REFUSALS = frozenset({"bad_model_signature", "hash_mismatch", "too_large", "malformed"})  # counted as refused
ROLLOUT_OUTCOMES = {"validation_failed": "rejected", "too_slow": "rejected", "check_failed": "rejected",
                    "rolled_back": "rolled_back"}  # fmt: skip

__all__ = ["ControlTarget", "Controller", "SideSender"]


class Controller(Supervised, Hook):
    """The `edged-control` thread, riding on the publisher's connection as a hook (uplink/hooks.py): the gate,
    then the dispatcher (dispatch.py, handlers/) on this thread for `status` and on the job thread for the
    others (jobs.py); answers on the response topic and the replies topic, events and the retained state
    through statereport.py."""

    def __init__(
        self,
        cfg: ControlConfig,
        device_id: str,
        state_dir: Path,
        *,
        target: ControlTarget,
        side: SideSender | None,
        last_step: Callable[[], dict[str, float] | None] | None = None,
        recovered: Recovered | None = None,
    ) -> None:
        """`last_step()`: the device's latest wall-clock step (`by_s`, `at`), to say why a command is stale;
        `recovered`: a rollout's trial rolled back at this start (told once connected)."""
        # restarts after a death: the queue, the gate and its nonces are the object's, so a new body goes on
        # where the old one stopped (_take answers any one message's failure as `internal`: a death is a bug)
        super().__init__("edged-control", restart=Restart())
        self.cfg = cfg
        self.device_id = device_id
        self.gate = CommandGate(cfg, device_id, state_dir)
        self.side = side  # None: nothing goes out (a controller tested alone)
        self.state = StateReporter(cfg, device_id, target, side)
        self.chunks = ChunkFetch(side, state_dir)
        self.context = CommandContext(cfg, state_dir, target, self.state.event, self.chunks.fetch)
        self.jobs = JobSlot()
        self._queue: queue.Queue[tuple[str, bytes, str | None, bytes | None] | None] = queue.Queue(QUEUE_MAX)
        self._lock = threading.Lock()
        self._busy = 0
        self._busy_answered = -BUSY_ANSWER_EVERY_S
        # refusals of commands that cannot be trusted are answered within a budget (the rest only counted)
        self._refusal_answers = TokenBucket(REFUSAL_ANSWERS_PER_S, burst=REFUSAL_ANSWERS_BURST)
        self.unanswered = 0
        self._last_step = last_step
        self._recovered = recovered
        self._started_sent = False
        self._listening = False  # the broker granted the command subscriptions on the current connection
        self.rollouts = {"kept": 0, "rejected": 0, "rolled_back": 0}

    # -- on the connection (paho's thread and the edged-mqtt thread) -------------------------------------

    def message(self, message: Incoming) -> None:
        """A message on a command topic or a rollout's chunk topic (paho's thread): queued, see deliver()."""
        if message.topic is None:  # a broker that lets a topic which is not UTF-8 through: not a command topic
            log.warning("control: a message on a topic that is not UTF-8 was dropped")
            return
        response, correlation = message.response_topic, message.correlation
        if response is None or len(response) > MAX_RESPONSE_TOPIC or any(c in response for c in "+#\0"):
            response, correlation = None, None  # no answer to a topic that is no topic (a filter, too long)
        self.deliver(message.topic, message.payload, response, correlation)

    def topics(self) -> list[str]:
        """Command topic filters: this device's and its groups'."""
        return self.gate.topics()

    def deliver(self, topic: str, payload: bytes, response_topic: str | None, correlation: bytes | None) -> None:
        """Queue a command message; a full queue refuses it at once (never blocks paho). A rollout's model
        chunks go straight to its download."""
        if self.chunks.wants(topic):
            self.chunks.offer(topic, payload)
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

    def listening(self, on: bool | None) -> None:
        """Commands can arrive (the broker granted the subscriptions), or not (refused, or the connection is
        gone: None)."""
        with self._lock:
            self._listening = bool(on)

    def connected(self, session: Session) -> None:
        """A connection is up: the command topics subscribed (status says when the broker granted them), the
        retained state again, and `started` once."""
        session.subscribe(self.topics(), self.listening, self.message, on="cmd")
        if not self._started_sent:
            self._started_sent = True
            self.state.event("started", version=__version__)
            if self._recovered is not None:  # a rollout the last run could not finish: rolled back at this start
                tell_recovered(self.state, self._recovered)
                with self._lock:
                    self.rollouts["rolled_back"] += 1
                self._recovered = None
        self.chunks.resubscribe()
        self.state.report(force=True)

    def report_state(self) -> None:
        """Publish the retained state if it changed (the daemon's timer)."""
        self.state.report()

    def stop(self, timeout: float) -> None:
        """Finish the command in progress (within `timeout`; a rollout's watch ends early), then end."""
        deadline = time.monotonic() + timeout
        self.end_restarts()
        self.context.stopping.set()
        tap = self.context.tap
        if tap is not None:
            tap.cancel()
        self._queue.put(None)
        if self.is_alive():
            self.join(timeout)
        self.jobs.join(deadline - time.monotonic())

    # -- the threads -------------------------------------------------------------------------------------

    def body(self) -> None:
        """Check each command as it comes, until stopped."""
        while True:
            item = self._queue.get()  # asleep until a command comes
            if item is None:
                return
            self._take(*item)

    def _take(self, topic: str, payload: bytes, response_topic: str | None, correlation: bytes | None) -> None:
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
                topic, payload, response_topic=response_topic, correlation=correlation, check_args=parse_args
            )
        except CommandError as exc:  # no id to echo (unsigned, tampered...): the sender knows its bytes' hash
            with self._lock:
                answer = self._refusal_answers.allow() >= 1
                if answer:
                    self._refusal_answers.take(1)
                else:
                    self.unanswered += 1
            if answer:
                step = self._last_step() if self._last_step is not None and exc.reason == "stale" else None
                detail = str(exc) + stepped_note(step, self.cfg.max_age_s)
                self._answer(None, response_topic, correlation, ok=False, reason=exc.reason, detail=detail,
                             command_sha256=hashlib.sha256(payload).hexdigest())  # fmt: skip
            return
        if command.name == "status":  # read-only and quick: answered even while a job runs
            self._run(command, topic, response_topic, correlation, started)
            return
        busy = self.jobs.start(
            f"{command.name} (id {command.id})",
            started,
            lambda: self._run(command, topic, response_topic, correlation, started, job=True),
            lambda why: self._answer(
                command, response_topic, correlation, ok=False, reason="failed", detail=f"internal error: {why}"
            ),
        )
        if busy is not None:
            with self._lock:
                self._busy += 1
            log.info("control: %s refused: %s", command.name, busy)
            self._answer(command, response_topic, correlation, ok=False, reason="busy", detail=busy)

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
        if job:  # one job at a time: the running one's id (a rollout's trial keeps it, control/trial.py)
            self.context.command = (command.id, response_topic)
        try:
            try:
                ok, detail = dispatch(command.name, command.args, self.context)
            finally:
                if job:
                    self.jobs.done()
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
        self.state.report()

    def _count_rollout(self, name: str, reason: str | None) -> None:
        outcome = "kept" if reason == "kept" else ROLLOUT_OUTCOMES.get(reason or "")
        if name == "model" and outcome is not None:
            with self._lock:
                self.rollouts[outcome] += 1

    def _answer(self, command: Command | None, response_topic: str | None, correlation: bytes | None,
                **fields: Any) -> None:  # fmt: skip
        body = {"v": 1, "device": self.device_id, "ts": round(time.time(), 3), "event": "command",
                "cmd": command.name if command else None, "id": command.id if command else None, **fields}  # fmt: skip
        payload = json.dumps(body, default=str).encode("utf-8")
        if self.side is None:
            return
        if response_topic and command is not None:  # an unauthenticated sender gets no private reply
            self.side.send(SideMessage(response_topic, payload, correlation=correlation))
        self.side.send(SideMessage(self.state.replies_topic, payload))

    def snapshot(self) -> dict[str, Any]:
        """The `control` entry of the status JSON."""
        snap = self.gate.snapshot()
        with self._lock:
            if self._busy:
                snap["refused"]["busy"] = snap["refused"].get("busy", 0) + self._busy
            snap["rollouts"] = dict(self.rollouts)
            snap["listening"] = self._listening
            snap["unanswered"] = self.unanswered
        snap["topics"] = self.topics()
        return snap


def stepped_note(step: dict[str, float] | None, max_age_s: float) -> str:
    """What a stale refusal adds when this device's own clock stepped lately (`step`: its `by_s`, `at`): the
    device's `now` moved, not the command's."""
    if not step or time.time() - float(step.get("at", 0.0)) > 2 * max_age_s:
        return ""
    ago = max(0.0, time.time() - float(step["at"]))
    return (f"; this device's clock stepped by {float(step['by_s']):+.0f} s {ago:.0f} s ago: a command signed "
            "before the step is measured against the new time (sign it again)")  # fmt: skip


def tell_recovered(state: StateReporter, recovered: Recovered) -> None:
    """A rollout the last run could not finish (it died during the watch), rolled back at this start: the event,
    and the answer its command never got (`edged fleet rollout` may still wait for it)."""
    t = recovered.trial
    state.event("model_rolled_back", pipeline=t.pipeline, sha256=t.sha256, reason=recovered.why, at_start=True)
    body = {"v": 1, "device": state.device_id, "ts": round(time.time(), 3), "event": "command", "cmd": "model",
            "id": t.command_id or None, **recovered.answer()}  # fmt: skip
    payload = json.dumps(body, default=str).encode("utf-8")
    if state.side is not None:
        if t.response_topic:
            state.side.send(SideMessage(t.response_topic, payload))
        state.side.send(SideMessage(state.replies_topic, payload))
