"""`edged record`: capture frames from a pipeline's own source into a `.npz` for quantize/validate.

The frames come through the same source code the daemon runs (camera, file, stream, GStreamer), so a
calibration set matches what the model will see. A V4L2 camera is opened exclusively: stop the daemon
first (`systemctl stop edged`), or record from a stream or a file.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from edged.capture import FrameSlot, make_source
from edged.config import Config
from edged.core.errors import ToolError
from edged.core.stats import PipelineStats
from edged.tools.frames import save_frames

log = logging.getLogger(__name__)


def record(config: Config, pipeline: str | None, out: Path, *, frames: int, every: int, timeout_s: float) -> Path:
    """Save `frames` frames (one in `every`) from the pipeline's source to `out` (.npz)."""
    chosen = [p for p in config.pipelines if pipeline is None or p.name == pipeline]
    if not chosen:
        raise ToolError(f"no pipeline {pipeline!r} in the config; it has {[p.name for p in config.pipelines]}")
    cfg = chosen[0]
    if cfg.source.type != "camera":
        raise ToolError(f"pipeline {cfg.name} reads a {cfg.source.type} source; record takes camera pipelines")
    if out.suffix != ".npz":
        raise ToolError(f"{out}: the output must be a .npz file")
    slot = FrameSlot()
    stats = PipelineStats(cfg.name, str(cfg.source.uri))
    source = make_source(cfg.source, slot=slot, stats=stats, name=f"edged-source-{cfg.name}")
    kept: list[np.ndarray] = []
    seen = 0
    deadline = time.monotonic() + timeout_s
    source.start()
    try:
        while len(kept) < frames and time.monotonic() < deadline and not slot.closed:
            frame = slot.get(0.5)
            if frame is None:
                continue
            if seen % every == 0:
                kept.append(frame.image)
            seen += 1
    finally:
        source.stop()
        source.join(10)
    if not kept:
        raise ToolError(f"no frame from {cfg.source.uri} within {timeout_s:.0f} s ({stats.error or 'no error seen'})")
    if len(kept) < frames:
        log.warning("recorded %d of %d frames (the source ended or the time ran out)", len(kept), frames)
    if len({f.shape for f in kept}) > 1:
        raise ToolError("the source changed resolution while recording; record again")
    return save_frames(out, np.stack(kept))
