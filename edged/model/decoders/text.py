"""`text` postprocessing: DB (Differentiable Binarization) text detectors such as PaddleOCR's, decoded as
PaddleOCR's `DBPostProcess` does.

The model gives a probability map [1, 1, H, W] (logits get a sigmoid): its only output, or the one `output`
names (a model with several outputs is refused until `output` names one: a one-channel map beside others may
be a heatmap or a mask as well). The map is binarised at
`threshold` (and dilated by 2 x 2 when `dilate`); each connected region's minimum-area rectangle is a text
candidate, kept when its shorter side is at least `min_size` map pixels and the mean probability inside it
(the "fast" score) reaches `score_threshold`. The rectangle is then grown ("unclipped") by
area x unclip_ratio / perimeter on every side, as DB's shrunk training targets require: for a rectangle
that is exactly what PaddleOCR's polygon offset followed by a new minimum-area rectangle gives.

Each detection is published with its axis-aligned `box` and its rotated rectangle as `polygon` (four
corners: top-left, top-right, bottom-right, bottom-left), label `text`.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import cv2
import numpy as np
import numpy.typing as npt
from pydantic import Field

from edged.core.errors import ModelError
from edged.core.settings import Strict
from edged.model.detections import Array, BoxOptions, Candidates, Finisher, input_size_of, probabilities
from edged.model.postprocess import (
    DETECTIONS,
    POSTPROCESSORS,
    Postprocessor,
    output_field,
    pick_output,
    with_reading,
)
from edged.model.preprocess import Geometry


class TextConfig(Strict):
    """DB text detection (PaddleOCR's detectors and the like); see edged/model/decoders/text.py."""

    PRODUCES: ClassVar[str] = DETECTIONS  # polygons with their boxes: masks, zones, tracking, secondary apply

    type: Literal["text"] = Field(description="Postprocessor type key.")
    threshold: float = Field(0.3, gt=0, lt=1, description="Probability at which a map pixel counts as text.")
    score_threshold: float = Field(0.5, ge=0, le=1, description="Regions whose mean probability is less are dropped.")
    unclip_ratio: float = Field(1.6, ge=0, le=10, description="How far a region is grown (DB's shrink ratio).")
    min_size: int = Field(3, ge=1, description="Regions whose shorter side is less (map pixels) are dropped.")
    dilate: bool = Field(True, description="Dilate the binary map by 2 x 2 first (joins broken strokes).")
    max_candidates: int = Field(1000, ge=1, le=100000, description="Regions examined at most per frame.")
    max_detections: int = Field(1000, ge=1, le=100000, description="Keep at most this many, best first.")
    label: str = Field("text", min_length=1, description="The label of every detection.")
    output: str | None = output_field()


def ordered_corners(rect: tuple[Any, ...]) -> Array:
    """The four corners of a cv2 rotated rect as top-left, top-right, bottom-right, bottom-left (DB's order)."""
    pts = sorted(cv2.boxPoints(rect).tolist(), key=lambda p: p[0])
    left = sorted(pts[:2], key=lambda p: p[1])
    right = sorted(pts[2:], key=lambda p: p[1])
    return np.asarray([left[0], right[0], right[1], left[1]], dtype=np.float32)


def mean_inside(prob: Array, corners: Array) -> float:
    """Mean of the map inside the polygon (DB's fast box score)."""
    h, w = prob.shape
    x0 = int(np.clip(np.floor(corners[:, 0].min()), 0, w - 1))
    x1 = int(np.clip(np.ceil(corners[:, 0].max()), 0, w - 1))
    y0 = int(np.clip(np.floor(corners[:, 1].min()), 0, h - 1))
    y1 = int(np.clip(np.ceil(corners[:, 1].max()), 0, h - 1))
    mask = np.zeros((y1 - y0 + 1, x1 - x0 + 1), dtype=np.uint8)
    shifted = (corners - np.asarray([x0, y0], np.float32)).astype(np.int32)
    cv2.fillPoly(mask, [shifted.reshape(-1, 2)], 1)
    return float(cv2.mean(prob[y0 : y1 + 1, x0 : x1 + 1], mask)[0])


class TextDetect:
    """Probability map -> rotated text boxes -> the shared finish (no NMS: regions do not overlap)."""

    def __init__(self, cfg: TextConfig, input_size: tuple[int, int], index: int = 0) -> None:
        self.cfg = cfg
        self.input_size = input_size
        self.index = index  # the output it reads
        opts = BoxOptions(score_threshold=cfg.score_threshold, max_detections=cfg.max_detections, labels=[cfg.label])
        self.finish = Finisher(opts, [cfg.label], input_size)

    def __call__(self, outputs: list[npt.NDArray[Any]], geometry: Geometry | None = None) -> dict[str, Any]:
        """Regions of the map as text detections in frame pixels."""
        return self.finish(self.decode(outputs), geometry, suppress=False)

    def decode(self, outputs: list[npt.NDArray[Any]]) -> Candidates:
        """Candidates in model-input pixels, with their rotated rectangles as `polygon`."""
        prob = np.asarray(outputs[self.index], dtype=np.float32)
        if not _probability_map(list(prob.shape)):
            raise ModelError(f"text: the output is {list(prob.shape)} on this frame, not a map [1, 1, H, W]")
        prob = prob.reshape(prob.shape[-2], prob.shape[-1])
        prob = probabilities(prob)
        binary = (prob > self.cfg.threshold).astype(np.uint8)
        if self.cfg.dilate:
            binary = np.asarray(cv2.dilate(binary, np.ones((2, 2), np.uint8)), dtype=np.uint8)
        contours, _ = cv2.findContours(binary * 255, cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE)
        quads, scores = [], []
        for contour in contours[: self.cfg.max_candidates]:
            rect = cv2.minAreaRect(contour)
            if min(rect[1]) < self.cfg.min_size:
                continue
            score = mean_inside(prob, ordered_corners(rect))
            if score < self.cfg.score_threshold:
                continue
            (cx, cy), (w, h), angle = rect
            grow = w * h * self.cfg.unclip_ratio / max(2.0 * (w + h), 1e-6)
            if min(w, h) + 2 * grow < self.cfg.min_size + 2:
                continue
            quads.append(ordered_corners(((cx, cy), (w + 2 * grow, h + 2 * grow), angle)))
            scores.append(score)
        if not quads:
            return Candidates.empty()
        corners = np.stack(quads)
        corners *= np.asarray([self.input_size[0] / prob.shape[1], self.input_size[1] / prob.shape[0]], np.float32)
        boxes = np.concatenate([corners.min(axis=1), corners.max(axis=1)], axis=1)
        return Candidates(
            boxes.astype(np.float32),
            np.asarray(scores, np.float32),
            np.zeros(len(scores), np.int64),
            {"polygon": corners.astype(np.float32)},
        )


@POSTPROCESSORS.register("text", TextConfig)
def make_text(
    cfg: TextConfig,
    output_names: list[str],
    output_shapes: list[list[Any]],
    metadata: dict[str, str],  # noqa: ARG001  (every factory takes the same arguments)
    input_size: tuple[int, int] | None,
) -> Postprocessor:
    """Build the DB decoder; the output it reads must be one single-channel map."""
    input_size = input_size_of("text", input_size)
    index = pick_output("text", cfg.output, output_names, output_shapes, _probability_map)
    described = ", ".join(f"{n} {s}" for n, s in zip(output_names, output_shapes, strict=True))
    if cfg.output is None and len(output_names) > 1:
        raise ModelError(
            f"text needs one probability map [1, 1, H, W]; the model has {len(output_names)} outputs ({described}): "
            "name the map with postprocess.output"
        )
    if not _probability_map(output_shapes[index]):
        raise ModelError(f"text needs one probability map [1, 1, H, W]; the model has {described}")
    reading = f"text: probability map {output_names[index]} {output_shapes[index]} (DB), label {cfg.label!r}"
    return with_reading(TextDetect(cfg, input_size, index), reading)


def _probability_map(shape: list[Any]) -> bool:
    """[1, 1, H, W]: four axes, one channel (a dynamic one counts)."""
    return len(shape) == 4 and not [d for d in shape[1:-2] if isinstance(d, int) and d != 1]
