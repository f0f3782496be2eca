"""Frames for calibration, validation and benchmarking: a folder of images, a video file, or a saved `.npz`.

A saved set (`.npz`, written by `save_frames`) holds either raw frames under `frames` (uint8, N x H x W x 3
BGR as OpenCV gives them, or N x H x W grey) that still go through the pipeline's preprocessing, or ready
model inputs under `tensors` (N x the model input without its batch axis, or N x 1 x ...) used as they are.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, overload

import cv2
import numpy as np
import numpy.typing as npt

from edged.core.errors import ToolError
from edged.model.preprocess import Preprocessor
from edged.pipeline.frametap import FRAMES_KEY, save_frames

log = logging.getLogger(__name__)

__all__ = ["FRAMES_KEY", "save_frames"]

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".pgm", ".ppm"}
TENSORS_KEY = "tensors"
Frame = npt.NDArray[np.uint8]
Tensor = npt.NDArray[Any]


def describe(source: Path) -> str:
    """'folder of images', 'video file' or 'saved frames' (for messages)."""
    if source.is_dir():
        return "folder of images"
    return "saved frames" if source.suffix in (".npz", ".npy") else "video file"


def holds_tensors(source: Path) -> bool:
    """Whether `source` is a saved set of ready model inputs (no preprocessing needed)."""
    return source.suffix == ".npz" and source.is_file() and TENSORS_KEY in _load_saved(source)


def iter_frames(source: Path, limit: int | None = None) -> Iterator[Frame]:
    """BGR uint8 frames from a folder of images (sorted by name), a video file, or a `.npz` of raw frames."""
    if not source.exists():
        raise ToolError(f"frame source not found: {source} (give a folder of images, a video file or a .npz)")
    if source.is_dir():
        frames = _iter_images(source)
    elif source.suffix in (".npz", ".npy"):
        frames = iter(_load_saved(source)[FRAMES_KEY])
    else:
        frames = _iter_video(source)
    for i, frame in enumerate(frames):
        if limit is not None and i >= limit:
            return
        yield frame


def load_inputs(
    source: Path, preprocess: Callable[[Frame], Tensor] | None, input_shape: list[Any], limit: int | None = None
) -> list[Tensor]:
    """Model inputs (batch of one each) from a source: saved tensors as they are, frames through `preprocess`."""
    if source.suffix in (".npz", ".npy") and source.is_file():
        saved = _load_saved(source)
        if TENSORS_KEY in saved:
            return _split_tensors(saved[TENSORS_KEY], input_shape, limit)
    if preprocess is None:
        raise ToolError(
            "cannot preprocess frames: the model's preprocessing is unknown "
            "(give --preprocess '{\"size\": [W, H]}' or, for dynamic axes, --shape)"
        )
    if isinstance(preprocess, Preprocessor):
        fitted = LazyInputs([preprocess.fit(frame) for frame in iter_frames(source, limit)], preprocess)
        if not len(fitted):
            raise ToolError(f"no frames in {source} ({describe(source)})")
        return fitted  # type: ignore[return-value]  # a Sequence of tensors, made one at a time
    inputs = [preprocess(frame) for frame in iter_frames(source, limit)]
    if not inputs:
        raise ToolError(f"no frames in {source} ({describe(source)})")
    return inputs


class LazyInputs(Sequence[Tensor]):
    """Model inputs kept as uint8 frames already fitted to the model input (a quarter of the float tensor) and
    made into tensors on access: 256 calibration frames of 640 x 480 hold 236 MB instead of 944 MB, and the
    tensors a calibrator reads are dropped after their frame."""

    def __init__(self, fitted: list[Frame], preprocess: Preprocessor) -> None:
        self._fitted = fitted
        self._preprocess = preprocess

    def __len__(self) -> int:
        return len(self._fitted)

    @overload
    def __getitem__(self, index: int) -> Tensor: ...

    @overload
    def __getitem__(self, index: slice) -> LazyInputs: ...

    def __getitem__(self, index: int | slice) -> Tensor | LazyInputs:
        if isinstance(index, slice):
            return LazyInputs(self._fitted[index], self._preprocess)
        return self._preprocess(self._fitted[index])


def _split_tensors(array: Tensor, input_shape: list[Any], limit: int | None) -> list[Tensor]:
    rank = len(input_shape)
    if array.ndim == rank:  # N x (input without batch axis) -> N inputs of batch 1
        items = [array[i : i + 1] for i in range(array.shape[0])]
    elif array.ndim == rank + 1 and array.shape[1] == 1:
        items = [array[i] for i in range(array.shape[0])]
    else:
        raise ToolError(f"saved tensors have shape {list(array.shape)}; the model input is {input_shape}")
    items = items[:limit] if limit is not None else items
    if not items:
        raise ToolError("the saved set holds no tensors")
    return [np.ascontiguousarray(t) for t in items]


def _load_saved(path: Path) -> dict[str, npt.NDArray[Any]]:
    try:
        if path.suffix == ".npy":
            return {FRAMES_KEY: np.load(path, allow_pickle=False)}
        with np.load(path, allow_pickle=False) as data:
            saved = {k: data[k] for k in data.files}
    except (OSError, ValueError) as exc:
        raise ToolError(f"cannot read saved frames {path}: {exc}") from exc
    if FRAMES_KEY not in saved and TENSORS_KEY not in saved:
        raise ToolError(f"{path} holds {sorted(saved)}; expected an array named {FRAMES_KEY!r} or {TENSORS_KEY!r}")
    if FRAMES_KEY in saved:
        frames = saved[FRAMES_KEY]
        if frames.dtype != np.uint8 or frames.ndim not in (3, 4):
            raise ToolError(f"{path}: {FRAMES_KEY!r} must be uint8 N x H x W [x C], not {frames.dtype} {frames.shape}")
    return saved


def _iter_images(folder: Path) -> Iterator[Frame]:
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise ToolError(f"no images ({', '.join(sorted(IMAGE_SUFFIXES))}) in {folder}")
    for file in files:
        img = cv2.imread(str(file), cv2.IMREAD_COLOR)
        if img is None:
            log.warning("skipping %s: not an image OpenCV can read", file)
            continue
        yield np.asarray(img, dtype=np.uint8)


def _iter_video(path: Path) -> Iterator[Frame]:
    cap = cv2.VideoCapture(str(path))
    if not cap.isOpened():
        raise ToolError(f"cannot open {path} as a video (or give a folder of images or a .npz)")
    try:
        while True:
            ok, frame = cap.read()
            if not ok:
                return
            yield np.asarray(frame, dtype=np.uint8)
    finally:
        cap.release()
