"""The stats message: the daemon's status snapshot on `mqtt.stats_topic` every `mqtt.stats_interval_s`, QoS 0
(a sample, not a record), retained when `mqtt.stats_retain` (and the broker keeps retained messages)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from edged.uplink.hooks import Hook, Session
from edged.uplink.mqttclient import topic_for
from edged.uplink.settings import MqttConfig

StatsSource = Callable[[], dict[str, Any]]


class StatsMessage(Hook):
    """Publishes `{"v": 1, "device", "ts", **snapshot}` at once on each connection, then every interval."""

    def __init__(self, cfg: MqttConfig, device_id: str, source: StatsSource) -> None:
        self.topic = topic_for(cfg.stats_topic, device_id)
        self.device_id = device_id
        self.interval_s = cfg.stats_interval_s
        self.retain = cfg.stats_retain
        self.source = source
        self._next = 0.0

    def connected(self, session: Session) -> None:  # noqa: ARG002  (the first turn sends it)
        """The first message goes on the first turn of the connection."""
        self._next = 0.0

    def turn(self, session: Session) -> float | None:
        """Send when due; seconds until the next one."""
        now = time.monotonic()
        if now >= self._next:
            self._next = now + self.interval_s
            body = {"v": 1, "device": self.device_id, "ts": round(time.time(), 3), **self.source()}
            session.publish(self.topic, json.dumps(body).encode(), qos=0, retain=self.retain)
        return self._next - now
