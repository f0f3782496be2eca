"""Where a controller tested on its own sends its replies: a list (the side channel's MQTT publishing is tested
with a real broker in tests/test_control.py)."""

from __future__ import annotations

import json
from typing import Any

from edged.uplink.sidechannel import SideMessage


class Outbox:
    """Collects what the controller sends (replies, events, the retained state)."""

    def __init__(self) -> None:
        self.sent: list[SideMessage] = []

    def send(self, message: SideMessage) -> None:
        self.sent.append(message)

    def replies(self) -> list[dict[str, Any]]:
        """The bodies sent on the events topic (command answers and lifecycle events)."""
        return [json.loads(m.payload) for m in self.sent if m.topic.endswith("/events")]

    def answers(self) -> list[dict[str, Any]]:
        """The command answers alone."""
        return [b for b in self.replies() if b.get("event") == "command"]
