"""The command format both sides share: the names, the envelope, and the topics a command goes to. The device
(gate.py) reads what `edged fleet send` (fleet/send.py) writes; both use this module, so they cannot drift.

A command is one JSON envelope, `sig` signing every other field (edged/core/signing.py):

    {"v": 1, "cmd": "reload", "id": "…", "target": "pi-01" | "group:lobby", "ts": 1764680000.1,
     "nonce": "…", "args": {…}, "sig": "…"}

published on `<cmd_topic>/<cmd>` for a device, `<group_topic>/<cmd>` for a group (the defaults below; a
device may set others in `control:`).
"""

from __future__ import annotations

import secrets
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from edged.control.names import ALL_COMMANDS, CommandName
from edged.uplink.mqttclient import topic_for

__all__ = ["ALL_COMMANDS", "CommandName", "Envelope", "command_topic", "new_command"]

VERSION = 1
GROUP = "group:"  # a target that names a group: group:<name>
CMD_TOPIC = "edged/{device_id}/cmd"
GROUP_TOPIC = "edged/group/{group}/cmd"


class Envelope(BaseModel):
    """A command message (JSON). `sig` signs every other field (edged/core/signing.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    v: Literal[1]
    cmd: CommandName
    id: str = Field(min_length=1, max_length=64)
    target: str = Field(min_length=1, max_length=80, description="A device id, or group:<name>.")
    ts: float = Field(allow_inf_nan=False, description="When it was signed (epoch s); NaN would never age out.")
    nonce: str = Field(min_length=8, max_length=128)
    args: dict[str, Any] = Field(default_factory=dict)
    sig: str


def new_command(
    cmd: str, target: str, args: dict[str, Any] | None = None, *, ts: float | None = None
) -> dict[str, Any]:
    """An unsigned envelope (sign it with edged.core.signing.sign)."""
    when = round(time.time() if ts is None else ts, 3)
    return {"v": VERSION, "cmd": cmd, "id": uuid.uuid4().hex[:16], "target": target, "ts": when,
            "nonce": secrets.token_hex(16), "args": args or {}}  # fmt: skip


def device_prefix(device_id: str, cmd_topic: str = CMD_TOPIC) -> str:
    """Where a device's own commands arrive (each under /<cmd>)."""
    return topic_for(cmd_topic, device_id)


def group_prefix(group: str, device_id: str = "", group_topic: str = GROUP_TOPIC) -> str:
    """Where a group's commands arrive (each under /<cmd>)."""
    return topic_for(group_topic.replace("{group}", group), device_id)


def command_topic(cmd: str, target: str) -> str:
    """The topic of a command to `target` (a device id, or group:<name>) with the default topics."""
    if target.startswith(GROUP):
        return f"{group_prefix(target.removeprefix(GROUP))}/{cmd}"
    return f"{device_prefix(target)}/{cmd}"
