"""`config`: a partial config merged into the operator's file (or the whole file with `replace`), checked,
reloaded; a file that passed the check but does not run here is put back and reloaded again."""

from __future__ import annotations

from typing import Any

from edged.control.context import RELOAD_WAIT_S, CommandContext
from edged.control.dispatch import HANDLERS, Args
from edged.control.remoteconfig import apply_remote_config, restore_config
from edged.core.errors import CommandError


class ConfigArgs(Args):
    """config: a partial config merged into the file, or the whole file with `replace`."""

    config: dict[str, Any]
    replace: bool = False


@HANDLERS.register("config", ConfigArgs)
def config(args: ConfigArgs, ctx: CommandContext) -> tuple[bool, Any]:
    path = ctx.target.config_file()
    if path is None:
        raise CommandError("failed", "this daemon was not started from a config file")
    previous = apply_remote_config(path, args.config, replace=args.replace, check=ctx.target.check_config)
    result = ctx.target.reload_and_wait(RELOAD_WAIT_S)
    if result.get("result") in ("rejected", "failed"):  # the file passed the check but does not run here
        restore_config(path, previous)
        again = ctx.target.reload_and_wait(RELOAD_WAIT_S)  # what a partial apply changed goes back too
        raise CommandError(
            "rolled_back",
            f"the new config did not reload ({'; '.join(map(str, result.get('notes') or []))}); the previous "
            "file is back",
            detail={"reload": result, "after_rollback": again},
        )
    return result.get("result") == "applied", result
