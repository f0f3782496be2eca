"""`reload`: read the config file again, as SIGHUP does, and answer with how it went."""

from __future__ import annotations

from typing import Any

from edged.control.context import RELOAD_WAIT_S, CommandContext
from edged.control.dispatch import HANDLERS, NoArgs


@HANDLERS.register("reload", NoArgs)
def reload(_args: NoArgs, ctx: CommandContext) -> tuple[bool, Any]:
    result = ctx.target.reload_and_wait(RELOAD_WAIT_S)
    return result.get("result") == "applied", result
