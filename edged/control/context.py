"""What a remote command's handler may use (handlers/, one module per command): the daemon as the control
stage sees it (`ControlTarget`), this device's control config and state folder, lifecycle events, the stop
flag, a model's chunks over the connection, and the frame tap a recording waits on (so a stop ends it)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from edged.control.rollout import RolloutTarget
from edged.control.settings import ControlConfig
from edged.pipeline.frametap import FrameTap
from edged.uplink.sidechannel import SideMessage

RELOAD_WAIT_S = 120.0  # how long a command waits for the reload it asked for


class ControlTarget(RolloutTarget, Protocol):
    """What the control plane needs of the daemon: what a rollout needs (status, reload, config file,
    frame taps, pipeline configs) is all of it."""


class SideSender(Protocol):
    """Where replies, events and the state go (the publisher's side channel)."""

    def send(self, message: SideMessage) -> None:
        """Queue one message."""
        ...


@dataclass
class CommandContext:
    """One controller's surroundings, handed to every handler it runs."""

    cfg: ControlConfig
    state_dir: Path
    target: ControlTarget
    event: Callable[..., None]  # a lifecycle event on the replies topic: event(name, **fields)
    fetch_chunks: Callable[[str, int, float], Path]  # a model's retained chunks: (sha256, max bytes, timeout)
    stopping: threading.Event = field(default_factory=threading.Event)
    tap: FrameTap | None = None  # the tap a `record` waits on, while it waits
    command: tuple[str, str | None] = ("", None)  # the running command's id and response topic (one at a time)


Handler = Callable[[Any, CommandContext], tuple[bool, Any]]  # (its args model, the context) -> (ok, detail)
