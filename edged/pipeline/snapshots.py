"""Snapshots: a JPEG written under <state_dir>/snapshots/<pipeline>/ for a published result that is an
event (a detection, or a change); never sent over MQTT, the message names the file."""

from __future__ import annotations

import logging
from collections import deque
from pathlib import Path
from typing import Any, Literal

import cv2
import numpy as np
import numpy.typing as npt
from pydantic import Field

from edged.core.settings import Strict
from edged.model.decoders.detect import crop_box

log = logging.getLogger(__name__)


class SnapshotConfig(Strict):
    """A JPEG written under <state_dir>/snapshots/<pipeline>/ when an event is published; never sent over MQTT."""

    enabled: bool = Field(False, description="Write snapshots.")
    on: Literal["detection", "change"] = Field(
        "detection",
        description="detection: a published result with at least one detection; change: a published result "
        "whose labels or counts differ from the previous frame's.",
    )
    max_files: int = Field(100, ge=1, le=100000, description="Keep at most this many per pipeline; oldest removed.")
    jpeg_quality: int = Field(85, ge=1, le=100, description="JPEG quality.")
    crop: bool = Field(False, description="Write the best detection's box instead of the whole frame.")


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

    def wanted(self, result: dict[str, Any], *, changed: bool) -> bool:
        """Whether this (published) result is an event worth a picture."""
        if self.cfg.on == "change":
            return changed
        return bool(result.get("detections"))

    def write(self, image: npt.NDArray[np.uint8], result: dict[str, Any], seq: int, stream: str = "") -> str | None:
        """Write the frame (or the best detection's crop); the path relative to the state dir, None on failure.
        `stream` names a seq stream beside the results (events), so their pictures keep apart."""
        picture = image
        detections = result.get("detections") or []
        if self.cfg.crop and detections:
            h, w = image.shape[:2]
            x1, y1, x2, y2 = crop_box(detections[0]["box"], w, h)
            picture = image[y1:y2, x1:x2]
        ok, data = cv2.imencode(".jpg", picture, [cv2.IMWRITE_JPEG_QUALITY, self.cfg.jpeg_quality])
        path = self.dir / f"{self.pipeline}-{stream + '-' if stream else ''}{seq:09d}.jpg"
        if not ok:
            log.warning("pipeline %s: could not encode snapshot for seq %d", self.pipeline, seq)
            return None
        # renamed whole, not fsync'd: a picture lost or empty after a power cut is harmless (the result that
        # names it is still delivered; a reader must expect a missing file, as after max_files turned over)
        tmp = path.with_suffix(".tmp")
        try:
            tmp.write_bytes(data.tobytes())
            tmp.replace(path)
        except OSError as exc:
            log.warning("pipeline %s: cannot write snapshot %s: %s", self.pipeline, path, exc.strerror)
            return None
        self._files.append(path)
        while len(self._files) > self.cfg.max_files:
            old = self._files.popleft()
            old.unlink(missing_ok=True)
        return str(path.relative_to(self.state_dir))
