"""The `control` config section: remote commands over MQTT, signed with Ed25519. Absent = off."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from edged.control.envelope import CMD_TOPIC, GROUP_TOPIC
from edged.control.names import ALL_COMMANDS, CommandName
from edged.core.settings import NAME_PATTERN, Strict
from edged.core.signing import load_public_key
from edged.uplink.settings import check_topic_template

log = logging.getLogger(__name__)


def _check_key(text: str) -> None:
    try:
        load_public_key(text)
    except ValueError as exc:
        raise ValueError(f"{text[:16]!r}... is not an Ed25519 public key: {exc}") from exc


class ControlConfig(Strict):
    """Remote control: commands on `edged/{device_id}/cmd/{name}` (and the groups' topics), each signed."""

    public_keys: list[str] = Field(
        min_length=1,
        description="Ed25519 public keys (base64, as `edged fleet keygen` prints) allowed to sign commands.",
    )
    groups: list[str] = Field(
        default_factory=list, description="Groups this device is in: it also obeys `edged/group/{group}/cmd/...`."
    )
    commands: list[CommandName] = Field(
        default_factory=lambda: list(ALL_COMMANDS), description="The commands this device accepts."
    )
    max_age_s: float = Field(
        300.0,
        gt=0,
        le=86_400,
        description="A command older (or further in the future) than this is refused as stale; nonces are "
        "remembered this long, also across restarts, so a replay is refused.",
    )
    max_bytes: int = Field(65_536, ge=1024, le=1_048_576, description="Larger command messages are refused.")
    model_max_bytes: int = Field(
        512 * 2**20, ge=1024, description="A rollout's model file may be this large at most (bytes)."
    )
    model_ca_file: Path | None = Field(None, description="CA bundle for https:// model URLs (default: the system's).")
    cmd_topic: str = Field(CMD_TOPIC, description="Commands arrive on <this>/<name>.")
    group_topic: str = Field(GROUP_TOPIC, description="Group commands arrive on <this>/<name>.")
    replies_topic: str = Field(
        "edged/{device_id}/events",
        description="Command results (replies) and the device's lifecycle events (started, degraded, recovered); "
        "not spooled. Was `control.events_topic`, a name `mqtt.events_topic` (tracking events, spooled) also has: "
        "the old name still works, with a warning.",
    )
    state_topic: str = Field("edged/{device_id}/state", description="Retained reported state.")

    @field_validator("public_keys")
    @classmethod
    def _keys(cls, value: list[str]) -> list[str]:
        for text in value:
            _check_key(text)
        return value

    @field_validator("groups")
    @classmethod
    def _group_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not re.fullmatch(NAME_PATTERN, name):
                raise ValueError(f"group {name!r}: [A-Za-z0-9_.-], at most 64 characters")
        return value

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "events_topic" in data:
            if "replies_topic" in data:
                raise ValueError("control.events_topic is the old name of control.replies_topic: give only the new")
            log.warning("config: control.events_topic is now control.replies_topic (the old name still works)")
            data = {("replies_topic" if k == "events_topic" else k): v for k, v in data.items()}
        return data

    @field_validator("cmd_topic", "group_topic", "replies_topic", "state_topic")
    @classmethod
    def _topic(cls, value: str) -> str:
        check_topic_template(value.replace("{group}", "g"))
        return value
