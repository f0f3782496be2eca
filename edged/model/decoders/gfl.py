"""`gfl` postprocessing: anchor-free heads with a Distribution Focal Loss box branch (GFL, PicoDet,
NanoDet), decoded as PaddleDetection's PicoDet post-processing does.

Per level (stride s, a grid of ceil(H/s) x ceil(W/s) cells, row-major) the head gives class scores
[N, classes] and a box distribution [N, 4 x (reg_max + 1)]: for each side (left, top, right, bottom)
a softmax over reg_max + 1 bins whose expectation, times s, is the distance from the cell centre
((col + offset) x s, (row + offset) x s) to that side.

The model's outputs are either one scores and one distribution output per level (PicoDet exports without
NMS: eight outputs for strides 8, 16, 32, 64; scores first, or told apart by width), or a single
[1, N, classes + 4 x (reg_max + 1)] output (NanoDet); `outputs` names the ones to read when the model has
others too. [1, C, N] layouts are transposed. Scores that are
not probabilities get a sigmoid. Then the shared finish: threshold, NMS per class, mapping to the frame.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field

from edged.core.errors import ModelError
from edged.model.detections import Array, BoxOptions, Candidates, Finisher, input_size_of, probabilities
from edged.model.postprocess import POSTPROCESSORS, Postprocessor, load_labels, with_reading
from edged.model.preprocess import Geometry

CANDIDATE_STRIDES = (4, 8, 16, 32, 64, 128)


class GflConfig(BoxOptions):
    """Distribution-focal-loss heads (PicoDet, NanoDet, GFL); see edged/model/decoders/gfl.py."""

    type: Literal["gfl"] = Field(description="Postprocessor type key.")
    score_threshold: float = Field(0.4, ge=0, le=1, description="Detections scoring less are dropped.")
    iou_threshold: float = Field(0.5, gt=0, le=1, description="NMS: overlap above which the weaker box goes.")
    strides: list[int] | None = Field(
        None, description="Stride of each level, finest first (default: found from each level's cell count)."
    )
    reg_max: int | None = Field(
        None, ge=1, description="Distribution bins minus one per side (default: from the outputs; 7 for one output)."
    )
    center_offset: float = Field(
        0.5, ge=0, le=1, description="Cell centre within its cell: 0.5 (PicoDet, GFL) or 0 (NanoDet-Plus)."
    )
    outputs: list[str] | None = Field(
        None,
        description="The outputs to read, by name (the per-level scores and distributions, or the one NanoDet "
        "output); default: every output of the model.",
    )


def _rows(shape: list[Any]) -> tuple[Any, Any]:
    """(cells, channels) of a [1, N, C] or [1, C, N] level output (the longer axis is the cells)."""
    a, b = shape[-2], shape[-1]
    if isinstance(a, int) and isinstance(b, int) and a < b:
        return b, a
    return a, b


def level_strides(cells: list[int], input_size: tuple[int, int], given: list[int] | None) -> list[int]:
    """The stride of each level: the one whose grid on the input has the level's cell count."""
    w, h = input_size
    if given is not None:
        if len(given) != len(cells):
            raise ModelError(f"gfl: {len(given)} strides given for {len(cells)} levels")
        return given
    out = []
    for n in cells:
        found = [s for s in CANDIDATE_STRIDES if math.ceil(w / s) * math.ceil(h / s) == n]
        if not found:
            raise ModelError(
                f"gfl: a level of {n} cells is no grid on a {w}x{h} input (strides {list(CANDIDATE_STRIDES)}); "
                "check preprocess.size, or set postprocess.strides"
            )
        out.append(found[0])
    return out


def _grid(stride: int, input_size: tuple[int, int], offset: float) -> Array:
    w, h = input_size
    gw, gh = math.ceil(w / stride), math.ceil(h / stride)
    xs, ys = np.meshgrid(np.arange(gw), np.arange(gh))
    centres = np.stack([xs.reshape(-1), ys.reshape(-1)], axis=1).astype(np.float32)
    return (centres + offset) * stride


class Gfl:
    """Levels of (scores, distributions) -> candidates -> the shared finish."""

    def __init__(
        self,
        cfg: GflConfig,
        labels: list[str] | None,
        pairs: list[tuple[int, int]],
        *,
        strides: list[int],
        reg_max: int,
        input_size: tuple[int, int],
    ) -> None:
        self.cfg = cfg
        self.select: list[int] | None = None  # the outputs it reads (`outputs`), None: all of them
        self.pairs = pairs  # per level: (scores output, distribution output); the same index for one output
        self.classes = len(labels) if labels else None
        self.input_size = input_size
        self.finish = Finisher(cfg, labels, input_size)
        self._levels_of(strides, reg_max)

    def _levels_of(self, strides: list[int], reg_max: int) -> None:
        self.reg_max = reg_max
        self.strides = strides
        self.centres = [_grid(s, self.input_size, self.cfg.center_offset) for s in strides]

    def __call__(self, outputs: list[npt.NDArray[Any]], geometry: Geometry | None = None) -> dict[str, Any]:
        """Decode every level, then threshold, NMS, map."""
        return self.finish(self.decode(outputs), geometry)

    def _levels(self, outputs: list[npt.NDArray[Any]]) -> list[tuple[Array, Array]]:
        if self.select is not None:
            outputs = [outputs[i] for i in self.select]
        if len(self.pairs) == 1 and self.pairs[0][0] == self.pairs[0][1]:
            a = _cells_first(np.asarray(outputs[0], dtype=np.float32))
            if not self.strides:  # a dynamic shape: the levels are known from the first real output
                self._levels_of(*_single_output_levels(self.cfg, [1, *a.shape], self.classes, self.input_size))
            bins = 4 * (self.reg_max + 1)
            scores, dists = a[:, : a.shape[1] - bins], a[:, a.shape[1] - bins :]
            sizes = [c.shape[0] for c in self.centres]
            bounds = np.cumsum([0, *sizes])
            return [(scores[bounds[i] : bounds[i + 1]], dists[bounds[i] : bounds[i + 1]]) for i in range(len(sizes))]
        return [
            (_cells_first(np.asarray(outputs[s], dtype=np.float32)), _cells_first(np.asarray(outputs[d], np.float32)))
            for s, d in self.pairs
        ]

    def decode(self, outputs: list[npt.NDArray[Any]]) -> Candidates:
        """Candidates in model-input pixels."""
        boxes, scores, classes = [], [], []
        bins = np.arange(self.reg_max + 1, dtype=np.float32)
        for (raw, dist), centre, stride in zip(self._levels(outputs), self.centres, self.strides, strict=True):
            score = probabilities(raw)
            # every (cell, class) above the threshold, as PicoDet's multiclass NMS takes them
            cell, cls = np.nonzero(score >= self.cfg.score_threshold)
            if not cell.size:
                continue
            d = dist[cell].reshape(-1, 4, self.reg_max + 1)
            d = np.exp(d - d.max(axis=2, keepdims=True))
            distance = (d / d.sum(axis=2, keepdims=True)) @ bins * stride  # [n, 4]: left, top, right, bottom
            c = centre[cell]
            boxes.append(np.concatenate([c - distance[:, :2], c + distance[:, 2:]], axis=1))
            scores.append(score[cell, cls])
            classes.append(cls)
        if not boxes:
            return Candidates.empty()
        return Candidates(
            np.concatenate(boxes).astype(np.float32),
            np.concatenate(scores).astype(np.float32),
            np.concatenate(classes).astype(np.int64),
        )


def _cells_first(a: Array) -> Array:
    a = a.reshape(a.shape[-2], a.shape[-1])
    return np.ascontiguousarray(a.T) if a.shape[0] < a.shape[1] else a


def _pair_levels(
    names: list[str], shapes: list[list[Any]], classes: int | None
) -> tuple[list[tuple[int, int]], list[int], int]:
    """Per level (scores output, distribution output), each level's cell count, and reg_max."""
    dims = [_rows(s) for s in shapes]
    if any(len(s) != 3 or not all(isinstance(d, int) for d in dim) for s, dim in zip(shapes, dims, strict=True)):
        raise ModelError(f"gfl needs [1, N, C] outputs with fixed sizes; the model has {_described(names, shapes)}")
    half = len(shapes) // 2
    if len(shapes) % 2 or half == 0:
        raise ModelError(
            f"gfl needs a scores and a distribution output per level; the model has {_described(names, shapes)}"
        )
    widths = [int(c) for _, c in dims]
    score_idx = [i for i in range(len(shapes)) if widths[i] == classes] if classes else list(range(half))
    dist_idx = [i for i in range(len(shapes)) if i not in score_idx]
    if len(score_idx) != half or any(widths[i] % 4 for i in dist_idx):
        raise ModelError(
            f"gfl: cannot tell the scores from the box distributions ({classes or 'unknown'} classes) in "
            f"{_described(names, shapes)}; set postprocess.labels"
        )
    by_cells = {int(dims[i][0]): i for i in dist_idx}
    pairs = []
    for s in sorted(score_idx, key=lambda i: -int(dims[i][0])):
        d = by_cells.get(int(dims[s][0]))
        if d is None:
            raise ModelError(f"gfl: scores output {names[s]} has no distribution output of the same cell count")
        pairs.append((s, d))
    return pairs, [int(dims[s][0]) for s, _ in pairs], widths[pairs[0][1]] // 4 - 1


def _described(names: list[str], shapes: list[list[Any]]) -> str:
    return ", ".join(f"{n} {s}" for n, s in zip(names, shapes, strict=True))


def _single_output_levels(
    cfg: GflConfig, shape: list[Any], classes: int | None, input_size: tuple[int, int]
) -> tuple[list[int], int]:
    """A NanoDet-style single output: (strides, reg_max)."""
    cells, width = _rows(shape)
    reg_max = cfg.reg_max if cfg.reg_max is not None else (int(width) - classes) // 4 - 1 if classes else 7
    if classes is not None and int(width) != classes + 4 * (reg_max + 1):
        raise ModelError(f"gfl: an output {shape} is not {classes} classes + 4 x {reg_max + 1} distribution bins")
    strides = cfg.strides or [8, 16, 32, 64]
    w, h = input_size
    if sum(math.ceil(w / s) * math.ceil(h / s) for s in strides) != cells:
        raise ModelError(
            f"gfl: {cells} cells are not the grids of strides {strides} on a {w}x{h} input; set postprocess.strides"
        )
    return strides, reg_max


@POSTPROCESSORS.register("gfl", GflConfig)
def make_gfl(
    cfg: GflConfig,
    output_names: list[str],
    output_shapes: list[list[Any]],
    metadata: dict[str, str],
    input_size: tuple[int, int] | None,
) -> Postprocessor:
    """Build the GFL decoder; refuse outputs that are not per-level scores and distributions."""
    input_size = input_size_of("gfl", input_size)
    labels = load_labels(cfg.labels, metadata)
    select = _selected(cfg.outputs, output_names, output_shapes)
    if select is not None:
        output_names = [output_names[i] for i in select]
        output_shapes = [output_shapes[i] for i in select]
    gfl = _make(cfg, labels, output_names, output_shapes, input_size)
    gfl.select = select
    if len(gfl.pairs) == 1 and gfl.pairs[0][0] == gfl.pairs[0][1]:
        parts = f"one output {output_names[0]} {output_shapes[0]} (scores, then 4 x {gfl.reg_max + 1} bins)"
    else:
        parts = ", ".join(f"{output_names[s]} + {output_names[d]}" for s, d in gfl.pairs)
        parts = f"{len(gfl.pairs)} levels (scores + distribution): {parts}"
    strides = ", ".join(map(str, gfl.strides)) or "from the first frame"
    return with_reading(gfl, f"gfl: {parts}; strides {strides}")


def _selected(wanted: list[str] | None, names: list[str], shapes: list[list[Any]]) -> list[int] | None:
    if wanted is None:
        return None
    missing = [n for n in wanted if n not in names]
    if missing or not wanted:
        raise ModelError(f"postprocess.outputs: {missing or 'none'} not among the outputs {_described(names, shapes)}")
    return [names.index(n) for n in wanted]


def _make(
    cfg: GflConfig,
    labels: list[str] | None,
    output_names: list[str],
    output_shapes: list[list[Any]],
    input_size: tuple[int, int],
) -> Gfl:
    classes = len(labels) if labels else None
    if len(output_shapes) == 1:
        if len(output_shapes[0]) != 3:
            raise ModelError(f"gfl needs [1, N, C] outputs; the model has {_described(output_names, output_shapes)}")
        strides: list[int] = []
        reg_max = cfg.reg_max or 7  # known at the first output when the model's shape is dynamic
        if all(isinstance(d, int) for d in output_shapes[0][1:]):
            strides, reg_max = _single_output_levels(cfg, output_shapes[0], classes, input_size)
        return Gfl(cfg, labels, [(0, 0)], strides=strides, reg_max=reg_max, input_size=input_size)
    pairs, cells, reg_max = _pair_levels(output_names, output_shapes, classes)
    if cfg.reg_max is not None and cfg.reg_max != reg_max:
        raise ModelError(f"gfl: postprocess.reg_max {cfg.reg_max} does not fit distributions of {4 * (reg_max + 1)}")
    strides = level_strides(cells, input_size, cfg.strides)
    return Gfl(cfg, labels, pairs, strides=strides, reg_max=reg_max, input_size=input_size)
