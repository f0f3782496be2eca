"""`segment` postprocessing: semantic segmentation maps -> per-class area, box and (optionally) polygons.

The output it reads: the one `output` names, else the only map among the model's outputs; a model with several
maps (U²-Net's side outputs, a detector's heads) is refused until `output` names one (U²-Net: its fused map,
the first). The layout is read from the declared shape, and again from the first real output whose axes the
model left dynamic (`[N, H, W, 2]` with H and W dynamic looks channels-first on paper). Maps it reads:

- `[1, C, H, W]` class scores or logits (DeepLab, SegFormer, PP-LiteSeg, BiSeNet exports), or channels-last
  `[1, H, W, C]` (TensorFlow exports: the last axis is the smallest), decoded by argmax over the classes;
- `[1, 1, H, W]` or `[1, H, W]` float: one class's probability (salient-object and matting models such as
  U²-Net, person/background masks), thresholded at `threshold` after a sigmoid when the values are logits,
  or after stretching each map to 0..1 with `normalize: minmax` (what U²-Net's own code does);
- `[1, H, W]` integers: a class map the graph has already argmaxed.

The map is cut to where the frame landed in the model input (no letterbox padding), and each class is
published with its share of the frame, its bounding box in frame pixels and, with `polygons: true`, the
outlines of its largest regions (frame pixels, simplified). Labels come as for the other decoders; a
class labelled `background` (or `__background__`) is not reported, nor a one-class map's off pixels.

Result: {"segments": [{"label", "class", "area", "box", "polygons"?}, ...] (largest first),
         "frame": {"w", "h"}}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import cv2
import numpy as np
import numpy.typing as npt
from pydantic import Field

from edged.core.errors import ModelError
from edged.core.settings import Strict
from edged.model.detections import input_size_of, probabilities
from edged.model.postprocess import (
    POSTPROCESSORS,
    SEGMENTS,
    Labels,
    Postprocessor,
    labels_field,
    load_labels,
    output_field,
    pick_output,
)
from edged.model.preprocess import Geometry

__all__ = ["Segment", "SegmentConfig", "make_segment"]

ClassMap = npt.NDArray[np.int64]
BACKGROUND = {"background", "__background__"}


class SegmentConfig(Strict):
    """Semantic segmentation; see edged/model/decoders/segment.py."""

    PRODUCES: ClassVar[str] = SEGMENTS  # not boxes to track or crop

    type: Literal["segment"] = Field(description="Postprocessor type key.")
    labels: Labels = labels_field()
    output: str | None = output_field()
    threshold: float = Field(
        0.5, gt=0, lt=1, description="One-class maps: the probability at which a pixel belongs to the class."
    )
    normalize: Literal["none", "minmax"] = Field(
        "none", description="One-class maps: minmax stretches each map to 0..1 first (U²-Net's own decode)."
    )
    min_area: float = Field(
        0.001, ge=0, le=1, description="Classes covering less of the frame than this share are not reported."
    )
    classes: list[str | int] | None = Field(
        None, description="Report only these classes (labels or indices); default every class but background."
    )
    polygons: bool = Field(False, description="Publish each class's largest regions as polygons (frame pixels).")
    max_polygons: int = Field(10, ge=1, le=1000, description="Polygons per class at most, largest first.")
    simplify: float = Field(
        0.005, ge=0, le=0.1, description="Polygon simplification: the tolerance as a share of each outline's length."
    )


def channels_last(shape: list[Any], input_size: tuple[int, int]) -> bool:
    """Whether an output of `shape` is a map, and a channels-last one ([1, H, W, C]: its last axis the
    smallest); ModelError when it is not a map: a rank other than 3 or 4, or spatial axes that are not the
    input's picture at some scale (a spatial axis of 1, or an aspect ratio far from the input's, such as a
    detector's [1, N, C] head)."""
    dims = [d if isinstance(d, int) else None for d in shape]
    if len(dims) not in (3, 4):
        raise ModelError(f"segment needs a map [1, C, H, W], [1, H, W, C] or [1, H, W]; the output is {shape}")
    last = len(dims) == 4 and dims[3] is not None and dims[1] is not None and dims[3] < dims[1]
    last = last and (dims[2] is None or (dims[3] or 0) < dims[2])
    h, w = (dims[1], dims[2]) if len(dims) == 3 or last else (dims[2], dims[3])
    if h is not None and w is not None:
        ratio = (h / max(w, 1)) / (input_size[1] / input_size[0])
        if min(h, w) < 2 or not 1 / 1.5 <= ratio <= 1.5:
            raise ModelError(
                f"segment needs a map shaped like the {input_size[0]}x{input_size[1]} input at some scale; the "
                f"output is {shape}"
            )
    return last


class Segment:
    """Model outputs (+ the frame's geometry) -> {"segments": [...], "frame": {"w", "h"}}."""

    def __init__(
        self, cfg: SegmentConfig, labels: list[str] | None, last: bool, input_size: tuple[int, int], index: int = 0
    ) -> None:
        self.cfg = cfg
        self.index = index  # the output it reads
        self.channels_last = last
        self.input_size = input_size
        self.labels = labels
        self._wanted = {str(c) for c in cfg.classes} if cfg.classes is not None else None
        self._checked: tuple[int, ...] | None = None
        self.source = ""  # which output, for `reading`

    @property
    def reading(self) -> str:
        """What it reads (check-config shows it after its synthetic frame: the layout the real shape showed)."""
        layout = "[1, H, W, C]" if self.channels_last else "[1, C, H, W]"
        shown = f" (this frame: {list(self._checked)})" if self._checked is not None else ""
        named = f"{len(self.labels)} labels" if self.labels else "no labels"
        return f"segment: map {self.source}{shown} read as {layout}; {named}"

    def label(self, index: int, *, one_class: bool = False) -> str:
        """A class index's label (the index itself past the labels). A one-class map's class is index 1
        (its label the first label that is not background, else `foreground`); 0 is its complement."""
        if one_class:
            named = [x for x in self.labels or [] if x.lower() not in BACKGROUND]  # [background, X] names X too
            return (named[0] if named else "foreground") if index == 1 else "background"
        if self.labels is None:
            return str(index)
        if not 0 <= index < len(self.labels):  # a bare number is no label: refused, never published
            raise ModelError(f"class {index} of the map is beyond the {len(self.labels)} labels")
        return self.labels[index]

    def class_map(self, outputs: list[npt.NDArray[Any]]) -> tuple[ClassMap, bool]:
        """(the per-pixel class of the model's map [h, w] at its own resolution, whether it is a one-class
        map: 1 where the probability passes `threshold`, else 0)."""
        out = np.asarray(outputs[self.index])
        if self._checked != out.shape:  # the axes the model left dynamic, once their sizes are known: the layout
            self.channels_last = channels_last(list(out.shape), self.input_size)  # is read again from them
            self._checked = out.shape
        out = out[0] if out.ndim in (3, 4) else out
        if out.ndim == 2 and np.issubdtype(out.dtype, np.integer):
            return out.astype(np.int64), False
        planes = out[None] if out.ndim == 2 else np.moveaxis(out, -1, 0) if self.channels_last else out
        if planes.shape[0] == 1:
            return (self._probability(planes[0]) > self.cfg.threshold).astype(np.int64), True
        return np.asarray(np.argmax(planes, axis=0), dtype=np.int64), False

    def _probability(self, plane: npt.NDArray[Any]) -> npt.NDArray[np.float32]:
        p = np.asarray(plane, dtype=np.float32)
        if self.cfg.normalize == "minmax":
            lo, hi = float(p.min()), float(p.max())
            return (p - lo) / (hi - lo) if hi > lo else np.zeros_like(p)
        return probabilities(p)

    def __call__(self, outputs: list[npt.NDArray[Any]], geometry: Geometry | None = None) -> dict[str, Any]:
        """Classes present in the frame, largest first."""
        cmap, one_class = self.class_map(outputs)
        mh, mw = cmap.shape
        fx, fy = self.input_size[0] / mw, self.input_size[1] / mh  # map pixel -> model-input pixel
        if geometry is None:
            frame_w, frame_h, x0, y0, x1, y1 = self.input_size[0], self.input_size[1], 0, 0, mw, mh
        else:
            frame_w, frame_h = geometry.width, geometry.height
            x0, y0 = round(geometry.pad_x / fx), round(geometry.pad_y / fy)
            x1 = round((geometry.pad_x + geometry.width * geometry.scale_x) / fx)
            y1 = round((geometry.pad_y + geometry.height * geometry.scale_y) / fy)
        crop = cmap[max(y0, 0) : max(y1, y0 + 1), max(x0, 0) : max(x1, x0 + 1)]
        counts = np.bincount(np.clip(crop.ravel(), 0, None), minlength=1)
        segments = []
        for index in np.argsort(-counts, kind="stable"):
            share = float(counts[index]) / max(crop.size, 1)
            if share < max(self.cfg.min_area, 1e-12) or not self._reported(int(index), one_class=one_class):
                continue
            mask = (crop == index).astype(np.uint8)
            to_frame = _MapToFrame(geometry, fx, fy, max(x0, 0), max(y0, 0))
            seg: dict[str, Any] = {
                "label": self.label(int(index), one_class=one_class),
                "class": int(index),
                "area": round(share, 5),
                "box": to_frame.box(mask),
            }
            if self.cfg.polygons:
                seg["polygons"] = self._polygons(mask, to_frame)
            segments.append(seg)
        return {"segments": segments, "frame": {"w": frame_w, "h": frame_h}}

    def _reported(self, index: int, *, one_class: bool) -> bool:
        if one_class and index == 0:
            return False
        label = self.label(index, one_class=one_class)
        if self._wanted is not None:
            return label in self._wanted or str(index) in self._wanted
        return one_class or label.lower() not in BACKGROUND

    def _polygons(self, mask: npt.NDArray[np.uint8], to_frame: _MapToFrame) -> list[list[list[float]]]:
        contours, _ = cv2.findContours(mask, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
        largest = sorted(contours, key=cv2.contourArea, reverse=True)[: self.cfg.max_polygons]
        out = []
        for contour in largest:
            simple = cv2.approxPolyDP(contour, self.cfg.simplify * cv2.arcLength(contour, closed=True), closed=True)
            if len(simple) >= 3:
                out.append(to_frame.points(simple.reshape(-1, 2).astype(np.float32) + 0.5))  # pixel centres
        return out


@dataclass(frozen=True)
class _MapToFrame:
    """Map pixels of the cropped map -> frame pixels (through the model input and the frame's geometry)."""

    geometry: Geometry | None
    fx: float
    fy: float
    x0: int
    y0: int

    def points(self, xy: npt.NDArray[np.float32]) -> list[list[float]]:
        """[N, 2] positions in the cropped map (0 = its left / top edge) -> [[x, y], ...] in frame pixels, rounded
        to 0.1."""
        inp = np.stack([(xy[:, 0] + self.x0) * self.fx, (xy[:, 1] + self.y0) * self.fy], axis=1).astype(np.float32)
        frame = self.geometry.points_to_source(inp) if self.geometry is not None else inp
        return [[round(float(x), 1), round(float(y), 1)] for x, y in frame]

    def box(self, mask: npt.NDArray[np.uint8]) -> list[float]:
        """The bounding box of the mask's pixels (their outer edges) in frame pixels."""
        cols, rows = np.flatnonzero(mask.any(axis=0)), np.flatnonzero(mask.any(axis=1))
        corners = np.asarray([[cols[0], rows[0]], [cols[-1] + 1, rows[-1] + 1]], dtype=np.float32)
        (x1, y1), (x2, y2) = self.points(corners)
        return [x1, y1, x2, y2]


@POSTPROCESSORS.register("segment", SegmentConfig)
def make_segment(
    cfg: SegmentConfig,
    output_names: list[str],
    output_shapes: list[list[Any]],
    metadata: dict[str, str],
    input_size: tuple[int, int] | None,
) -> Postprocessor:
    """Build the decoder; its output must be a map (see the module's docstring)."""
    input_size = input_size_of("segment", input_size)
    if not output_shapes:
        raise ModelError("segment needs a map output; the model has none")

    def is_map(shape: list[Any]) -> bool:
        try:
            channels_last(shape, input_size)
        except ModelError:
            return False
        return True

    index = pick_output("segment", cfg.output, output_names, output_shapes, is_map)
    try:
        last = channels_last(output_shapes[index], input_size)
    except ModelError as exc:
        described = ", ".join(f"{n} {s}" for n, s in zip(output_names, output_shapes, strict=True))
        raise ModelError(f"{exc} ({described})") from None
    labels = load_labels(cfg.labels, metadata)
    shape = output_shapes[index]
    classes = (shape[3] if last else shape[1]) if len(shape) == 4 else None
    if labels is not None and isinstance(classes, int) and classes > 1 and len(labels) < classes:
        raise ModelError(f"{len(labels)} labels for a map of {classes} classes; fix postprocess.labels or the model")
    segment = Segment(cfg, labels, last, input_size, index)
    segment.source = f"{output_names[index]} {shape}"
    return segment
