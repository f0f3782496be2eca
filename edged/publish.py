"""Edge filtering (`publish`: every | on_change | interval) and snapshots written on an event.

What is kept and what is not: every frame is run through the model and counted in the pipeline status
(`frames`, latencies, `fps`); a result the filter holds back is counted in `suppressed` and then
discarded: it is not stored in the spool, takes no `seq` (so `seq` counts published results and a gap
still means a lost result) and is never sent. Snapshots are written only for published results.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt

from edged.config import PipelineConfig, PublishConfig, SnapshotConfig
from edged.inference.detect import crop_box

log = logging.getLogger(__name__)

Clock = Callable[[], float]


def signature(result: dict[str, Any]) -> object:
    """What `on_change` compares: per-label counts of detections, a classifier's top-1 label, else everything."""
    if "detections" in result:
        return tuple(sorted(Counter(str(d["label"]) for d in result["detections"]).items()))
    top = result.get("top")
    if isinstance(top, list):
        return top[0]["label"] if top else None
    return json.dumps(result, sort_keys=True)


class PublishFilter:
    """Decides, frame by frame in capture order, whether a result is published. Not thread-safe: the
    pipeline calls it inside its Turnstile turn."""

    def __init__(self, cfg: PublishConfig, clock: Clock = time.monotonic) -> None:
        self.cfg = cfg
        self.clock = clock
        self._last_signature: object = _NOTHING
        self._last_publish: float | None = None

    def decide(self, result: dict[str, Any]) -> tuple[bool, bool]:
        """(publish, changed): `changed` when the signature differs from the previous frame's."""
        sig = signature(result)
        changed = sig != self._last_signature
        self._last_signature = sig
        now = self.clock()
        due = self._last_publish is None or (
            self.cfg.interval_s > 0 and now - self._last_publish >= self.cfg.interval_s
        )
        if self.cfg.mode == "every":
            publish = True
        elif self.cfg.mode == "on_change":
            publish = changed or due
        else:
            publish = due
        if publish:
            self._last_publish = now
        return publish, changed


_NOTHING = object()


class Snapshots:
    """JPEGs under <state_dir>/snapshots/<pipeline>/, at most `max_files`, the oldest removed first."""

    def __init__(self, cfg: SnapshotConfig, state_dir: Path, pipeline: str) -> None:
        self.cfg = cfg
        self.state_dir = state_dir
        self.pipeline = pipeline
        self.dir = state_dir / "snapshots" / pipeline
        self.dir.mkdir(parents=True, exist_ok=True)
        existing = sorted(self.dir.glob("*.jpg"), key=lambda p: (p.stat().st_mtime, p.name))
        self._files: deque[Path] = deque(existing)
        self.written = 0

    def wanted(self, result: dict[str, Any], *, changed: bool) -> bool:
        """Whether this (published) result is an event worth a picture."""
        if self.cfg.on == "change":
            return changed
        return bool(result.get("detections"))

    def write(self, image: npt.NDArray[np.uint8], result: dict[str, Any], seq: int) -> str | None:
        """Write the frame (or the best detection's crop); the path relative to the state dir, None on failure."""
        picture = image
        detections = result.get("detections") or []
        if self.cfg.crop and detections:
            h, w = image.shape[:2]
            x1, y1, x2, y2 = crop_box(detections[0]["box"], w, h)
            picture = image[y1:y2, x1:x2]
        ok, data = cv2.imencode(".jpg", picture, [cv2.IMWRITE_JPEG_QUALITY, self.cfg.jpeg_quality])
        path = self.dir / f"{self.pipeline}-{seq:09d}.jpg"
        if not ok:
            log.warning("pipeline %s: could not encode snapshot for seq %d", self.pipeline, seq)
            return None
        tmp = path.with_suffix(".tmp")
        try:
            tmp.write_bytes(data.tobytes())
            tmp.replace(path)
        except OSError as exc:
            log.warning("pipeline %s: cannot write snapshot %s: %s", self.pipeline, path, exc.strerror)
            return None
        self._files.append(path)
        self.written += 1
        while len(self._files) > self.cfg.max_files:
            old = self._files.popleft()
            old.unlink(missing_ok=True)
        return str(path.relative_to(self.state_dir))


def pipeline_outputs(cfg: PipelineConfig, state_dir: Path) -> tuple[PublishFilter, Snapshots | None]:
    """The publish filter and the snapshots (None when off) of a pipeline: one per pipeline, shared by its
    workers; built at start and again when a reload changes them."""
    snapshots = Snapshots(cfg.snapshot, state_dir, cfg.name) if cfg.snapshot.enabled else None
    return PublishFilter(cfg.publish), snapshots
