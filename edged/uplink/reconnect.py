"""When to knock at the broker again, and how to tell a session taken over from a broker that is down.

`Reconnect` is the policy (it only computes delays; the publisher sleeps them):
- after a failed attempt at start-up, or after a connection that carried nothing: capped exponential backoff;
- after a lost connection that worked (the fleet case: the broker went away for everyone at once): the first
  attempt is uniform in 0..`reconnect_spread_s`, and each next one ~spread seconds later (±10%), so every device
  keeps its random phase and, whenever the broker comes back, the attempts of a fleet are spread evenly over
  the window (an exponential backoff would bunch up the devices whose first attempt fell while it was down);
- after a connection the broker dropped over one message (refused, counted): at once, at the minimum delay.

`Takeover` notices a session takeover by a broker that does not say so (Mosquitto 2.0 closes the old
connection without DISCONNECT 0x8E): the broker, not the network, closed a connection it had accepted moments
before, for the third time in a row within a minute.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any, Literal

from edged.core.backoff import Backoff
from edged.uplink.settings import MqttConfig

log = logging.getLogger(__name__)

UNSPECIFIED = 0x80  # paho's reason when the socket closed without a DISCONNECT
TAKEOVER_COUNT = 3  # unexplained drops of fresh connections in a row ...
TAKEOVER_WINDOW_S = 60.0  # ... within this long: another client with our id keeps taking the session
STEADY_S = 60.0  # a connection up this long counts as healthy even if it carried nothing (backoff reset)


class Reconnect:
    """The delays between attempts (see the module docstring)."""

    def __init__(self, cfg: MqttConfig) -> None:
        self.cfg = cfg
        self._backoff = Backoff(cfg.reconnect_min_s, cfg.reconnect_max_s)
        self._spread = random.Random()  # noqa: S311  (jitter, not cryptography)
        self.spreading = False  # retrying after a lost connection that worked

    def connected(self) -> None:
        """An attempt succeeded."""
        self.spreading = False

    def after_connection(self, *, carried: bool, up_s: float, blamed: bool) -> float:
        """The wait after a connection ended. The backoff resets only once a connection carried traffic (or
        stayed up): a broker that accepts the connection and then hangs up over a message must not be
        hammered (a reconnect storm)."""
        if carried or up_s >= STEADY_S:
            self._backoff.reset()
            # the first attempt is jittered too: when a broker restarts, every device loses its connection
            # in the same instant, and without this they would all knock at once when it is back
            self.spreading = self.cfg.reconnect_spread_s > 0
            return self.first_retry_delay()
        return self.cfg.reconnect_min_s if blamed else self._backoff.next_delay()

    def first_retry_delay(self) -> float:
        """The wait before the first attempt after a lost connection: uniform in 0..reconnect_spread_s."""
        return self._spread.uniform(0.0, self.cfg.reconnect_spread_s)

    def retry_delay(self) -> float:
        """The wait after a failed attempt: ~spread seconds while spreading, else the capped backoff."""
        if self.spreading:
            return self._spread.uniform(0.9, 1.1) * self.cfg.reconnect_spread_s
        return self._backoff.next_delay()


class Takeover:
    """Counts unexplained drops of fresh connections (see the module docstring)."""

    def __init__(self) -> None:
        self._kicked: list[float] = []  # when recent connections were closed by the broker without a reason

    def dropped(self, reason: Any, up_s: float) -> bool:
        """A connection up `up_s` seconds dropped for `reason`: does it look like a takeover now?"""
        if getattr(reason, "value", None) != UNSPECIFIED or up_s > TAKEOVER_WINDOW_S:
            self._kicked.clear()
            return False
        now = time.monotonic()
        self._kicked = [t for t in self._kicked if now - t < TAKEOVER_WINDOW_S] + [now]
        return len(self._kicked) >= TAKEOVER_COUNT


def next_protocol(
    speaking: Literal["3.1.1", "5"],
    configured: Literal["3.1.1", "5"],
    *,
    connected: bool,
    refused: str | None,
    where: str,
    accepted: Literal["3.1.1", "5"] | None = None,
) -> Literal["3.1.1", "5"]:
    """The MQTT version for the next attempt, after one with `speaking`. MQTT 3.1.1 for a broker that does not
    speak 5: one that answers a version 5 CONNECT with 0x84 (Aedes), closes the connection without a CONNACK
    (RabbitMQ before 3.13), or never answers it (amqtt). If 3.1.1 fails too, the version was not the problem:
    back to the configured one, unless the broker has `accepted` that version before (then a failure is a
    restart or an overload, not the version: it stays). The publisher tries the other version at once, and
    keeps the one a broker accepted for its next connects."""
    if connected:
        if speaking != configured:
            log.warning(
                'mqtt: %s does not speak MQTT 5; connected with 3.1.1 (set mqtt.protocol: "3.1.1" to skip the '
                "first attempt; 3.1.1 has no message expiry and no reason codes)",
                where,
            )
        return speaking
    refused_version = refused is not None and "0x84" in refused
    if speaking == "5" and (refused_version or refused is None):  # refused for its version, closed, or no CONNACK
        log.info("mqtt: trying MQTT 3.1.1: %s refused or left unanswered an MQTT 5 connection", where)
        return "3.1.1"
    if accepted is not None and not refused_version:
        return accepted
    return configured
