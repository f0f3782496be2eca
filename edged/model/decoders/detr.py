"""`detr` postprocessing: set-prediction detectors (DETR, Deformable/Conditional DETR, RT-DETR, RF-DETR,
D-FINE), which output a fixed number of queries and need no NMS.

Outputs it reads:

- two outputs, one per query: boxes [1, Q, 4] (`pred_boxes`, `boxes`, `dets`: the one whose last axis is 4)
  and class logits [1, Q, C] (`logits`, `labels`, `scores`: the other); `outputs.boxes` / `outputs.logits`
  name them where the names and shapes leave more than one reading (then the model is refused until they do);
- or one [1, Q, 4 + C] output (Ultralytics' RT-DETR export: boxes first, then the class scores).

Boxes are centre, size in 0..1 of the model input (`box_format: cxcywh`, as every family above trains them),
or corners with `box_format: xyxy`; `normalized` as for `detect`. Class scores: a softmax over C whose last
class is "no object" for the original DETR (`activation: softmax`; auto picks it when the logits have one
class more than the labels), a sigmoid for the focal-loss families (auto otherwise; scores already in 0..1
are kept). Each query is one detection with its best class; the shared finish thresholds, filters classes
and maps to the frame, without NMS.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field

from edged.core.errors import ModelError
from edged.core.settings import Strict
from edged.model.detections import (
    Array,
    BoxOptions,
    Candidates,
    Finisher,
    check_boxes,
    cxcywh_to_xyxy,
    in_unit_range,
    input_size_of,
    sigmoid,
)
from edged.model.postprocess import POSTPROCESSORS, Postprocessor, load_labels, with_reading
from edged.model.preprocess import Geometry

__all__ = ["Detr", "DetrConfig", "make_detr"]

MAX_QUERIES = 3000  # DETR 100, RT-DETR and RF-DETR 300, DINO 900; a YOLO head has thousands of anchors


class DetrOutputs(Strict):
    """Which output is which, by name (when the automatic match cannot tell)."""

    boxes: str | None = Field(None, description="The boxes output's name ([1, Q, 4]).")
    logits: str | None = Field(None, description="The class logits output's name ([1, Q, C]).")


class DetrConfig(BoxOptions):
    """Set-prediction detectors (DETR, RT-DETR, RF-DETR, D-FINE); see edged/model/decoders/detr.py."""

    type: Literal["detr"] = Field(description="Postprocessor type key.")
    score_threshold: float = Field(0.5, ge=0, le=1, description="Detections scoring less are dropped.")
    activation: Literal["auto", "softmax", "sigmoid", "none"] = Field(
        "auto",
        description="Class scores: softmax (original DETR: the last class is 'no object'), sigmoid (focal-loss "
        "families), none (already probabilities); auto: softmax when there is one class more than the labels, "
        "else sigmoid unless the scores are already in 0..1.",
    )
    box_format: Literal["cxcywh", "xyxy"] = Field("cxcywh", description="How each query's four box numbers read.")
    normalized: Literal["auto", "yes", "no"] = Field(
        "auto", description="Box coordinates in 0..1 of the model input (auto: when every coordinate is <= 1.5)."
    )
    outputs: DetrOutputs = Field(default_factory=DetrOutputs)


def softmax(x: Array) -> Array:
    """Softmax over the last axis."""
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return np.asarray(e / e.sum(axis=-1, keepdims=True), dtype=np.float32)


class Detr:
    """Queries -> detections (no NMS)."""

    def __init__(
        self,
        cfg: DetrConfig,
        labels: list[str] | None,
        names: list[str],
        layout: tuple[int, int] | None,
        input_size: tuple[int, int],
    ) -> None:
        self.cfg = cfg
        self.names = names
        self._checked: list[tuple[int, ...]] | None = None
        self.labels = labels
        self.layout = layout  # (boxes output, logits output), or None for one [1, Q, 4 + C] output
        self.input_size = input_size
        self.finish = Finisher(cfg, labels, input_size)

    def __call__(self, outputs: list[npt.NDArray[Any]], geometry: Geometry | None = None) -> dict[str, Any]:
        """Each query's best class; threshold, map to the frame."""
        return self.finish(self.decode(outputs), geometry, suppress=False)

    def decode(self, outputs: list[npt.NDArray[Any]]) -> Candidates:
        """Candidates in model-input pixels."""
        shapes = [np.shape(o) for o in outputs]
        if self._checked != shapes:  # the axes the model left dynamic, once their sizes are known
            _layout(self.names, [list(s) for s in shapes], self.cfg.outputs)
            self._checked = shapes
        if self.layout is None:
            both = np.asarray(outputs[0], dtype=np.float32)
            both = both.reshape(-1, both.shape[-1])
            boxes, logits = both[:, :4], both[:, 4:]
        else:
            boxes = np.asarray(outputs[self.layout[0]], dtype=np.float32).reshape(-1, 4)
            logits = np.asarray(outputs[self.layout[1]], dtype=np.float32)
            logits = logits.reshape(-1, logits.shape[-1])
        probs = self._scores(logits)
        idx = probs.argmax(axis=1)
        scores = probs[np.arange(probs.shape[0]), idx]
        xyxy = cxcywh_to_xyxy(np.ascontiguousarray(boxes)) if self.cfg.box_format == "cxcywh" else boxes.copy()
        check_boxes(xyxy, self.input_size)
        if xyxy.shape[0] and self._normalized(xyxy):
            xyxy = xyxy * np.asarray([*self.input_size, *self.input_size], dtype=np.float32)
        return Candidates(xyxy.astype(np.float32), scores.astype(np.float32), idx.astype(np.int64))

    def _scores(self, logits: Array) -> Array:
        activation = self.cfg.activation
        if activation == "auto":
            if self.labels is not None and logits.shape[1] == len(self.labels) + 1:
                activation = "softmax"
            elif not in_unit_range(logits):
                activation = "sigmoid"
            else:
                activation = "none"
        if activation == "softmax":
            return softmax(logits)[:, :-1]  # the last class is "no object"
        return sigmoid(logits) if activation == "sigmoid" else logits

    def _normalized(self, boxes: Array) -> bool:
        if self.cfg.normalized != "auto":
            return self.cfg.normalized == "yes"
        finite = boxes[np.isfinite(boxes).all(axis=1)]
        return bool(finite.size and np.abs(finite).max() <= 1.5)  # 0..1 and a margin


def _layout(
    output_names: list[str], output_shapes: list[list[Any]], named: DetrOutputs | None = None
) -> tuple[int, int] | None:
    """(boxes output, logits output) among per-query outputs, or None for a single [1, Q, 4 + C] output."""
    described = ", ".join(f"{n} {s}" for n, s in zip(output_names, output_shapes, strict=True))
    named = named or DetrOutputs()
    queries = [i for i, s in enumerate(output_shapes) if len(s) == 3]  # [1, Q, X]
    if len(output_shapes) == 1 and queries:
        count, width = output_shapes[0][-2:]
        if isinstance(width, int) and width < 5:  # four box numbers and a class
            raise ModelError(f"detr needs [1, Q, 4 + classes]; the model has {described}")
        if isinstance(count, int) and (count > MAX_QUERIES or (isinstance(width, int) and count < width)):
            raise ModelError(
                f"detr needs [1, Q, 4 + classes] with at most {MAX_QUERIES} queries; the model has {described}, "
                "a YOLO-style head: use detect"
            )
        return None
    box = _named(named.boxes, "boxes", output_names, described)
    if box is None:
        boxes = [i for i in queries if output_shapes[i][-1] == 4]
        by_name = [i for i in boxes if "box" in output_names[i].lower()]
        if not boxes:
            raise ModelError(
                f"detr needs a boxes output [1, Q, 4] and class logits [1, Q, C]; the model has {described}"
            )
        if len(boxes) > 1 and len(by_name) != 1:
            raise ModelError(f"detr: {len(boxes)} outputs could be the boxes ({described}): name it with outputs.boxes")
        box = by_name[0] if len(boxes) > 1 else boxes[0]
    logits = _named(named.logits, "logits", output_names, described)
    if logits is None:
        others = [i for i in queries if i != box and output_shapes[i][1] == output_shapes[box][1]]
        if not others:
            raise ModelError(f"detr needs class logits [1, Q, C] beside the boxes; the model has {described}")
        if len(others) > 1:
            raise ModelError(
                f"detr: {len(others)} outputs could be the class logits ({described}): name it with outputs.logits"
            )
        logits = others[0]
    return box, logits


def _named(name: str | None, role: str, output_names: list[str], described: str) -> int | None:
    if name is None:
        return None
    if name not in output_names:
        raise ModelError(f"postprocess.outputs.{role} {name!r} is not an output ({described})")
    return output_names.index(name)


@POSTPROCESSORS.register("detr", DetrConfig)
def make_detr(
    cfg: DetrConfig,
    output_names: list[str],
    output_shapes: list[list[Any]],
    metadata: dict[str, str],
    input_size: tuple[int, int] | None,
) -> Postprocessor:
    """Build the decoder; refuse outputs that are not per-query boxes and class scores."""
    input_size = input_size_of("detr", input_size)
    layout = _layout(output_names, output_shapes, cfg.outputs)
    labels = load_labels(cfg.labels, metadata)
    if layout is None:
        parts = f"queries {output_names[0]} {output_shapes[0]} as boxes then class scores"
    else:
        box, logits = layout
        parts = f"boxes {output_names[box]} {output_shapes[box]}, logits {output_names[logits]} {output_shapes[logits]}"
    named = f"{len(labels)} labels" if labels else "no labels"
    reading = f"detr: {parts}; boxes {cfg.box_format}; activation {cfg.activation}; {named}"
    return with_reading(Detr(cfg, labels, output_names, layout, input_size), reading)
