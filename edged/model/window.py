"""Sensor windows -> model input tensor: window length, hop, channels, normalisation, layout.

The counterpart of `preprocess.py` for sources that deliver samples instead of images. The recipe is
merged like image preprocessing: inferred from the model's input shape < the model's metadata
(`metadata_props` key `edged.window`, a JSON object) < the sensor source's config. It is checked against
the model's input at start-up, with an error that names the key to fix.

`edged.window` keys: `channels` (list of names or column/record indices), `window`, `hop` (samples),
`layout` (`channels_first`: the model sees [1, channels, window]; `channels_last`: [1, window, channels]),
`normalize` (`none`, `fixed`: (x - mean) / std per channel, `window`: z-score per channel of each window),
`mean`, `std` (one value or one per channel). Other keys (e.g. `sample_rate_hz`) are documentation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from edged.core.errors import ModelError
from edged.model.metadata import metadata_json

METADATA_KEY = "edged.window"
LAYOUTS = ("channels_first", "channels_last")
NORMALIZE = ("none", "fixed", "window")
FLOAT_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16"}
EPS = 1e-6
Channel = str | int


@dataclass(frozen=True)
class WindowSpec:
    """A fully resolved windowing recipe."""

    channels: tuple[Channel, ...]
    window: int
    hop: int
    layout: str = "channels_first"
    normalize: str = "none"
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    dtype: str = "float32"
    shape: tuple[int, ...] | None = None  # the model's input shape; None: [1, C, W] or [1, W, C] by layout

    @property
    def tensor_shape(self) -> tuple[int, ...]:
        """Shape of the batch-of-one tensor produced."""
        if self.shape is not None:
            return self.shape
        c, w = len(self.channels), self.window
        return (1, c, w) if self.layout == "channels_first" else (1, w, c)

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> WindowSpec:
        """The recipe from a source config alone (no model): window and channels must be given."""
        return cls.resolve(settings, {}, [], "tensor(float)")

    @classmethod
    def resolve(
        cls, settings: dict[str, Any], metadata: dict[str, str], input_shape: list[Any], input_type: str
    ) -> WindowSpec:
        """Merge: defaults < inferred from the model input < model metadata < config; then check."""
        values: dict[str, Any] = {}
        raw = metadata.get(METADATA_KEY)
        if raw:
            values.update(_checked_metadata(raw))
        values.update({k: v for k, v in settings.items() if v is not None})
        dtype = FLOAT_TYPES.get(input_type)
        if dtype is None:
            raise ModelError(f"model input type is {input_type}; a sensor source feeds float32 or float16 windows")
        channels = tuple(values.get("channels") or ())
        if not channels:
            raise ModelError("the sensor source has no channels: set source.channels (no edged.window in the model)")
        layout = values.get("layout", "channels_first")
        if "window" not in values:
            values["window"] = _window_from_shape(input_shape, layout, len(channels))
        window = int(values["window"])
        spec = cls(
            channels=channels,
            window=window,
            hop=int(values.get("hop") or window),
            layout=layout,
            normalize=values.get("normalize", "none"),
            mean=_floats(values.get("mean", (0.0,))),
            std=_floats(values.get("std", (1.0,))),
            dtype=dtype,
        )
        if input_shape:
            spec = spec.fitted_to(input_shape)
        spec.check_normalisation()
        return spec

    def check_normalisation(self) -> None:
        """Raise ModelError when mean/std do not fit the channels."""
        if self.normalize != "fixed":
            return
        for name in ("mean", "std"):
            n = len(getattr(self, name))
            if n not in (1, len(self.channels)):
                raise ModelError(f"source.{name} has {n} values; give 1 or {len(self.channels)} (one per channel)")
        if any(s <= 0 for s in self.std):
            raise ModelError("source.std must be > 0 for every channel")

    def fitted_to(self, input_shape: list[Any]) -> WindowSpec:
        """This spec with the model's exact input shape; ModelError when the window cannot be reshaped to it."""
        want = self.tensor_shape
        c, w = len(self.channels), self.window
        what = f"[1, {c}, {w}]" if self.layout == "channels_first" else f"[1, {w}, {c}]"
        hint = (
            f"model input shape is {input_shape} but the sensor source produces {what} "
            f"(channels={c}, window={w}, layout={self.layout}); fix source.channels / window / layout"
        )
        dims = [d if isinstance(d, int) and d > 0 else None for d in input_shape]
        if dims and dims[0] not in (None, 1):
            raise ModelError(hint + " (edged feeds a batch of one)")
        if len(dims) == 3:
            for got, expected in zip(dims, want, strict=True):
                if got is not None and got != expected:
                    raise ModelError(hint)
            return self
        rest = dims[1:]
        if len(rest) == 1 and rest[0] is None:  # [1, samples] with the length left open: the window, flat
            return WindowSpec(**{**self.__dict__, "shape": (1, c * w)})
        if not rest or any(d is None for d in rest) or math.prod(d for d in rest if d) != c * w:
            raise ModelError(hint)
        return WindowSpec(**{**self.__dict__, "shape": (1, *(d for d in rest if d))})


def _window_from_shape(input_shape: list[Any], layout: str, channels: int) -> int:
    if len(input_shape) == 3:
        w = input_shape[2] if layout == "channels_first" else input_shape[1]
        if isinstance(w, int) and w > 0:
            return w
    if len(input_shape) == 2 and isinstance(input_shape[1], int) and input_shape[1] % channels == 0:
        return input_shape[1] // channels  # [1, samples]: the channels' samples, one after the other
    if input_shape:
        raise ModelError(f"cannot tell the window length from the model input {input_shape}: set source.window")
    raise ModelError(f"set source.window (samples per window of the {channels} channels)")


def _floats(value: Any) -> tuple[float, ...]:
    if isinstance(value, int | float):
        return (float(value),)
    return tuple(float(v) for v in value)


def _checked_metadata(raw: str) -> dict[str, Any]:
    """The model's own windowing, held to the config's rules (unknown keys ignored)."""
    meta = metadata_json(raw, METADATA_KEY, dict)
    out: dict[str, Any] = {}
    problems: list[str] = []
    for key in ("window", "hop"):
        if key in meta:
            ok = isinstance(meta[key], int) and not isinstance(meta[key], bool) and meta[key] > 0
            problems += [] if ok else [f"{key} must be a positive integer"]
            out[key] = meta[key]
    if "channels" in meta:
        chans = meta["channels"]
        ok = isinstance(chans, list) and bool(chans) and all(isinstance(c, str | int) for c in chans)
        problems += [] if ok else ["channels must be a non-empty list of names or indices"]
        out["channels"] = chans
    for key, allowed in (("layout", LAYOUTS), ("normalize", NORMALIZE)):
        if key in meta:
            problems += [] if meta[key] in allowed else [f"{key} must be one of {list(allowed)}"]
            out[key] = meta[key]
    for key in ("mean", "std"):
        if key in meta:
            vals = meta[key] if isinstance(meta[key], list) else [meta[key]]
            ok = bool(vals) and all(isinstance(v, int | float) and not isinstance(v, bool) for v in vals)
            problems += [] if ok else [f"{key} must be a number or a list of numbers"]
            out[key] = vals
    if problems:
        raise ModelError(f"model metadata {METADATA_KEY!r} is invalid ({'; '.join(problems)}); override it in source")
    return out


class WindowTransform:
    """Callable turning a (window, channels) block of samples into the model's input tensor."""

    def __init__(self, spec: WindowSpec) -> None:
        self.spec = spec
        c = len(spec.channels)
        self._mean = np.resize(np.asarray(spec.mean, dtype=np.float32), c)
        self._inv_std = 1.0 / np.resize(np.asarray(spec.std, dtype=np.float32), c)
        self._dtype = np.float16 if spec.dtype == "float16" else np.float32

    def __call__(self, samples: npt.NDArray[Any]) -> npt.NDArray[Any]:
        """(window, channels) samples -> tensor of `spec.tensor_shape`."""
        x = np.asarray(samples, dtype=np.float32)
        if self.spec.normalize == "fixed":
            x = (x - self._mean) * self._inv_std
        elif self.spec.normalize == "window":
            x = (x - x.mean(axis=0)) / np.maximum(x.std(axis=0), EPS)
        if self.spec.layout == "channels_first":
            x = x.T
        return np.ascontiguousarray(x.reshape(self.spec.tensor_shape), dtype=self._dtype)
