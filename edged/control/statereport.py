"""What the device tells its fleet without being asked: lifecycle events (started, degraded, recovered,
reloaded, a rollout's steps) and the retained state (`edged/{device_id}/state`): what runs here, sent on
every connect, after every command and whenever it changes; a change of health is also an event."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from typing import Any

from edged.control.context import ControlTarget, SideSender
from edged.control.settings import ControlConfig
from edged.uplink.mqttclient import topic_for
from edged.uplink.sidechannel import SideMessage


class StateReporter:
    """Events and the retained state, through the side channel (None: nothing goes out)."""

    def __init__(self, cfg: ControlConfig, device_id: str, target: ControlTarget, side: SideSender | None) -> None:
        self.cfg = cfg
        self.device_id = device_id
        self.target = target
        self.side = side
        self.replies_topic = topic_for(cfg.replies_topic, device_id)
        self.state_topic = topic_for(cfg.state_topic, device_id)
        self._lock = threading.Lock()
        self._last: str | None = None

    def event(self, name: str, **fields: Any) -> None:
        """A lifecycle event on the replies topic (started, degraded, recovered, reloaded, ...)."""
        if self.side is None:
            return
        body = {"v": 1, "device": self.device_id, "ts": round(time.time(), 3), "event": name, **fields}
        self.side.send(SideMessage(self.replies_topic, json.dumps(body, default=str).encode("utf-8")))

    def state(self) -> dict[str, Any]:
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

    def report(self, *, force: bool = False) -> None:
        """Publish the retained state if it changed (or `force`); a health change is also an event."""
        if self.side is None:
            return
        state = self.state()
        text = json.dumps(state, sort_keys=True, default=str)
        with self._lock:
            previous, self._last = self._last, text
        if previous is not None:
            was = json.loads(previous).get("health")
            if was != state["health"] and state["health"] in ("degraded", "running"):
                self.event("degraded" if state["health"] == "degraded" else "recovered", reasons=state["reasons"])
        if force or text != previous:
            self.side.send(SideMessage(self.state_topic, text.encode("utf-8"), retain=True))
