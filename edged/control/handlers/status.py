"""`status`: the status JSON, answered at once, even while another command runs."""

from __future__ import annotations

from typing import Any

from edged.control.context import CommandContext
from edged.control.dispatch import HANDLERS, NoArgs


@HANDLERS.register("status", NoArgs)
def status(_args: NoArgs, ctx: CommandContext) -> tuple[bool, Any]:
    return True, ctx.target.snapshot()
