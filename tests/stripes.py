"""Frames that say their own number and a model that reads it back: capture-to-result latency against an RTSP
stream's own clock (tests/test_rtsp.py, benchmarks/rtsp_latency.py).

Frame n of 2**BITS shows bit i of n as stripe i, white or black. The model (a real ONNX graph) returns the
stripes' means, so a `raw` result says which frame it was made from; optionally it spends time on a
convolution over an upscaled copy of the frame (times zero: the answer does not change), to be slower than
the camera. The RTSP server's push log (tests/rtsp_server.py, RTSP_PUSH_LOG) says when each frame was sent.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from pathlib import Path

import cv2
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edged.model.preprocess import PreprocessSpec

BITS = 11  # 2,048 distinct frames: 82 s at 25 frames/s before a number comes round again
STRIPE = 32  # pixels per stripe in the served frame (352x240)
MODEL_W, MODEL_H = BITS * 8, 8  # the model sees each stripe as 8 columns


def write_frames(folder: Path) -> None:
    """Frame n of 2**BITS: stripe i white when bit i of n is set."""
    for old in folder.glob("*.jpg"):
        old.unlink()
    for n in range(2**BITS):
        image = np.zeros((240, BITS * STRIPE, 3), np.uint8)
        for bit in range(BITS):
            if n >> bit & 1:
                image[:, bit * STRIPE : (bit + 1) * STRIPE] = 255
        cv2.imwrite(str(folder / f"{n:04d}.jpg"), image, [cv2.IMWRITE_JPEG_QUALITY, 90])


def make_model(path: Path, upscale: int = 64, channels: int = 8) -> Path:
    """image [1,3,8,88] -> stripe means [1,88]; plus a convolution over an upscaled copy, times zero, so the
    run costs what `upscale` and `channels` make it cost without changing the answer."""
    x = helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, MODEL_H, MODEL_W])
    y = helper.make_tensor_value_info("means", TensorProto.FLOAT, [1, MODEL_W])
    rng = np.random.default_rng(0)
    init = [
        numpy_helper.from_array(np.array([1, 3, upscale, upscale], np.int64), "sizes"),
        numpy_helper.from_array(rng.standard_normal((channels, 3, 3, 3)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.standard_normal((channels, channels, 3, 3)).astype(np.float32), "w2"),
        numpy_helper.from_array(np.zeros((), np.float32), "zero"),
    ]
    nodes = [
        helper.make_node("ReduceMean", ["image"], ["m"], axes=[1, 2], keepdims=0),
        helper.make_node("Resize", ["image", "", "", "sizes"], ["big"], mode="linear"),
        helper.make_node("Conv", ["big", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["c1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("ReduceMean", ["c2"], ["busy"], keepdims=0),
        helper.make_node("Mul", ["busy", "zero"], ["nothing"]),
        helper.make_node("Add", ["m", "nothing"], ["means"]),
    ]
    model = helper.make_model(helper.make_graph(nodes, "stripes", [x], [y], initializer=init),
                              opset_imports=[helper.make_opsetid("", 17)])  # fmt: skip
    model.ir_version = 8
    spec = PreprocessSpec(size=(MODEL_W, MODEL_H), resize="stretch", color="rgb", layout="nchw", dtype="float32")
    helper.set_model_props(model, {"edged.preprocess": spec.to_metadata(), "edged.name": "stripes"})
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def frame_number(means: list[float]) -> int:
    """The frame's number from its stripe means (8 values per stripe; the middle 4 are read)."""
    values = np.asarray(means, np.float32).reshape(BITS, 8)[:, 2:6].mean(axis=1)
    return int(sum(1 << bit for bit, v in enumerate(values) if v > 0.5))


class PushClock:
    """The server's push log: when each frame number was pushed (it comes round every 2**BITS frames)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def latencies(self, results: list[tuple[int, float]]) -> list[tuple[float, float]]:
        """(result time, latency in ms) for each (frame number, result time): the latest push of that
        number before the result."""
        pushes: dict[int, list[float]] = defaultdict(list)
        for line in self.path.read_text(encoding="utf-8").splitlines():
            number, pushed = line.split()
            pushes[int(number)].append(float(pushed))
        out = []
        for frame, at in results:
            times = pushes.get(frame, [])
            i = bisect.bisect_right(times, at)
            if i:
                out.append((at, (at - times[i - 1]) * 1e3))
        return out
