"""Motion gating in the source thread: a cheap motion detector on a small grey copy of each frame
decides whether the frame goes to the model at all (Frigate's largest CPU saving).

The detector keeps a running-average background (cv2.accumulateWeighted), thresholds the absolute
difference, dilates it and looks for one contour of at least `min_area` (a fraction of the frame). A
frame with motion goes to the model, and so do the `hold_frames` after motion ends (the tracker sees
the scene empty again) and one frame every `keepalive_s` (a parked car keeps its track). A change of
more than `max_area` of the frame (lights on, the camera's exposure) is not motion to chase: the
background is taken afresh from that frame, and the frame goes to the model once.
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np
import numpy.typing as npt
from pydantic import Field, field_validator

from edged.core.geometry import Point, Points, Polygon, polygon_problem
from edged.core.settings import Strict


class MotionConfig(Strict):
    """Run the model only on frames with motion (plus hold frames and a keep-alive); camera sources only."""

    enabled: bool = Field(False, description="Gate the model on motion.")
    width: int = Field(160, ge=32, le=1920, description="Width of the grey copy the detector looks at (pixels).")
    threshold: int = Field(25, ge=1, le=255, description="Grey-level difference from the background that is motion.")
    min_area: float = Field(
        0.001, ge=0, le=1, description="Smallest moving contour, as a fraction of the frame area, that counts."
    )
    max_area: float = Field(
        0.8, gt=0, le=1, description="A change over this fraction of the frame is a lighting change: new background."
    )
    background_alpha: float = Field(
        0.05, gt=0, le=1, description="How fast the background follows the scene (running-average weight)."
    )
    hold_frames: int = Field(5, ge=0, le=10000, description="Frames that still go to the model after motion ends.")
    keepalive_s: float = Field(
        2.0, ge=0, description="Send a frame to the model at least this often without motion (0 = never)."
    )
    mask: list[Points] = Field(
        default_factory=list,
        description="Polygons where motion is ignored (a tree in the wind, a road beyond the fence). Points in "
        "frame pixels or fractions 0..1.",
    )

    @field_validator("mask")
    @classmethod
    def _polygons(cls, value: list[list[Point]]) -> list[list[Point]]:
        for i, points in enumerate(value):
            problem = polygon_problem(points, frame=(1 << 30, 1 << 30))  # bounds: checked by the pipeline
            if problem:
                raise ValueError(f"mask {i + 1}: {problem}")
        return value


class MotionDetector:
    """Whether a frame differs from the running background (see the module docstring)."""

    def __init__(self, cfg: MotionConfig, masks: Sequence[Sequence[Point]], declared: tuple[int, int] | None) -> None:
        self.cfg = cfg
        self.masks = [list(m) for m in masks]
        self.declared = declared
        self._background: npt.NDArray[np.float32] | None = None
        self._keep: npt.NDArray[np.uint8] | None = None  # 255 where motion counts, 0 in the masks
        self._size: tuple[int, int] = (0, 0)
        self._frame_shape: tuple[int, ...] = ()
        self._min_px = 0.0
        self._max_px = 0.0

    def _setup(self, image: npt.NDArray[np.uint8]) -> None:
        height, width = image.shape[:2]
        small_w = min(self.cfg.width, width)
        small_h = max(1, round(height * small_w / width))
        self._size = (small_w, small_h)
        keep = np.full((small_h, small_w), 255, np.uint8)
        for points in self.masks:
            Polygon(points, (width, height), self.declared).fill(keep, 0, scale=small_w / width)
        self._keep = keep
        area = float(np.count_nonzero(keep)) or 1.0
        self._min_px = max(1.0, self.cfg.min_area * small_w * small_h)
        self._max_px = self.cfg.max_area * area

    def _grey(self, image: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
        small = cv2.resize(image, self._size, interpolation=cv2.INTER_AREA)
        grey = cv2.cvtColor(small, cv2.COLOR_BGR2GRAY) if small.ndim == 3 else small
        return np.asarray(cv2.GaussianBlur(grey, (5, 5), 0), np.uint8)

    def moved(self, image: npt.NDArray[np.uint8]) -> bool:
        """Whether this frame shows motion against the background (which then follows the frame)."""
        if image.shape[:2] != self._frame_shape:  # the first frame, or the source changed its resolution
            self._frame_shape = image.shape[:2]
            self._setup(image)
        grey = self._grey(image)
        if self._background is None or self._background.shape != grey.shape:
            self._background = grey.astype(np.float32)
            return True  # the first frame: nothing to compare with, the model sees it
        diff = cv2.absdiff(grey, cv2.convertScaleAbs(self._background))
        _, moving = cv2.threshold(diff, self.cfg.threshold, 255, cv2.THRESH_BINARY)
        assert self._keep is not None  # noqa: S101  (set up above)
        moving = cv2.bitwise_and(moving, self._keep)
        changed = float(np.count_nonzero(moving))
        if changed > self._max_px:  # the light changed, not the scene: start the background afresh
            self._background = grey.astype(np.float32)
            return True
        cv2.accumulateWeighted(grey, self._background, self.cfg.background_alpha)
        if changed < self._min_px:
            return False
        moving = cv2.dilate(moving, np.ones((3, 3), np.uint8), iterations=2)
        contours, _ = cv2.findContours(moving, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
        return any(cv2.contourArea(c) >= self._min_px for c in contours)


class MotionGate:
    """Per frame: does it go to the model? Motion, the hold frames after it, or the keep-alive."""

    def __init__(self, cfg: MotionConfig, masks: Sequence[Sequence[Point]], declared: tuple[int, int] | None) -> None:
        self.cfg = cfg
        self.detector = MotionDetector(cfg, masks, declared)
        self._hold = 0
        self._last_sent: float | None = None

    def wanted(self, image: npt.NDArray[np.uint8], now: float) -> bool:
        """True when the frame should go to the model (the caller counts the others as skipped)."""
        if self._last_sent is None:  # the first frame: it sets up the background, and the model sees it
            self.detector.moved(image)
        elif self.detector.moved(image):
            self._hold = self.cfg.hold_frames
        elif self._hold > 0:
            self._hold -= 1
        elif not (
            self.cfg.keepalive_s and self._last_sent is not None and now - self._last_sent >= self.cfg.keepalive_s
        ):
            return False
        self._last_sent = now
        return True
