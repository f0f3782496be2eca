"""The remote commands' names: what `edged fleet send` offers and a device's `control.commands` accepts. A module
of its own, without imports, so that the CLI can list them without loading the command machinery."""

from __future__ import annotations

from typing import Literal

CommandName = Literal["reload", "status", "config", "record", "model"]
ALL_COMMANDS: tuple[CommandName, ...] = ("reload", "status", "config", "record", "model")
