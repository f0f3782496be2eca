"""`record`: save frames the model sees to <state_dir>/records/<pipeline>-<time>.npz (calibration frames for
`edged quantize`); a stop ends the recording early."""

from __future__ import annotations

import time
from typing import Any

from pydantic import Field

from edged.control.context import CommandContext
from edged.control.dispatch import HANDLERS, Args
from edged.core.errors import CommandError
from edged.pipeline.frametap import save_frames


class RecordArgs(Args):
    """record: save frames the model sees to <state_dir>/records/<pipeline>-<time>.npz."""

    pipeline: str | None = None
    frames: int = Field(50, ge=1, le=500)
    every: int = Field(1, ge=1, le=1000)
    timeout_s: float = Field(60.0, gt=0, le=600)


@HANDLERS.register("record", RecordArgs)
def record(args: RecordArgs, ctx: CommandContext) -> tuple[bool, Any]:
    name, tap = ctx.target.frame_tap(args.pipeline)
    ctx.tap = tap
    try:
        if ctx.stopping.is_set():
            raise CommandError("failed", "the daemon is stopping")
        frames = tap.record(args.frames, args.every, args.timeout_s, name)
    finally:
        ctx.tap = None
    folder = ctx.state_dir / "records"
    folder.mkdir(mode=0o750, exist_ok=True)
    path = save_frames(folder / f"{name}-{time.strftime('%Y%m%dT%H%M%S')}.npz", frames)
    return True, {"path": str(path), "frames": len(frames), "complete": len(frames) >= args.frames}
