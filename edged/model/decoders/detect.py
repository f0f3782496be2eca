"""`detect` postprocessing: decode YOLO-style heads or ready boxes, then the shared finish (detections.py).

Head families (`postprocess.format`):

- `yolov5`: one output [1, N, 5 + nc]: cx, cy, w, h, objectness, class scores; score = objectness x class.
- `yolov8` (YOLOv8, YOLO11 and the like): one output [1, 4 + nc, N] (or transposed [1, N, 4 + nc]):
  cx, cy, w, h, class scores; no objectness. Pose models add K keypoints per box after the class scores
  ([1, 4 + nc + K x 3, N]: x, y in input pixels and a visibility each, as Ultralytics exports them; K from
  `keypoints` or the model's `kpt_shape` metadata), published as `keypoints` and `keypoint_scores`.
- `yolox`: one output [1, N, 5 + nc] like YOLOv5's, but raw: grid offsets and log sizes per stride (8, 16,
  32), decoded on the model's grid as YOLOX's own `demo_postprocess` does (score = objectness x class).
- `boxes`: the model decoded its boxes itself. One output [1, N, 6] (x1, y1, x2, y2, score, class), or
  separate outputs named by `outputs`, else found by name (`*box*`, `*score*`/`*conf*`, `*class*`/`*label*`,
  optional `*num*` count) or by shape, only where one reading fits (detectoutputs.py). With NMS in the graph
  (YOLOv10 and end-to-end exports, SSD with NMS) they are used as given;
  SSD-style outputs without it (UltraFace, MobileNet-SSD exports: boxes [1, N, 4] beside a score per class
  [1, N, C] whose column 0 is the background) take each box's best class and get edged's NMS.

A YOLO head is the model's only output, or the one `outputs.head` names. What a model gives as boxes is checked
on check-config's synthetic frame and on every frame: corners in order and inside the input (or 0..1 of it),
else the frame's result is refused (`check_boxes`). A per-cell map of box regressions, or an SSD's undecoded
`loc` beside its priors, is refused with what to do instead.

Coordinates are model-input pixels (or 0..1 of the input when `normalized`) and are mapped back through
the letterbox or stretch of the frame they came from (`Geometry`), clipped to the frame.
"""

from __future__ import annotations

import ast
import logging
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field

from edged.core.errors import ModelError
from edged.model.detections import (
    Array,
    BoxOptions,
    Candidates,
    Finisher,
    check_boxes,
    cxcywh_to_xyxy,
    input_size_of,
    nms,
)
from edged.model.detectoutputs import DetectOutputs, box_roles, head_output
from edged.model.postprocess import POSTPROCESSORS, Postprocessor, load_labels, with_reading
from edged.model.preprocess import Geometry

__all__ = ["Detect", "DetectConfig", "crop_box", "make_detect", "nms"]

log = logging.getLogger(__name__)

YOLOX_STRIDES = (8, 16, 32)


class DetectConfig(BoxOptions):
    """Object detection: YOLO-style heads or models that output boxes themselves; see edged/model/decoders/detect.py."""

    type: Literal["detect"] = Field(description="Postprocessor type key.")
    format: Literal["auto", "yolov5", "yolov8", "yolox", "boxes"] = Field(
        "auto",
        description="Head family. yolov5: [1, N, 5+nc] with objectness; yolov8 (also YOLO11): [1, 4+nc, N] "
        "or transposed, no objectness; yolox: [1, N, 5+nc] raw grid offsets and log sizes (strides 8/16/32); "
        "boxes: NMS inside the graph (YOLOv10, end-to-end and SSD exports), one [1, N, 6] output (x1, y1, "
        "x2, y2, score, class) or separate boxes / scores / classes outputs. auto: from the shapes, the input "
        "size and the labels; a [1, N, 5+nc] head with one prediction per stride 8/16/32 grid cell (YOLOX, or "
        "a head that decodes its own boxes) is refused until this is set.",
    )
    normalized: Literal["auto", "yes", "no"] = Field(
        "auto", description="Box coordinates in 0..1 of the model input (auto: when every coordinate is <= 1.5)."
    )
    outputs: DetectOutputs = Field(default_factory=DetectOutputs)
    keypoints: int | None = Field(
        None,
        ge=1,
        le=1000,
        description="Pose heads (yolov8 format: YOLOv8/YOLO11-pose [1, 4 + nc + K x 3, N]): keypoints per box, each "
        "x, y, visibility; default: the model's kpt_shape metadata (Ultralytics), else none.",
    )


def grid_cells(input_size: tuple[int, int]) -> int:
    """Cells of a stride 8/16/32 head on an input of `input_size`: one prediction each for anchor-free heads
    (YOLOX, YOLOv6, YOLOv8), three for YOLOv5/v7's anchors."""
    w, h = input_size
    return sum((w // s) * (h // s) for s in YOLOX_STRIDES)


def guess_format(output_shapes: list[list[Any]], classes: int | None, input_size: tuple[int, int]) -> str:
    """The head family from the output shapes, the model's input size and the label count when known.

    [1, C, N] with N the grid cells is YOLOv8's layout, and N three times the grid cells is YOLOv5's. A [1, N, C] head
    with one prediction per cell is ambiguous: YOLOX's raw grid offsets and log sizes, or a head that decoded
    its own boxes (YOLOv6, a transposed YOLOv8); guessing wrong publishes boxes at the origin, so unless the
    labels settle it (C = 4 + classes: YOLOv8) edged refuses and asks for `format`.
    """
    if len(output_shapes) > 1:
        return "boxes"
    dims = [d for d in output_shapes[0][-2:] if isinstance(d, int)] if output_shapes else []
    by_grid = _format_by_grid(dims, classes, input_size, output_shapes[0] if output_shapes else [])
    if by_grid is not None:
        return by_grid
    if classes is not None:
        by_width = [(4 + classes, "yolov8"), (5 + classes, "yolov5"), (6, "boxes")]  # first match wins
        found = next((fmt for width, fmt in by_width if width in dims), None)
        if found is not None:
            return found
    log.info("detect: cannot tell the head family from %s without labels; assuming yolov8 (set format)", output_shapes)
    return "yolov8"


def _format_by_grid(dims: list[int], classes: int | None, input_size: tuple[int, int], shape: list[Any]) -> str | None:
    """The family when the anchor count is the input's stride 8/16/32 grid (once or three times)."""
    cells = grid_cells(input_size)
    if len(dims) != 2:  # [N, C] or [C, N]
        return None
    if dims[1] == cells and dims[0] < dims[1]:
        return "yolov8"
    if dims[0] == 3 * cells and dims[1] >= 6:  # cx, cy, w, h, objectness, a class
        return "yolov5"
    if dims[0] != cells or dims[1] < 5:
        return None
    if classes is not None and dims[1] == 4 + classes:
        return "yolov8"
    w, h = input_size
    raise ModelError(
        f"detect: output {shape} has one prediction per grid cell of a {w}x{h} input (strides 8, 16, 32): set "
        "postprocess.format: yolox for a YOLOX head (raw grid offsets and log sizes), or yolov5 (with "
        "objectness) / yolov8 (without) for a head that outputs its boxes in pixels"
    )


def yolox_grid(input_size: tuple[int, int], anchors: int) -> tuple[Array, Array]:
    """(grid x, y per anchor [N, 2], stride per anchor [N, 1]) for a YOLOX head on an input of `input_size`."""
    w, h = input_size
    grids, strides = [], []
    for s in YOLOX_STRIDES:
        gw, gh = w // s, h // s
        xv, yv = np.meshgrid(np.arange(gw), np.arange(gh))
        grids.append(np.stack((xv, yv), 2).reshape(-1, 2))
        strides.append(np.full((gw * gh, 1), s))
    grid = np.concatenate(grids).astype(np.float32)
    stride = np.concatenate(strides).astype(np.float32)
    if grid.shape[0] != anchors:
        raise ModelError(
            f"detect: a yolox head on a {w}x{h} input has {grid.shape[0]} anchors (strides 8, 16, 32); this "
            f"model has {anchors}: check preprocess.size or postprocess.format"
        )
    return grid, stride


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
        self.names = output_names
        self.input_size = input_size
        named = [output_shapes[output_names.index(cfg.outputs.head)]] if cfg.outputs.head in output_names else None
        self.format = (
            cfg.format
            if cfg.format != "auto"
            else guess_format(named or output_shapes, len(labels) if labels else None, input_size)
        )
        self.head = 0  # the YOLO head's output
        self.roles: dict[str, int] = {}  # a multi-output boxes model: role -> output
        if self.format != "boxes":
            self.head = head_output(cfg.outputs, output_names, output_shapes)
        elif len(output_names) > 1:
            self.roles = box_roles(cfg.outputs, output_names, output_shapes)
        self.finish = Finisher(cfg, labels, input_size)
        self._grid: tuple[Array, Array] | None = None
        self.kpt_shape = (0, 0)  # (K keypoints per box, values per keypoint): make_detect sets a pose head's
        self.suppress = False  # boxes format: whether the graph left the NMS to edged (per-class scores)

    def __call__(self, outputs: list[npt.NDArray[Any]], geometry: Geometry | None = None) -> dict[str, Any]:
        """Decode, filter, suppress, map; detections best first."""
        cands = self._decode(outputs)
        if cands.boxes.shape[0] and self._normalized(cands.boxes):
            cands.boxes = cands.boxes * np.asarray([*self.input_size, *self.input_size], dtype=np.float32)
        return self.finish(cands, geometry, suppress=self.format != "boxes" or self.suppress)

    def _normalized(self, boxes: Array) -> bool:
        if self.cfg.normalized != "auto":
            return self.cfg.normalized == "yes"
        finite = boxes[np.isfinite(boxes).all(axis=1)]
        return bool(finite.size and np.abs(finite).max() <= 1.5)

    def _decode(self, outputs: list[npt.NDArray[Any]]) -> Candidates:
        if self.format == "boxes":
            return self._decode_boxes(outputs)
        out = np.asarray(outputs[self.head], dtype=np.float32)
        if self.format == "yolox":
            return self._decode_yolo(self._yolox_to_pixels(out), objectness=True)
        return self._decode_yolo(out, objectness=self.format == "yolov5")

    def _yolox_to_pixels(self, out: Array) -> Array:
        """A raw YOLOX head -> the YOLOv5 layout in input pixels (YOLOX's demo_postprocess)."""
        a: Array = np.array(out.reshape(out.shape[-2], out.shape[-1]), dtype=np.float32)
        if self._grid is None:
            self._grid = yolox_grid(self.input_size, a.shape[0])
        grid, stride = self._grid
        a[:, :2] = (a[:, :2] + grid) * stride
        a[:, 2:4] = np.exp(np.minimum(a[:, 2:4], 20.0)) * stride
        return a

    def _decode_yolo(self, out: Array, *, objectness: bool) -> Candidates:
        a = out.reshape(out.shape[-2], out.shape[-1]) if out.ndim >= 2 else out.reshape(1, -1)
        extra = 5 if objectness else 4
        kpts = self.kpt_shape[0] * self.kpt_shape[1]
        width = extra + len(self.labels) + kpts if self.labels else None
        if width is not None and a.shape[1] != width and a.shape[0] == width:
            a = a.T
        elif width is None and not objectness and a.shape[0] < a.shape[1]:
            a = a.T  # [4 + nc, N]: the channel axis is the short one
        if a.shape[1] <= extra - 1:
            raise ModelError(f"detect: output of shape {list(out.shape)} is too narrow for a {self.format} head")
        xyxy = cxcywh_to_xyxy(np.ascontiguousarray(a[:, :4]))
        if kpts:
            return self._with_keypoints(xyxy, a[:, extra:-kpts], a[:, -kpts:])
        cls = a[:, extra:]
        if cls.shape[1] == 0:  # a single-class head without class scores
            scores = a[:, 4] if objectness else np.ones(a.shape[0], np.float32)
            return Candidates(xyxy, scores.astype(np.float32), np.zeros(a.shape[0], np.int64))
        idx = cls.argmax(axis=1)
        scores = cls[np.arange(cls.shape[0]), idx]
        if objectness:
            scores = scores * a[:, 4]
        return Candidates(xyxy, scores.astype(np.float32), idx.astype(np.int64))

    def _with_keypoints(self, xyxy: Array, cls: Array, kpts: Array) -> Candidates:
        """A pose head's boxes with their keypoints (x, y in input pixels) and visibilities."""
        count, per = self.kpt_shape
        idx = cls.argmax(axis=1) if cls.shape[1] else np.zeros(cls.shape[0], np.int64)
        scores = cls[np.arange(cls.shape[0]), idx] if cls.shape[1] else np.ones(cls.shape[0], np.float32)
        points = kpts.reshape(-1, count, per)
        values = {"keypoint_scores": np.ascontiguousarray(points[:, :, 2])} if per >= 3 else {}
        return Candidates(
            xyxy, scores.astype(np.float32), idx.astype(np.int64), {"keypoints": points[:, :, :2].copy()}, values
        )

    def _per_class_scores(self, boxes: Array, per_class: Array) -> Candidates:
        """SSD-style outputs without NMS in the graph (UltraFace, MobileNet-SSD exports): decoded boxes [N, 4]
        and a score per class [N, C] whose column 0 is the background (unless the labels already count C
        classes); each box takes its best class, and edged runs the NMS the graph did not."""
        self.suppress = True
        if self.labels is None or per_class.shape[1] == len(self.labels) + 1:
            per_class = per_class[:, 1:]  # SSD's class 0 is "background"
        idx = per_class.argmax(axis=1)
        scores = per_class[np.arange(per_class.shape[0]), idx]
        return Candidates(boxes, scores.astype(np.float32), idx.astype(np.int64))

    def _decode_boxes(self, outputs: list[npt.NDArray[Any]]) -> Candidates:
        if len(outputs) == 1:
            a = np.asarray(outputs[0], dtype=np.float32)
            a = a.reshape(-1, a.shape[-1])
            if a.shape[1] < 6:
                raise ModelError(
                    f"detect: a boxes output must be [N, 6] (x1, y1, x2, y2, score, class), got {list(a.shape)}"
                )
            check_boxes(a[:, :4], self.input_size)
            return Candidates(a[:, :4].copy(), a[:, 4].copy(), a[:, 5].astype(np.int64))
        boxes = self._role(outputs, "boxes")
        if boxes is None or boxes.ndim > 3 or boxes.shape[-1] != 4:
            shape = None if boxes is None else list(boxes.shape)
            raise ModelError(f"detect: the boxes output is {shape}, not a list of boxes [1, N, 4]")
        boxes = boxes.astype(np.float32).reshape(-1, 4)
        check_boxes(boxes, self.input_size)
        scores = self._role(outputs, "scores")
        if scores is None:
            raise ModelError(f"detect: no scores among the outputs {self.names}")
        scores = scores.astype(np.float32)  # [.., N] one per box, or [.., N, C] per class (raw SSD)
        classes = self._role(outputs, "classes")
        counted = self._role(outputs, "count")
        if scores.ndim >= 2 and scores.shape[-1] > 1 and classes is None:
            per_class = scores.reshape(-1, scores.shape[-1])
            if per_class.shape[0] == boxes.shape[0]:
                return self._per_class_scores(boxes, per_class)
        scores = scores.reshape(-1)
        self.suppress = False
        cls = classes.reshape(-1).astype(np.int64) if classes is not None else np.zeros_like(scores, dtype=np.int64)
        count = int(counted.reshape(-1)[0]) if counted is not None and counted.size else boxes.shape[0]
        n = min(boxes.shape[0], scores.shape[0], cls.shape[0], max(count, 0))
        return Candidates(boxes[:n], scores[:n], cls[:n])

    def _role(self, outputs: list[npt.NDArray[Any]], role: str) -> npt.NDArray[Any] | None:
        index = self.roles.get(role)
        return None if index is None else np.asarray(outputs[index])


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
    input_size = input_size_of("detect", input_size)
    labels = load_labels(cfg.labels, metadata)
    _check_forced_format(cfg, output_shapes)
    detect = Detect(cfg, labels, output_names, output_shapes, input_size)
    detect.kpt_shape = keypoint_shape(cfg, metadata, detect.format)
    head = output_shapes[detect.head] if output_shapes else []
    if detect.format != "boxes" and len(head) > 3:  # YOLO heads are [1, N, C] or [1, C, N]
        raise ModelError(
            f"detect {detect.format} needs a head [1, N, C] or [1, C, N]; the model's output "
            f"{output_names[detect.head]} is {head}, a map: use the postprocess type of its family (centernet, "
            "text) or raw"
        )
    if detect.format == "yolox" and head and isinstance(head[-2], int):
        yolox_grid(input_size, head[-2])  # the head's anchors must be the input's grid
    if labels and detect.format in ("yolov5", "yolov8", "yolox") and head:
        width = len(labels) + (4 if detect.format == "yolov8" else 5) + detect.kpt_shape[0] * detect.kpt_shape[1]
        dims = [d for d in head[-2:] if isinstance(d, int)]
        if len(dims) == 2 and width not in dims:
            raise ModelError(
                f"{len(labels)} labels do not fit a {detect.format} head of shape {head} "
                f"(expected a dimension of {width}); fix postprocess.labels or postprocess.format"
            )
    return with_reading(detect, _reading(detect, output_names, output_shapes))


def _reading(detect: Detect, names: list[str], shapes: list[list[Any]]) -> str:
    """What check-config shows: the head (or the boxes' outputs), the labels, the box encoding."""
    labels = f"{len(detect.labels)} labels" if detect.labels else "no labels (classes published as numbers)"
    scale = {"auto": "input pixels or 0..1 (auto)", "yes": "0..1 of the input", "no": "input pixels"}
    where = scale[detect.cfg.normalized]
    if detect.format == "boxes":
        if detect.roles:
            parts = ", ".join(f"{role} {names[i]} {shapes[i]}" for role, i in sorted(detect.roles.items()))
        else:
            parts = f"rows x1 y1 x2 y2 score class of {names[0]} {shapes[0]}"
        return f"detect boxes: {parts}; {labels}; corners in {where}"
    pose = f", {detect.kpt_shape[0]} keypoints per box" if detect.kpt_shape[0] else ""
    head = f"{names[detect.head]} {shapes[detect.head]}"
    return f"detect {detect.format}: head {head}; {labels}{pose}; cx cy w h in {where}"


def keypoint_shape(cfg: DetectConfig, metadata: dict[str, str], fmt: str) -> tuple[int, int]:
    """(keypoints per box, values per keypoint) of a pose head: `keypoints` (x, y, visibility each), else the
    model's Ultralytics `kpt_shape` metadata ("[17, 3]"); (0, 0) for a plain detector."""
    shape = (cfg.keypoints, 3) if cfg.keypoints else None
    if shape is None and metadata.get("kpt_shape"):
        try:
            parsed = ast.literal_eval(metadata["kpt_shape"])
            shape = (int(parsed[0]), int(parsed[1]))
        except (ValueError, SyntaxError, TypeError, IndexError):
            raise ModelError(f"detect: cannot read the model's kpt_shape metadata {metadata['kpt_shape']!r}") from None
    if shape is None:
        return (0, 0)
    if fmt != "yolov8":
        raise ModelError(f"detect: keypoints are read from yolov8 pose heads only; this head is read as {fmt}")
    if shape[1] not in (2, 3):
        raise ModelError(f"detect: a keypoint has 2 (x, y) or 3 (x, y, visibility) values, not {shape[1]}")
    return shape


def _check_forced_format(cfg: DetectConfig, output_shapes: list[list[Any]]) -> None:
    """A forced `format: yolov5` (or yolox) on a channels-first head ([1, 4 + nc, N], as YOLOv8 / YOLO11 export it)
    would read N as the class count and publish nonsense: refuse it. (A transposed YOLOv8 head,
    [1, N, 4 + nc], looks like a YOLOv5 one without labels; with labels the width check catches it.)"""
    if cfg.format not in ("yolov5", "yolox") or len(output_shapes) != 1 or len(output_shapes[0]) != 3:
        return
    rows, cols = output_shapes[0][1:]
    if isinstance(rows, int) and isinstance(cols, int) and rows < cols:
        raise ModelError(
            f"postprocess.format {cfg.format} does not fit the head {output_shapes[0]}: {cfg.format} heads are "
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
