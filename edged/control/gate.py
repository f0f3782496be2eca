"""The gate every remote command passes before anything runs: size, signature, schema, target, age, replay.

In that order, cheapest first: a message over `max_bytes` is refused unread; the signature is checked on
the parsed object before its fields mean anything (a tampered field is a bad signature, not a schema
error); then the fields; then the target and the command name must match the topic it came on (a command
signed for one device cannot be replayed to another); the timestamp must be within `max_age_s` of now;
and its nonce must be new. Nonces are kept for `max_age_s` in `<state_dir>/control-nonces.json`, so a
restart does not reopen the window. Every refusal has a reason key and is counted.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from edged.control.envelope import GROUP, Envelope, device_prefix, group_prefix
from edged.control.names import CommandName
from edged.control.settings import ControlConfig
from edged.core.durable import read_json, write_atomic
from edged.core.errors import CommandError, InputError
from edged.core.safejson import loads_object
from edged.core.signing import load_public_key, verify

log = logging.getLogger(__name__)

ArgsCheck = Callable[[str, dict[str, Any]], object]
NONCES_KEPT = 100_000  # bounded memory even under a flood of valid commands


@dataclass(frozen=True)
class Command:
    """A command that passed the gate."""

    name: CommandName
    id: str
    target: str
    args: dict[str, Any]
    response_topic: str | None = None
    correlation: bytes | None = None


@dataclass
class GateCounters:
    """What the gate let through and refused, by reason."""

    accepted: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    last_refusal: str | None = None


class CommandGate:
    """Checks command messages for one device (thread-safe: paho's thread and the control thread)."""

    def __init__(self, cfg: ControlConfig, device_id: str, state_dir: Path) -> None:
        self.cfg = cfg
        self.device_id = device_id
        self.keys = [load_public_key(k) for k in cfg.public_keys]
        self.counters = GateCounters()
        self._lock = threading.Lock()
        self._nonce_path = state_dir / "control-nonces.json"
        self._refuse_before = 0.0  # set when the replay memory was lost: commands signed before are refused
        self._nonces = self._load_nonces()
        self._prefixes = {device_prefix(device_id, cfg.cmd_topic): device_id}
        for group in cfg.groups:
            self._prefixes[group_prefix(group, device_id, cfg.group_topic)] = f"{GROUP}{group}"

    def topics(self) -> list[str]:
        """The topic filters to subscribe to."""
        return [f"{prefix}/+" for prefix in self._prefixes]

    def admit(self, topic: str, payload: bytes, *, response_topic: str | None = None,
              correlation: bytes | None = None, now: float | None = None,
              check_args: ArgsCheck | None = None) -> Command:  # fmt: skip
        """The command, or CommandError with the reason (counted either way). `check_args(name, args)`
        validates the arguments (raising CommandError `malformed`) before the command counts as accepted."""
        try:
            command = self._check(topic, payload, time.time() if now is None else now)
            if check_args is not None:
                check_args(command.cmd, command.args)
        except CommandError as exc:
            self.count_refusal(exc, topic)
            raise
        with self._lock:
            self.counters.accepted += 1
        return Command(command.cmd, command.id, command.target, command.args, response_topic, correlation)

    def count_refusal(self, exc: CommandError, where: str) -> None:
        """Count a refusal by its reason (the gate's own, or a command's: a model whose hash is wrong)."""
        with self._lock:
            self.counters.refused[exc.reason] = self.counters.refused.get(exc.reason, 0) + 1
            self.counters.last_refusal = f"{exc.reason}: {exc}"
        log.warning("control: command on %s refused (%s): %s", where, exc.reason, exc)

    def snapshot(self) -> dict[str, Any]:
        """The `control` entry of the status JSON."""
        with self._lock:
            c = self.counters
            return {"accepted": c.accepted, "refused": dict(c.refused), "last_refusal": c.last_refusal}

    # -- the checks ----------------------------------------------------------------------------------------

    def _check(self, topic: str, payload: bytes, now: float) -> Envelope:
        if len(payload) > self.cfg.max_bytes:
            raise CommandError("too_large", f"{len(payload)} bytes; commands are at most {self.cfg.max_bytes}")
        try:  # bounded: size, depth, finite numbers, no NUL (core/safejson.py); never a RecursionError
            raw = loads_object(payload, max_bytes=self.cfg.max_bytes, what="command")
        except InputError as exc:
            raise CommandError("malformed", f"{exc.reason}: {exc}") from None
        verify(raw, self.keys)  # unsigned / bad_signature
        try:
            env = Envelope.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise CommandError("malformed", f"{where}: {first['msg']}") from None
        self._check_route(topic, env)
        if not math.isfinite(env.ts) or abs(now - env.ts) > self.cfg.max_age_s:  # NaN would pass the window
            age = now - env.ts
            raise CommandError("stale", f"signed {age:.0f} s ago; the window is ±{self.cfg.max_age_s:g} s")
        self._check_nonce(env.nonce, env.ts, now)
        return env

    def _check_route(self, topic: str, env: Envelope) -> None:
        prefix, _, name = topic.rpartition("/")
        target = self._prefixes.get(prefix)
        if target is None or env.target != target:
            raise CommandError("wrong_target", f"signed for {env.target!r}, arrived on {topic!r}")
        if name != env.cmd:
            raise CommandError("wrong_target", f"a {env.cmd!r} command on the {name!r} topic")
        if env.cmd not in self.cfg.commands:
            raise CommandError("not_allowed", f"this device does not take {env.cmd!r} (control.commands)")

    def _check_nonce(self, nonce: str, ts: float, now: float) -> None:
        with self._lock:
            horizon = now - self.cfg.max_age_s
            if len(self._nonces) >= NONCES_KEPT or next(iter(self._nonces.values()), now) < horizon:
                self._nonces = {n: t for n, t in self._nonces.items() if t >= horizon}
            if nonce in self._nonces:
                raise CommandError("replayed", "this nonce was used already")
            if ts < self._refuse_before:
                raise CommandError("replayed", "signed before the device lost its replay memory; sign it again")
            if len(self._nonces) >= NONCES_KEPT:
                raise CommandError("busy", "too many commands within the window")
            self._nonces[nonce] = max(ts, now)
            self._save_nonces()

    def _load_nonces(self) -> dict[str, float]:
        if not self._nonce_path.exists():
            return {}
        data = read_json(self._nonce_path, "control nonces")  # written atomically; torn only by hand
        if not isinstance(data, dict):
            # an unreadable file must not reopen the replay window silently: refuse until it ages out
            log.warning("control: %s unreadable; commands older than now are refused", self._nonce_path)
            self._refuse_before = time.time()
            return {}
        horizon = time.time() - self.cfg.max_age_s
        try:
            return {str(n): float(t) for n, t in data.items() if float(t) >= horizon}
        except (TypeError, ValueError):
            self._refuse_before = time.time()
            return {}

    def _save_nonces(self) -> None:
        # fsync'd before the command runs: after a power cut a command already run is still a replay
        write_atomic(self._nonce_path, json.dumps(self._nonces).encode("utf-8"))
