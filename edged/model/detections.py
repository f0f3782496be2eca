"""What every box decoder shares: the common config keys, NMS, and the last steps from decoded candidates
to the published `detections` (threshold, zero-size filter, class filter, NMS, mapping to frame pixels).

A decoder (detect.py's YOLO heads, centernet.py, gfl.py, text.py, or a third party's plugin) turns the model's
outputs into `Candidates` in model-input pixels; `finish` does the rest the same way for all of them, so
every family publishes the same message shape:

    {"detections": [{"label", "index", "score", "box": [x1, y1, x2, y2],
                     "keypoints": [[x, y], ...]  (decoders with landmarks, pose heads),
                     "keypoint_scores": [v, ...] (pose heads that give each point a visibility),
                     "polygon": [[x, y], ...]    (text and segment decoders)}],
     "frame": {"w", "h"}}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
from pydantic import Field

from edged.core.errors import ModelError
from edged.core.settings import Strict
from edged.model.postprocess import DETECTIONS, Labels, labels_field
from edged.model.preprocess import Geometry

Array = npt.NDArray[np.float32]
MAX_CANDIDATES = 4096  # boxes that enter NMS at most (best scores first)
ROUNDING = 1e-3  # how far float rounding takes a probability past 0..1 (an 8-bit output's top step: 1.0000001)
SCORE_MAX = 1.0 + ROUNDING  # a published score is a probability (float rounding aside)


class BoxOptions(Strict):
    """Keys every box decoder takes (the decoder's own config model adds its head's keys)."""

    PRODUCES: ClassVar[str] = DETECTIONS  # masks, zones, tracking and secondary models apply

    score_threshold: float = Field(0.25, ge=0, le=1, description="Detections scoring less are dropped.")
    iou_threshold: float = Field(0.45, gt=0, le=1, description="NMS: overlap above which the weaker box goes.")
    max_detections: int = Field(100, ge=1, le=10000, description="Keep at most this many, best first.")
    class_agnostic: bool = Field(False, description="NMS across classes (default: per class).")
    classes: list[str | int] | None = Field(
        None, description="Report only these classes (labels or indices); default every class."
    )
    labels: Labels = labels_field()


@dataclass
class Candidates:
    """Decoded boxes in model-input pixels, before filtering: [N, 4] corners, [N] scores, [N] class indices,
    and optional per-box point sets ([N, K, 2], model-input pixels) published under their key."""

    boxes: Array
    scores: Array
    classes: npt.NDArray[np.int64]
    points: dict[str, Array] = field(default_factory=dict)
    values: dict[str, Array] = field(default_factory=dict)  # per-box figures [N, K] (e.g. keypoint_scores)

    @classmethod
    def empty(cls) -> Candidates:
        """No detection."""
        return cls(np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int64))

    def take(self, index: npt.NDArray[Any]) -> Candidates:
        """The rows `index` selects (a boolean mask or indices), points included."""
        return Candidates(
            self.boxes[index],
            self.scores[index],
            self.classes[index],
            {k: v[index] for k, v in self.points.items()},
            {k: v[index] for k, v in self.values.items()},
        )


def nms(
    boxes: Array, scores: Array, iou_threshold: float, max_out: int, classes: npt.NDArray[Any] | None = None
) -> npt.NDArray[np.intp]:
    """Greedy non-maximum suppression; indices kept, best first. Class-aware when `classes` is given.

    Class-aware by offsetting each class's boxes so that boxes of different classes never overlap.
    Each step compares the best remaining box with all the others at once (vectorised).
    """
    if boxes.shape[0] == 0:
        return np.empty(0, dtype=np.intp)
    b = boxes.astype(np.float32, copy=True)
    if classes is not None:
        span = float(max(b.max(), 0.0)) + 1.0
        b += (classes.astype(np.float32) * span)[:, None]
    areas = np.clip(b[:, 2] - b[:, 0], 0, None) * np.clip(b[:, 3] - b[:, 1], 0, None)
    order = np.argsort(-scores, kind="stable")
    keep: list[int] = []
    while order.size and len(keep) < max_out:
        i = int(order[0])
        keep.append(i)
        rest = order[1:]
        w = np.clip(np.minimum(b[i, 2], b[rest, 2]) - np.maximum(b[i, 0], b[rest, 0]), 0, None)
        h = np.clip(np.minimum(b[i, 3], b[rest, 3]) - np.maximum(b[i, 1], b[rest, 1]), 0, None)
        inter = w * h
        iou = inter / np.maximum(areas[i] + areas[rest] - inter, 1e-9)
        order = rest[iou <= iou_threshold]
    return np.asarray(keep, dtype=np.intp)


def has_area(boxes: Array) -> npt.NDArray[np.bool_]:
    """Rows of (x1, y1, x2, y2) that are finite with a positive width and height: a detection with zero or
    negative size is never published (a decoder that does not fit the model makes thousands of them)."""
    if not boxes.shape[0]:
        return np.zeros(0, dtype=bool)
    finite = np.isfinite(boxes).all(axis=1)
    return finite & (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])


def cxcywh_to_xyxy(a: Array) -> Array:
    """[N, 4] centre, size -> corners."""
    out = np.empty_like(a)
    half_w, half_h = a[:, 2] / 2, a[:, 3] / 2
    out[:, 0], out[:, 1] = a[:, 0] - half_w, a[:, 1] - half_h
    out[:, 2], out[:, 3] = a[:, 0] + half_w, a[:, 1] + half_h
    return out


def sigmoid(x: Array) -> Array:
    """Logistic function, overflow-safe for large negative logits."""
    return np.asarray(0.5 * (1.0 + np.tanh(0.5 * x)), dtype=np.float32)


def in_unit_range(x: Array) -> bool:
    """Whether every value lies in 0..1, float rounding aside: ONNX Runtime's own Sigmoid gives 1.0000001 for
    some logits, a quantized model calibrated on that range dequantizes its top step to it, and that is still a
    probability (taken for a logit, the whole map went through a second sigmoid, every pixel above 0.5: an int8
    text detector lost every box that way)."""
    if not x.size:
        return True
    flat = np.ravel(x)  # fmin/fmax skip NaN: one NaN pixel must not make a probability map a logit map
    return not (float(np.fmin.reduce(flat)) < -ROUNDING or float(np.fmax.reduce(flat)) > 1.0 + ROUNDING)


def probabilities(x: Array) -> Array:
    """`x` as probabilities: values in 0..1 (`in_unit_range`) are kept, clipped to 0..1; anything else is
    logits, through a sigmoid."""
    if in_unit_range(x):
        return np.asarray(np.clip(x, 0.0, 1.0), dtype=np.float32)
    return sigmoid(x)


def allowed_classes(wanted: list[str | int] | None, labels: list[str] | None) -> npt.NDArray[np.int64] | None:
    """The class indices `classes` names (labels or indices), or None for every class."""
    if wanted is None:
        return None
    out = []
    for item in wanted:
        if isinstance(item, int):
            out.append(item)
        elif labels and item in labels:
            out.append(labels.index(item))
        elif item.isdigit():
            out.append(int(item))
        else:
            known = ", ".join(labels[:20]) if labels else "none (the model has no labels)"
            raise ModelError(f"postprocess.classes: unknown label {item!r}; labels: {known}")
    return np.asarray(out, dtype=np.int64)


class Finisher:
    """Decoded candidates -> the published result, the same for every box decoder."""

    def __init__(self, opts: BoxOptions, labels: list[str] | None, input_size: tuple[int, int]) -> None:
        self.opts = opts
        self.labels = labels
        self.input_size = input_size
        self.allowed = allowed_classes(opts.classes, labels)

    def __call__(self, cands: Candidates, geometry: Geometry | None, *, suppress: bool = True) -> dict[str, Any]:
        """Threshold, drop sizeless boxes, filter classes, NMS (unless the model did it: `suppress=False`),
        map to frame pixels; detections best first."""
        keep = (cands.scores >= self.opts.score_threshold) & has_area(cands.boxes)
        if self.allowed is not None:
            keep &= np.isin(cands.classes, self.allowed)
        cands = cands.take(keep)
        if suppress:
            if cands.scores.shape[0] > MAX_CANDIDATES:
                cands = cands.take(np.argpartition(-cands.scores, MAX_CANDIDATES - 1)[:MAX_CANDIDATES])
            per_class = None if self.opts.class_agnostic else cands.classes
            order = nms(cands.boxes, cands.scores, self.opts.iou_threshold, self.opts.max_detections, per_class)
        else:
            order = np.argsort(-cands.scores, kind="stable")[: self.opts.max_detections]
        cands = cands.take(order)
        if geometry is None:
            w, h = self.input_size
            geometry = Geometry(w, h, 1.0, 1.0, 0, 0)
        if cands.boxes.shape[0]:
            cands.boxes = geometry.to_source(cands.boxes)
            cands.points = {k: geometry.points_to_source(v) for k, v in cands.points.items()}
            # a box that lay outside the frame has no area once clipped to it: never published
            cands = cands.take(has_area(np.round(cands.boxes, 1)))
        return {"detections": self._entries(cands), "frame": {"w": geometry.width, "h": geometry.height}}

    def _entries(self, cands: Candidates) -> list[dict[str, Any]]:
        if cands.scores.size and float(cands.scores.max()) > SCORE_MAX:
            raise ModelError(  # a logit or a product of two is no probability: the reading is wrong
                f"the model gave scores up to {float(cands.scores.max()):.3g}, outside 0..1: these are not "
                "probabilities (a head without its sigmoid, or coordinates read as scores); check "
                "postprocess.format, or export the model with its activation"
            )
        if self.labels and cands.classes.size and (cands.classes.min() < 0 or cands.classes.max() >= len(self.labels)):
            beyond = sorted({int(c) for c in cands.classes if not 0 <= c < len(self.labels)})[:5]
            raise ModelError(  # a bare number is no label: the reading is wrong, refused rather than published
                f"the model gave classes {beyond} beyond its {len(self.labels)} labels; check postprocess.labels "
                "and postprocess.format"
            )
        out = []
        for i in range(cands.boxes.shape[0]):
            c = int(cands.classes[i])
            entry: dict[str, Any] = {
                "label": self.labels[c] if self.labels else str(c),
                "index": c,
                "score": round(float(cands.scores[i]), 4),
                "box": [round(float(v), 1) for v in cands.boxes[i]],
            }
            for key, pts in cands.points.items():
                entry[key] = [[round(float(x), 1), round(float(y), 1)] for x, y in pts[i]]
            for key, vals in cands.values.items():
                entry[key] = [round(float(v), 3) for v in vals[i]]
            out.append(entry)
        return out


def input_size_of(kind: str, input_size: tuple[int, int] | None) -> tuple[int, int]:
    """The model's input size, which every box decoder needs (to scale and to map boxes back)."""
    if input_size is None:
        raise ModelError(f"{kind} needs the model's input size; set preprocess.size")
    return input_size


UNORDERED_MAX = 0.05  # boxes read from a `boxes` output that are out of order or off the input, at most this share


def check_boxes(boxes: Array, input_size: tuple[int, int]) -> None:
    """Boxes must be boxes: what a model gives as decoded boxes has x1 <= x2 and y1 <= y2, and lies on its input
    (in pixels, or in 0..1 of it when every coordinate is <= 1.5), rows of zeros (the padding of a fixed-size
    output) aside. A per-cell box regression or an SSD's undecoded `loc` (offsets around zero, read as corners)
    has them out of order about half the time; coordinates from another scale land off the input: ModelError,
    not published. Checked on check-config's synthetic frame and on every frame (vectorized comparisons)."""
    used = boxes[np.isfinite(boxes).all(axis=1) & np.any(boxes != 0, axis=1)]
    if used.shape[0] == 0:
        return
    unordered = int(np.count_nonzero((used[:, 2] < used[:, 0]) | (used[:, 3] < used[:, 1])))
    if unordered > UNORDERED_MAX * used.shape[0]:
        raise ModelError(
            f"detect: what the model gives as boxes is not boxes: {unordered} of {used.shape[0]} have x2 < x1 or "
            "y2 < y1 (a box regression around zero, or an undecoded anchor/prior output): export the model with "
            "its box decoding (and NMS), use its family's decoder, or write a plugin (docs/models.md)"
        )
    w, h = (1.0, 1.0) if float(np.abs(used).max()) <= 1.5 else (float(input_size[0]), float(input_size[1]))
    off = (used[:, 2] < -0.5 * w) | (used[:, 3] < -0.5 * h) | (used[:, 0] > 1.5 * w) | (used[:, 1] > 1.5 * h)
    outside = int(np.count_nonzero(off))
    if outside > UNORDERED_MAX * used.shape[0]:
        raise ModelError(
            f"detect: {outside} of {used.shape[0]} boxes lie off the {input_size[0]}x{input_size[1]} input: not "
            "box corners in input pixels or 0..1 of the input (check preprocess.size, or export the model with its "
            "box decoding)"
        )
