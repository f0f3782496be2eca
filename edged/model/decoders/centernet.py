"""`centernet` postprocessing: heatmap detectors (CenterNet "objects as points", CenterFace faces with
five landmarks), decoded as the families' own code does.

Outputs, all [1, C, h, w] on one grid (stride = input size / grid size, e.g. 4):

- heatmap [1, classes, h, w]: a centre's score per class (probabilities; logits get a sigmoid);
- size [1, 2, h, w]: the box size at each centre;
- offset [1, 2, h, w]: the centre's sub-cell offset;
- landmarks [1, 2K, h, w] (optional): K points per box, published as `keypoints`.

`variant` picks the encoding: `centerface` (sizes log-encoded, exp(s) x stride; channel order y, x;
landmarks relative to the box corner, scaled by its size) or `centernet` (sizes in grid cells, channel
order x, y; no landmarks). Outputs are found by name (heat/hm, scale/size/wh, offset/reg, landmark/lm/kps)
or else by channel count in export order; `outputs` names them when neither works.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field

from edged.core.errors import ModelError
from edged.core.settings import Strict
from edged.model.detections import BoxOptions, Candidates, Finisher, input_size_of, probabilities
from edged.model.postprocess import POSTPROCESSORS, Postprocessor, load_labels, with_reading
from edged.model.preprocess import Geometry

ROLES = ("heatmap", "size", "offset", "landmarks")
NAME_HINTS = {
    "heatmap": ("heat", "hm"),
    "size": ("scale", "size", "wh"),
    "offset": ("offset", "off", "reg"),
    "landmarks": ("landmark", "lm", "kps", "keypoint"),
}


class CenterNetOutputs(Strict):
    """Which output is which, by name (when the automatic match is wrong)."""

    heatmap: str | None = Field(None, description="The heatmap output's name.")
    size: str | None = Field(None, description="The box size output's name.")
    offset: str | None = Field(None, description="The centre offset output's name.")
    landmarks: str | None = Field(None, description="The landmarks output's name (optional).")


class CenterNetConfig(BoxOptions):
    """Heatmap detectors (CenterNet, CenterFace); see edged/model/decoders/centernet.py."""

    type: Literal["centernet"] = Field(description="Postprocessor type key.")
    variant: Literal["centerface", "centernet"] = Field(
        "centerface",
        description="centerface: log-encoded sizes (exp(s) x stride), y/x channel order, landmarks relative to "
        "the box; centernet: sizes in grid cells, x/y channel order, no landmarks.",
    )
    score_threshold: float = Field(0.5, ge=0, le=1, description="Centres scoring less are dropped.")
    iou_threshold: float = Field(0.3, gt=0, le=1, description="NMS: overlap above which the weaker box goes.")
    outputs: CenterNetOutputs = Field(default_factory=CenterNetOutputs)


def _by_name(names: list[str], wanted: dict[str, str | None]) -> dict[str, int]:
    found: dict[str, int] = {}
    for role in ROLES:
        given = wanted.get(role)
        if given is not None:
            if given not in names:
                raise ModelError(f"centernet: outputs.{role} {given!r} is not an output; outputs: {names}")
            found[role] = names.index(given)
            continue
        hits = [i for i, n in enumerate(names) if any(h in n.lower() for h in NAME_HINTS[role])]
        if len(hits) == 1 and hits[0] not in found.values():
            found[role] = hits[0]
    return found


def assign_outputs(
    names: list[str], shapes: list[list[Any]], classes: int | None, wanted: dict[str, str | None]
) -> dict[str, int]:
    """Role -> output index: by name, else by channel count in export order (heatmap first, then the
    two-channel size and offset, then a landmarks map of 2K channels)."""
    if len(shapes) < 3 or any(len(s) != 4 for s in shapes):
        raise ModelError(
            f"centernet needs three or four [1, C, h, w] outputs (heatmap, size, offset, landmarks); "
            f"the model has {_shapes(names, shapes)}"
        )
    found = _by_name(names, wanted)
    free = [i for i in range(len(shapes)) if i not in found.values()]
    two = [i for i in free if shapes[i][1] == 2]
    if "heatmap" not in found:
        heat = [i for i in free if shapes[i][1] == classes] if classes else [i for i in free if shapes[i][1] != 2]
        if not heat:
            raise ModelError(f"centernet: no heatmap among the outputs {_shapes(names, shapes)}")
        found["heatmap"] = heat[0]
    for role in ("size", "offset"):
        if role not in found:
            rest = [i for i in two if i not in found.values()]
            if not rest:
                raise ModelError(f"centernet: no 2-channel {role} output among {_shapes(names, shapes)}")
            found[role] = rest[0]
    if "landmarks" not in found:
        rest = [i for i in free if i not in found.values() and isinstance(shapes[i][1], int) and shapes[i][1] % 2 == 0]
        if rest:
            found["landmarks"] = rest[0]
    return found


def _shapes(names: list[str], shapes: list[list[Any]]) -> str:
    return ", ".join(f"{n} {s}" for n, s in zip(names, shapes, strict=True))


class CenterNet:
    """Heatmap peaks -> boxes (+ landmarks), then the shared finish."""

    def __init__(
        self, cfg: CenterNetConfig, labels: list[str] | None, roles: dict[str, int], input_size: tuple[int, int]
    ) -> None:
        self.cfg = cfg
        self.roles = roles
        self.input_size = input_size
        self.finish = Finisher(cfg, labels, input_size)

    def __call__(self, outputs: list[npt.NDArray[Any]], geometry: Geometry | None = None) -> dict[str, Any]:
        """Decode the centres above the threshold, NMS, map to the frame."""
        return self.finish(self.decode(outputs), geometry)

    def decode(self, outputs: list[npt.NDArray[Any]]) -> Candidates:
        """Candidates in model-input pixels."""
        heat = probabilities(np.asarray(outputs[self.roles["heatmap"]], dtype=np.float32)[0])
        size = np.asarray(outputs[self.roles["size"]], dtype=np.float32)[0]
        offset = np.asarray(outputs[self.roles["offset"]], dtype=np.float32)[0]
        cls, ys, xs = np.nonzero(heat >= self.cfg.score_threshold)
        if not cls.size:
            return Candidates.empty()
        stride = self.input_size[0] / heat.shape[2], self.input_size[1] / heat.shape[1]
        if self.cfg.variant == "centerface":  # (y, x) channels, log sizes scaled by the stride
            h = np.exp(np.minimum(size[0, ys, xs], 20.0)) * stride[1]
            w = np.exp(np.minimum(size[1, ys, xs], 20.0)) * stride[0]
            cx = (xs + offset[1, ys, xs] + 0.5) * stride[0]
            cy = (ys + offset[0, ys, xs] + 0.5) * stride[1]
        else:  # (x, y) channels, sizes in grid cells
            w, h = size[0, ys, xs] * stride[0], size[1, ys, xs] * stride[1]
            cx = (xs + offset[0, ys, xs]) * stride[0]
            cy = (ys + offset[1, ys, xs]) * stride[1]
        x1, y1 = cx - w / 2, cy - h / 2
        boxes = np.stack([x1, y1, x1 + w, y1 + h], axis=1).astype(np.float32)
        cands = Candidates(boxes, heat[cls, ys, xs].astype(np.float32), cls.astype(np.int64))
        if "landmarks" in self.roles and self.cfg.variant == "centerface":
            lm = np.asarray(outputs[self.roles["landmarks"]], dtype=np.float32)[0][:, ys, xs]  # [2K, n]
            px = lm[1::2].T * w[:, None] + x1[:, None]
            py = lm[0::2].T * h[:, None] + y1[:, None]
            cands.points["keypoints"] = np.stack([px, py], axis=2).astype(np.float32)
        return cands


def _check_grid(names: list[str], shapes: list[list[Any]], roles: dict[str, int]) -> None:
    grids = {tuple(shapes[i][2:]) for i in roles.values()}
    if len(grids) > 1 and all(isinstance(d, int) for g in grids for d in g):
        raise ModelError(f"centernet: the outputs are not on one grid: {_shapes(names, shapes)}")


@POSTPROCESSORS.register("centernet", CenterNetConfig)
def make_centernet(
    cfg: CenterNetConfig,
    output_names: list[str],
    output_shapes: list[list[Any]],
    metadata: dict[str, str],
    input_size: tuple[int, int] | None,
) -> Postprocessor:
    """Build the heatmap decoder; refuse a model whose outputs are not a heatmap and its regression maps."""
    input_size = input_size_of("centernet", input_size)
    labels = load_labels(cfg.labels, metadata)
    roles = assign_outputs(output_names, output_shapes, len(labels) if labels else None, cfg.outputs.model_dump())
    _check_grid(output_names, output_shapes, roles)
    parts = ", ".join(f"{role} {output_names[i]} {output_shapes[i]}" for role, i in roles.items())
    reading = f"centernet {cfg.variant}: {parts}"
    return with_reading(CenterNet(cfg, labels, roles, input_size), reading)
