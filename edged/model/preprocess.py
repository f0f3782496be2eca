"""Frame (BGR uint8, as OpenCV gives it) -> model input tensor, from config or the model's metadata."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt
from pydantic import ValidationError

from edged.core.errors import ModelError
from edged.model.metadata import metadata_json
from edged.model.settings import PreprocessConfig

METADATA_KEY = "edged.preprocess"
DTYPES: dict[str, type[np.generic]] = {
    "float32": np.float32,
    "float16": np.float16,
    "uint8": np.uint8,
    "int8": np.int8,
}
INTERPOLATION = {
    "nearest": cv2.INTER_NEAREST,
    "linear": cv2.INTER_LINEAR,
    "area": cv2.INTER_AREA,
    "cubic": cv2.INTER_CUBIC,
}
ORT_TYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(uint8)": "uint8",
    "tensor(int8)": "int8",
}


@dataclass(frozen=True)
class PreprocessSpec:
    """A fully resolved preprocessing recipe."""

    size: tuple[int, int]  # width, height
    resize: str = "stretch"
    # OpenCV's own default (cv2.resize, dnn.blobFromImage), which most training pipelines used; "area"
    # is the better downscaler and ~4x dearer per frame, so a model trained with it says so in metadata
    interpolation: str = "linear"
    color: str = "rgb"
    layout: str = "nchw"
    dtype: str = "float32"
    scale: float = 1.0 / 255.0
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    pad_value: int = 114
    anchor: str = "center"  # where a letterboxed frame sits: centre (padding on both sides) or top_left

    @property
    def channels(self) -> int:
        """Channels the model sees."""
        return 1 if self.color == "gray" else 3

    @property
    def tensor_shape(self) -> tuple[int, int, int, int]:
        """Shape of the batch-of-one tensor produced."""
        w, h = self.size
        return (1, self.channels, h, w) if self.layout == "nchw" else (1, h, w, self.channels)

    def to_metadata(self) -> str:
        """JSON to store under the model's `edged.preprocess` metadata key."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["size"] = list(self.size)
        data["mean"] = list(self.mean)
        data["std"] = list(self.std)
        return json.dumps(data, sort_keys=True)

    @classmethod
    def resolve(
        cls,
        config: PreprocessConfig | None,
        metadata: dict[str, str],
        input_shape: list[Any],
        input_type: str,
    ) -> PreprocessSpec:
        """Merge: defaults < inferred from the model input < model metadata < config."""
        values: dict[str, Any] = _infer_from_input(input_shape, input_type)
        raw = metadata.get(METADATA_KEY)
        if raw:
            values.update(_checked_metadata(metadata_json(raw, METADATA_KEY, dict)))
        if config is not None:
            values.update({k: v for k, v in config.model_dump().items() if v is not None})
        if "size" not in values:
            raise ModelError("cannot tell the model's input size (dynamic shape, no metadata): set preprocess.size")
        values["size"] = (int(values["size"][0]), int(values["size"][1]))
        values["mean"] = tuple(float(x) for x in values.get("mean", (0.0,)))
        values["std"] = tuple(float(x) for x in values.get("std", (1.0,)))
        spec = cls(**values)
        spec.check_against(input_shape, input_type)
        return spec

    def check_against(self, input_shape: list[Any], input_type: str) -> None:
        """Raise ModelError when the tensor this spec produces does not fit the model input."""
        want = self.tensor_shape
        if input_shape and isinstance(input_shape[0], int) and input_shape[0] > 1:
            raise ModelError(
                f"model input is fixed at batch {input_shape[0]} ({input_shape}): a placeholder size from its "
                "export, while edged runs one frame at a time; re-export it with batch 1 or a dynamic batch "
                "(and the input size you run, or dynamic height and width)"
            )
        if len(input_shape) != 4:
            raise ModelError(f"model input has rank {len(input_shape)} {input_shape}; edged feeds images as rank 4")
        for got, expected in zip(input_shape, want, strict=True):
            if isinstance(got, int) and got > 0 and got != expected:
                raise ModelError(
                    f"model input shape is {input_shape} but preprocessing produces {list(want)} "
                    f"(size={list(self.size)}, layout={self.layout}, color={self.color}); "
                    "fix preprocess.size / layout / color in the config"
                )
        expected_type = ORT_TYPES.get(input_type)
        if expected_type is not None and expected_type != self.dtype:
            raise ModelError(f"model input type is {input_type} but preprocess.dtype is {self.dtype}")
        for name in ("mean", "std"):
            n = len(getattr(self, name))
            if n not in (1, self.channels):
                raise ModelError(f"preprocess.{name} has {n} values; give 1 or {self.channels}")


def _checked_metadata(meta: dict[str, Any]) -> dict[str, Any]:
    """The model's own preprocessing, held to the same rules as the config (unknown keys ignored)."""
    known = {k: v for k, v in meta.items() if k in PreprocessConfig.model_fields and v is not None}
    for key in ("mean", "std"):
        if isinstance(known.get(key), int | float):
            known[key] = [known[key]]  # one number for every channel
    try:
        checked = PreprocessConfig.model_validate(known)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ModelError(f"model metadata {METADATA_KEY!r} is invalid ({problems}); override it in preprocess") from exc
    return {k: v for k, v in checked.model_dump().items() if v is not None}


def _infer_from_input(shape: list[Any], input_type: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if input_type in ORT_TYPES:
        out["dtype"] = ORT_TYPES[input_type]
    if len(shape) == 4:
        if shape[1] in (1, 3) and shape[3] not in (1, 3):
            out["layout"] = "nchw"
            h, w = shape[2], shape[3]
            if shape[1] == 1:
                out["color"] = "gray"
        elif shape[3] in (1, 3):
            out["layout"] = "nhwc"
            h, w = shape[1], shape[2]
            if shape[3] == 1:
                out["color"] = "gray"
        else:
            return out
        if isinstance(h, int) and isinstance(w, int) and h > 0 and w > 0:
            out["size"] = (w, h)
    return out


@dataclass(frozen=True)
class Geometry:
    """How a frame of `width` x `height` maps into the model input: input = source * scale + pad.

    A pure function of the frame's size and the spec (`Preprocessor.geometry`), so a worker derives it
    from the frame it holds; nothing is read from state the source thread writes for the next frame.
    """

    width: int
    height: int
    scale_x: float
    scale_y: float
    pad_x: int
    pad_y: int

    def to_source(self, boxes: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """[N, 4] x1, y1, x2, y2 in model-input pixels -> source-frame pixels, clipped to the frame."""
        out = np.empty_like(boxes, dtype=np.float32)
        out[:, 0::2] = (boxes[:, 0::2] - self.pad_x) / self.scale_x
        out[:, 1::2] = (boxes[:, 1::2] - self.pad_y) / self.scale_y
        np.clip(out[:, 0::2], 0.0, float(self.width), out=out[:, 0::2])
        np.clip(out[:, 1::2], 0.0, float(self.height), out=out[:, 1::2])
        return out

    def points_to_source(self, points: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """[..., 2] x, y in model-input pixels -> source-frame pixels, clipped to the frame."""
        out = np.empty_like(points, dtype=np.float32)
        out[..., 0] = np.clip((points[..., 0] - self.pad_x) / self.scale_x, 0.0, float(self.width))
        out[..., 1] = np.clip((points[..., 1] - self.pad_y) / self.scale_y, 0.0, float(self.height))
        return out


class Preprocessor:
    """Callable turning a BGR uint8 frame into a contiguous input tensor."""

    def __init__(self, spec: PreprocessSpec) -> None:
        self.spec = spec
        c = spec.channels
        std = np.resize(np.asarray(spec.std, dtype=np.float32), c)
        mean = np.resize(np.asarray(spec.mean, dtype=np.float32), c)
        # (x * scale - mean) / std == x * mul + add, one fused pass per pixel; shaped to broadcast over
        # a CHW image (per-channel broadcasting over the last axis of HWC is several times slower)
        self._mul = (spec.scale / std).astype(np.float32).reshape(c, 1, 1)
        self._add = (-mean / std).astype(np.float32).reshape(c, 1, 1)
        self._identity = bool(np.all(self._mul == 1.0) and np.all(self._add == 0.0))
        self._dtype = DTYPES[spec.dtype]
        self._interpolation = INTERPOLATION[spec.interpolation]

    def __call__(self, frame: npt.NDArray[np.uint8]) -> npt.NDArray[Any]:
        """Frame (H, W, 3) BGR or (H, W) grey -> tensor of `spec.tensor_shape`."""
        img = self._fit(frame)
        img = self._convert_color(img)
        if img.ndim == 2:
            img = img[:, :, None]
        chw = img.transpose(2, 0, 1)  # a view; uint8 is cheap to move around
        if self._dtype in (np.float32, np.float16):
            out = np.empty((1, *chw.shape), dtype=np.float32)
            if self._identity:
                out[0] = chw
            else:
                np.multiply(chw, self._mul, out=out[0], dtype=np.float32)
                out[0] += self._add
            x: npt.NDArray[Any] = out if self._dtype == np.float32 else out.astype(np.float16)
        elif self._dtype == np.int8:
            x = (chw.astype(np.int16) - 128).astype(np.int8)[None]
        else:
            x = chw[None]
        if self.spec.layout == "nhwc":
            x = x.transpose(0, 2, 3, 1)
        return np.ascontiguousarray(x, dtype=self._dtype)

    def geometry(self, frame_width: int, frame_height: int) -> Geometry:
        """Where a frame of this size lands in the model input (the same arithmetic `_fit` uses)."""
        w, h = self.spec.size
        fw, fh = frame_width, frame_height
        if self.spec.resize == "stretch" or (fw == w and fh == h):
            return Geometry(fw, fh, w / fw, h / fh, 0, 0)
        scale = min(w / fw, h / fh)
        nw, nh = max(1, round(fw * scale)), max(1, round(fh * scale))
        if self.spec.anchor == "top_left":
            return Geometry(fw, fh, nw / fw, nh / fh, 0, 0)
        return Geometry(fw, fh, nw / fw, nh / fh, (w - nw) // 2, (h - nh) // 2)

    def fit(self, frame: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
        """The frame resized (and letterboxed) to the model input, still uint8 BGR: calling the preprocessor
        on it gives the same tensor as on the frame, so a tool can keep many frames at a quarter of their
        float size (quantize's calibration set)."""
        return np.ascontiguousarray(self._fit(frame))

    def _fit(self, frame: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
        w, h = self.spec.size
        fh, fw = frame.shape[:2]
        if self.spec.resize == "stretch" or (fw == w and fh == h):
            if fw == w and fh == h:
                return frame
            return np.asarray(cv2.resize(frame, (w, h), interpolation=self._interpolation), dtype=np.uint8)
        geo = self.geometry(fw, fh)
        scale = min(w / fw, h / fh)
        nw, nh = max(1, round(fw * scale)), max(1, round(fh * scale))
        resized = cv2.resize(frame, (nw, nh), interpolation=self._interpolation)
        px, py = geo.pad_x, geo.pad_y
        pad = self.spec.pad_value
        out = cv2.copyMakeBorder(
            resized,
            py,
            h - nh - py,
            px,
            w - nw - px,
            cv2.BORDER_CONSTANT,
            value=(pad, pad, pad) if resized.ndim == 3 else pad,
        )
        return np.asarray(out, dtype=np.uint8)

    def _convert_color(self, img: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
        color = self.spec.color
        if img.ndim == 3 and img.shape[2] == 1:
            img = img[:, :, 0]
        elif img.ndim == 3 and img.shape[2] == 4:
            img = np.asarray(cv2.cvtColor(img, cv2.COLOR_BGRA2BGR))
        if img.ndim == 2:
            return (
                img
                if color == "gray"
                else np.asarray(cv2.cvtColor(img, cv2.COLOR_GRAY2BGR if color == "bgr" else cv2.COLOR_GRAY2RGB))
            )
        if color == "rgb":
            return np.asarray(cv2.cvtColor(img, cv2.COLOR_BGR2RGB))
        if color == "gray":
            return np.asarray(cv2.cvtColor(img, cv2.COLOR_BGR2GRAY))
        return img
