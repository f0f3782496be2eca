"""`detect` postprocessing: decode YOLO-style heads or ready boxes, filter, NMS, map boxes to frame pixels.

Head families (`postprocess.format`):

- `yolov5`: one output [1, N, 5 + nc]: cx, cy, w, h, objectness, class scores; score = objectness x class.
- `yolov8` (YOLOv8, YOLO11 and the like): one output [1, 4 + nc, N] (or transposed [1, N, 4 + nc]):
  cx, cy, w, h, class scores; no objectness.
- `boxes`: the model did the NMS itself. One output [1, N, 6] (x1, y1, x2, y2, score, class), or separate
  outputs found by name (`*box*`, `*score*`, `*class*`/`*label*`, optional `*num*` count) or by shape.
  Their boxes are used as given (no second NMS); threshold, class filter and `max_detections` apply.

Coordinates are model-input pixels (or 0..1 of the input when `normalized`) and are mapped back through
the letterbox or stretch of the frame they came from (`Geometry`), clipped to the frame.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field

from edged.core.errors import ModelError
from edged.core.settings import Strict
from edged.model.postprocess import POSTPROCESSORS, Labels, Postprocessor, labels_field, load_labels
from edged.model.preprocess import Geometry

log = logging.getLogger(__name__)

Array = npt.NDArray[np.float32]
MAX_CANDIDATES = 4096  # boxes that enter NMS at most (best scores first)


class DetectConfig(Strict):
    """Object detection: YOLO-style heads or models that output boxes themselves; see edged/model/detect.py."""

    type: Literal["detect"] = Field(description="Postprocessor type key.")
    format: Literal["auto", "yolov5", "yolov8", "boxes"] = Field(
        "auto",
        description="Head family. yolov5: [1, N, 5+nc] with objectness; yolov8 (also YOLO11): [1, 4+nc, N] "
        "or transposed, no objectness; boxes: NMS inside the graph, one [1, N, 6] output (x1, y1, x2, y2, "
        "score, class) or separate boxes / scores / classes outputs. auto: from the output shapes and labels.",
    )
    score_threshold: float = Field(0.25, ge=0, le=1, description="Detections scoring less are dropped.")
    iou_threshold: float = Field(0.45, gt=0, le=1, description="NMS: overlap above which the weaker box goes.")
    max_detections: int = Field(100, ge=1, le=10000, description="Keep at most this many, best first.")
    class_agnostic: bool = Field(False, description="NMS across classes (default: per class).")
    classes: list[str | int] | None = Field(
        None, description="Report only these classes (labels or indices); default every class."
    )
    labels: Labels = labels_field()
    normalized: Literal["auto", "yes", "no"] = Field(
        "auto", description="Box coordinates in 0..1 of the model input (auto: when every coordinate is <= 1.5)."
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


def _has_area(boxes: Array) -> npt.NDArray[np.bool_]:
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


def guess_format(output_shapes: list[list[Any]], classes: int | None) -> str:
    """The head family from the output shapes (and the label count when known)."""
    if len(output_shapes) > 1:
        return "boxes"
    dims = [d for d in output_shapes[0][-2:] if isinstance(d, int)] if output_shapes else []
    if classes is not None:
        if 4 + classes in dims:
            return "yolov8"
        if 5 + classes in dims:
            return "yolov5"
        if 6 in dims:
            return "boxes"
    log.info("detect: cannot tell the head family from %s without labels; assuming yolov8 (set format)", output_shapes)
    return "yolov8"


class Detect:
    """Model outputs (+ the frame's geometry) -> {"detections": [...], "frame": {"w", "h"}}."""

    def __init__(
        self,
        cfg: DetectConfig,
        labels: list[str] | None,
        output_names: list[str],
        output_shapes: list[list[Any]],
        input_size: tuple[int, int],
    ) -> None:
        self.cfg = cfg
        self.labels = labels
        self.names = [n.lower() for n in output_names]
        self.input_size = input_size
        self.format = (
            cfg.format if cfg.format != "auto" else guess_format(output_shapes, len(labels) if labels else None)
        )
        self.allowed = self._allowed_classes(cfg.classes)

    def _allowed_classes(self, wanted: list[str | int] | None) -> npt.NDArray[np.int64] | None:
        if wanted is None:
            return None
        out = []
        for item in wanted:
            if isinstance(item, int):
                out.append(item)
            elif self.labels and item in self.labels:
                out.append(self.labels.index(item))
            elif item.isdigit():
                out.append(int(item))
            else:
                known = ", ".join(self.labels[:20]) if self.labels else "none (the model has no labels)"
                raise ModelError(f"postprocess.classes: unknown label {item!r}; labels: {known}")
        return np.asarray(out, dtype=np.int64)

    def __call__(self, outputs: list[npt.NDArray[Any]], geometry: Geometry | None = None) -> dict[str, Any]:
        """Decode, filter, suppress, map; detections best first."""
        boxes, scores, classes = self._decode(outputs)
        keep = (scores >= self.cfg.score_threshold) & _has_area(boxes)
        if self.allowed is not None:
            keep &= np.isin(classes, self.allowed)
        boxes, scores, classes = boxes[keep], scores[keep], classes[keep]
        if boxes.shape[0] and self._normalized(boxes):
            boxes = boxes * np.asarray([*self.input_size, *self.input_size], dtype=np.float32)
        if self.format == "boxes":
            order = np.argsort(-scores, kind="stable")[: self.cfg.max_detections]
        else:
            if scores.shape[0] > MAX_CANDIDATES:
                top = np.argpartition(-scores, MAX_CANDIDATES - 1)[:MAX_CANDIDATES]
                boxes, scores, classes = boxes[top], scores[top], classes[top]
            order = nms(
                boxes,
                scores,
                self.cfg.iou_threshold,
                self.cfg.max_detections,
                None if self.cfg.class_agnostic else classes,
            )
        boxes, scores, classes = boxes[order], scores[order], classes[order]
        if geometry is None:
            w, h = self.input_size
            geometry = Geometry(w, h, 1.0, 1.0, 0, 0)
        mapped = geometry.to_source(boxes) if boxes.shape[0] else boxes
        if mapped.shape[0]:  # a box that lay outside the frame has no area once clipped to it: never published
            visible = _has_area(np.round(mapped, 1))
            mapped, scores, classes = mapped[visible], scores[visible], classes[visible]
        detections = [
            {
                "label": self._label(int(c)),
                "index": int(c),
                "score": round(float(s), 4),
                "box": [round(float(v), 1) for v in box],
            }
            for box, s, c in zip(mapped, scores, classes, strict=True)
        ]
        return {"detections": detections, "frame": {"w": geometry.width, "h": geometry.height}}

    def _label(self, index: int) -> str:
        return self.labels[index] if self.labels and 0 <= index < len(self.labels) else str(index)

    def _normalized(self, boxes: Array) -> bool:
        if self.cfg.normalized != "auto":
            return self.cfg.normalized == "yes"
        return bool(np.abs(boxes).max() <= 1.5)

    def _decode(self, outputs: list[npt.NDArray[Any]]) -> tuple[Array, Array, npt.NDArray[np.int64]]:
        if self.format == "boxes":
            return self._decode_boxes(outputs)
        return self._decode_yolo(np.asarray(outputs[0], dtype=np.float32), objectness=self.format == "yolov5")

    def _decode_yolo(self, out: Array, *, objectness: bool) -> tuple[Array, Array, npt.NDArray[np.int64]]:
        a = out.reshape(out.shape[-2], out.shape[-1]) if out.ndim >= 2 else out.reshape(1, -1)
        extra = 5 if objectness else 4
        width = extra + len(self.labels) if self.labels else None
        if width is not None and a.shape[1] != width and a.shape[0] == width:
            a = a.T
        elif width is None and not objectness and a.shape[0] < a.shape[1]:
            a = a.T  # [4 + nc, N]: the channel axis is the short one
        if a.shape[1] <= extra - 1:
            raise ModelError(f"detect: output of shape {list(out.shape)} is too narrow for a {self.format} head")
        xyxy = cxcywh_to_xyxy(np.ascontiguousarray(a[:, :4]))
        cls = a[:, extra:]
        if cls.shape[1] == 0:  # a single-class head without class scores
            scores = a[:, 4] if objectness else np.ones(a.shape[0], np.float32)
            return xyxy, scores.astype(np.float32), np.zeros(a.shape[0], np.int64)
        idx = cls.argmax(axis=1)
        scores = cls[np.arange(cls.shape[0]), idx]
        if objectness:
            scores = scores * a[:, 4]
        return xyxy, scores.astype(np.float32), idx.astype(np.int64)

    def _split_outputs(
        self, outputs: list[npt.NDArray[Any]]
    ) -> tuple[Array | None, Array | None, npt.NDArray[np.int64] | None, int | None, list[npt.NDArray[Any]]]:
        """Separate outputs by name (or a boxes-like shape): boxes, scores, classes, count, the rest."""
        boxes = scores = classes = None
        count: int | None = None
        rest: list[npt.NDArray[Any]] = []
        for name, out in zip(self.names, outputs, strict=True):
            arr = np.asarray(out)
            if "num" in name:
                count = int(arr.reshape(-1)[0])
            elif "box" in name or (boxes is None and arr.shape and arr.shape[-1] == 4):
                boxes = arr.astype(np.float32).reshape(-1, 4)
            elif "score" in name:
                scores = arr.astype(np.float32).reshape(-1)
            elif "class" in name or "label" in name:
                classes = arr.reshape(-1).astype(np.int64)
            else:
                rest.append(arr)
        return boxes, scores, classes, count, rest

    def _decode_boxes(self, outputs: list[npt.NDArray[Any]]) -> tuple[Array, Array, npt.NDArray[np.int64]]:
        if len(outputs) == 1:
            a = np.asarray(outputs[0], dtype=np.float32)
            a = a.reshape(-1, a.shape[-1])
            if a.shape[1] < 6:
                raise ModelError(
                    f"detect: a boxes output must be [N, 6] (x1, y1, x2, y2, score, class), got {list(a.shape)}"
                )
            return a[:, :4].copy(), a[:, 4].copy(), a[:, 5].astype(np.int64)
        boxes, scores, classes, count, rest = self._split_outputs(outputs)
        if scores is None and rest:
            scores = rest.pop(0).astype(np.float32).reshape(-1)
        if classes is None:
            classes = rest.pop(0).reshape(-1).astype(np.int64) if rest else np.zeros_like(scores, dtype=np.int64)
        if boxes is None or scores is None:
            raise ModelError(f"detect: cannot find boxes and scores among the outputs {self.names}")
        n = min(boxes.shape[0], scores.shape[0], classes.shape[0], count if count is not None else boxes.shape[0])
        return boxes[:n], scores[:n], classes[:n]


@POSTPROCESSORS.register("detect", DetectConfig)
def make_detect(
    cfg: DetectConfig,
    output_names: list[str],
    output_shapes: list[list[Any]],
    metadata: dict[str, str],
    input_size: tuple[int, int] | None,
) -> Postprocessor:
    """Build the detector postprocessor and check it fits the head; the input size scales normalised
    boxes and is the fallback frame."""
    if input_size is None:
        raise ModelError("detect needs the model's input size; set preprocess.size")
    labels = load_labels(cfg.labels, metadata)
    _check_forced_format(cfg, output_shapes)
    detect = Detect(cfg, labels, output_names, output_shapes, input_size)
    if labels and detect.format in ("yolov5", "yolov8") and output_shapes:
        width = len(labels) + (5 if detect.format == "yolov5" else 4)
        dims = [d for d in output_shapes[0][-2:] if isinstance(d, int)]
        if len(dims) == 2 and width not in dims:
            raise ModelError(
                f"{len(labels)} labels do not fit a {detect.format} head of shape {output_shapes[0]} "
                f"(expected a dimension of {width}); fix postprocess.labels or postprocess.format"
            )
    return detect


def _check_forced_format(cfg: DetectConfig, output_shapes: list[list[Any]]) -> None:
    """A forced `format: yolov5` on a channels-first head ([1, 4 + nc, N], as YOLOv8 / YOLO11 export it)
    would read N as the class count and publish nonsense: refuse it. (A transposed YOLOv8 head,
    [1, N, 4 + nc], looks like a YOLOv5 one without labels; with labels the width check catches it.)"""
    if cfg.format != "yolov5" or len(output_shapes) != 1 or len(output_shapes[0]) != 3:
        return
    rows, cols = output_shapes[0][1:]
    if isinstance(rows, int) and isinstance(cols, int) and rows < cols:
        raise ModelError(
            f"postprocess.format yolov5 does not fit the head {output_shapes[0]}: YOLOv5 heads are "
            f"[1, N, 5 + classes]; this one is channels-first [1, 4 + classes, N] like YOLOv8 / YOLO11 "
            "export: set format: yolov8 (or auto)"
        )


def crop_box(box: list[float], width: int, height: int) -> tuple[int, int, int, int]:
    """A detection's box as integer pixel bounds inside the frame (at least 1 x 1)."""
    x1 = min(max(int(box[0]), 0), width - 1)
    y1 = min(max(int(box[1]), 0), height - 1)
    x2 = min(max(int(np.ceil(box[2])), x1 + 1), width)
    y2 = min(max(int(np.ceil(box[3])), y1 + 1), height)
    return x1, y1, x2, y2
