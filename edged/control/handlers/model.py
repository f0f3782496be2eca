"""`model`: a signed model rolled out to a pipeline: fetched, verified, validated, swapped in, watched, and
rolled back when it does worse (edged/control/rollout.py)."""

from __future__ import annotations

from typing import Any

from edged.control.context import CommandContext
from edged.control.dispatch import HANDLERS
from edged.control.rollout import Rollout
from edged.control.rolloutspec import ModelArgs


@HANDLERS.register("model", ModelArgs)
def model(args: ModelArgs, ctx: CommandContext) -> tuple[bool, Any]:
    rollout = Rollout(args, target=ctx.target, public_keys=ctx.cfg.public_keys, state_dir=ctx.state_dir,
                      max_bytes=ctx.cfg.model_max_bytes, event=ctx.event, fetch_chunks=ctx.fetch_chunks,
                      stopping=ctx.stopping, ca_file=ctx.cfg.model_ca_file, command=ctx.command)  # fmt: skip
    return rollout.run()
