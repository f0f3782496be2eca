"""Tiny real ONNX models and frame sets for the toolchain tests (built with onnx.helper, no downloads)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edged.model.preprocess import PreprocessSpec
from edged.tools.frames import save_frames

SIZE = 16
CLASSES = 6


def make_conv_model(
    path: Path,
    *,
    opset: int = 17,
    dynamic: bool = False,
    metadata: bool = True,
    damage: bool = False,
    seed: int = 0,
) -> Path:
    """Conv 3x3 -> ReLU -> GlobalAveragePool -> Gemm: a small CNN classifier with seeded weights.

    `dynamic`: batch, height and width are symbolic axes. `damage`: the classifier weights are shuffled,
    as a broken conversion would leave them (same graph, different answers).
    """
    rng = np.random.default_rng(seed)
    w1 = rng.normal(0, 0.5, (12, 3, 3, 3)).astype(np.float32)
    b1 = rng.normal(0, 0.1, 12).astype(np.float32)
    w2 = rng.normal(0, 1.0, (12, CLASSES)).astype(np.float32)
    if damage:
        w2 = w2[:, ::-1] * -1.0
    dims: list[int | str] = ["N", 3, "H", "W"] if dynamic else [1, 3, SIZE, SIZE]
    x = helper.make_tensor_value_info("image", TensorProto.FLOAT, dims)
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N" if dynamic else 1, CLASSES])
    nodes = [
        helper.make_node("Conv", ["image", "W1", "B1"], ["conv"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv"], ["relu"]),
        helper.make_node("GlobalAveragePool", ["relu"], ["pool"]),
        helper.make_node("Flatten", ["pool"], ["flat"]),
        helper.make_node("Gemm", ["flat", "W2", "B2"], ["logits"]),
    ]
    inits = [
        numpy_helper.from_array(w1, "W1"),
        numpy_helper.from_array(b1, "B1"),
        numpy_helper.from_array(np.ascontiguousarray(w2), "W2"),
        numpy_helper.from_array(np.zeros(CLASSES, np.float32), "B2"),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "conv", [x], [y], initializer=inits),
        opset_imports=[helper.make_opsetid("", opset)],
    )
    model.ir_version = 7
    props = {"edged.labels": json.dumps([f"class{i}" for i in range(CLASSES)]), "edged.name": "conv"}
    if metadata:
        spec = PreprocessSpec(size=(SIZE, SIZE), mean=(0.5,), std=(0.25,))
        props["edged.preprocess"] = spec.to_metadata()
    _finish(model, path, props)
    return path


def make_frames(path: Path, count: int, *, seed: int = 1, size: tuple[int, int] = (24, 20)) -> Path:
    """A `.npz` of varied BGR frames: smooth random colour fields plus noise, so classes differ per frame."""
    import cv2

    rng = np.random.default_rng(seed)
    frames = []
    for _ in range(count):
        low = rng.integers(0, 256, size=(3, 3, 3), dtype=np.uint8)
        img = cv2.resize(low, size, interpolation=cv2.INTER_LINEAR).astype(np.float32)
        img += rng.normal(0, 20, img.shape)
        frames.append(np.clip(img, 0, 255).astype(np.uint8))
    return save_frames(path, frames)


def make_map_model(path: Path, *, seed: int = 0) -> Path:
    """Conv 3x3 -> ReLU -> Conv 1x1 to one channel -> Sigmoid: a dense probability map [1, 1, H, W], shaped
    like a text detector's (DB) or a segmenter's output."""
    rng = np.random.default_rng(seed)
    x = helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, SIZE, SIZE])
    y = helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 1, SIZE, SIZE])
    nodes = [
        helper.make_node("Conv", ["image", "W1", "B1"], ["conv"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv"], ["relu"]),
        helper.make_node("Conv", ["relu", "W2", "B2"], ["logit"]),
        helper.make_node("Sigmoid", ["logit"], ["prob"]),
    ]
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.5, (8, 3, 3, 3)).astype(np.float32), "W1"),
        numpy_helper.from_array(rng.normal(0, 0.1, 8).astype(np.float32), "B1"),
        numpy_helper.from_array(rng.normal(0, 1.0, (1, 8, 1, 1)).astype(np.float32), "W2"),
        numpy_helper.from_array(np.zeros(1, np.float32), "B2"),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "map", [x], [y], initializer=inits), opset_imports=[helper.make_opsetid("", 17)]
    )
    model.ir_version = 7
    helper.set_model_props(
        model, {"edged.preprocess": PreprocessSpec(size=(SIZE, SIZE), mean=(0.5,), std=(0.25,)).to_metadata()}
    )
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def make_outlier_model(path: Path, *, seed: int = 0) -> Path:
    """A classifier whose first tensor int8 cannot hold: the blue channel is multiplied by 1000 (a sensor's
    raw count beside normalised colours) and the convolution ignores it, so with one range for the tensor
    the channels it reads round to zero. Keeping the convolution and its input in float fixes it."""
    rng = np.random.default_rng(seed)
    w1 = rng.normal(0, 0.5, (12, 3, 3, 3)).astype(np.float32)
    w1[:, 0] = 0.0  # the boosted channel carries nothing the classifier uses
    x = helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, SIZE, SIZE])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, CLASSES])
    nodes = [
        helper.make_node("Mul", ["image", "boost"], ["boosted"]),
        helper.make_node("Conv", ["boosted", "W1", "B1"], ["conv"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv"], ["relu"]),
        helper.make_node("GlobalAveragePool", ["relu"], ["pool"]),
        helper.make_node("Flatten", ["pool"], ["flat"]),
        helper.make_node("Gemm", ["flat", "W2", "B2"], ["logits"]),
    ]
    inits = [
        numpy_helper.from_array(np.array([1000.0, 1.0, 1.0], np.float32).reshape(1, 3, 1, 1), "boost"),
        numpy_helper.from_array(w1, "W1"),
        numpy_helper.from_array(rng.normal(0, 0.1, 12).astype(np.float32), "B1"),
        numpy_helper.from_array(rng.normal(0, 1.0, (12, CLASSES)).astype(np.float32), "W2"),
        numpy_helper.from_array(np.zeros(CLASSES, np.float32), "B2"),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "outlier", [x], [y], initializer=inits), opset_imports=[helper.make_opsetid("", 17)]
    )
    model.ir_version = 7
    spec = PreprocessSpec(size=(SIZE, SIZE), mean=(0.5,), std=(0.25,))
    _finish(model, path, {"edged.preprocess": spec.to_metadata()})
    return path


def _finish(model: onnx.ModelProto, path: Path, props: dict[str, str]) -> None:
    """Metadata, the ONNX checker, then the file: the tail every builder here shares."""
    helper.set_model_props(model, props)
    onnx.checker.check_model(model)
    onnx.save(model, path)


def make_yolo_model(path: Path, *, seed: int = 0, opset: int = 17, size: int = 32, classes: int = 3) -> Path:
    """A YOLO-style detector export with random weights: a small backbone, a box branch decoded to input pixels
    (Sigmoid x size) and a class branch (Sigmoid), joined by one Concat into `[1, 4 + classes, N]`, the layout
    of a YOLOv8 export. That Concat mixes ranges (0..size beside 0..1): with one int8 scale the scores round
    to a few steps, so every all-int8 recipe changes which boxes pass the threshold."""
    rng = np.random.default_rng(seed)
    cells = (size // 4) ** 2
    x = helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, size, size])
    y = helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, 4 + classes, cells])
    nodes = [
        helper.make_node("Conv", ["images", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "W2", "B2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Conv", ["r2", "WB", "BB"], ["box_logits"]),
        helper.make_node("Sigmoid", ["box_logits"], ["box_unit"]),
        helper.make_node("Mul", ["box_unit", "stride"], ["boxes"]),
        helper.make_node("Conv", ["r2", "WC", "BC"], ["cls_logits"]),
        helper.make_node("Sigmoid", ["cls_logits"], ["scores"]),
        helper.make_node("Concat", ["boxes", "scores"], ["head"], axis=1),
        helper.make_node("Reshape", ["head", "shape"], ["output0"]),
    ]
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32), "W1"),
        numpy_helper.from_array(np.zeros(8, np.float32), "B1"),
        numpy_helper.from_array(rng.normal(0, 0.3, (8, 8, 3, 3)).astype(np.float32), "W2"),
        numpy_helper.from_array(np.zeros(8, np.float32), "B2"),
        numpy_helper.from_array(rng.normal(0, 0.5, (4, 8, 1, 1)).astype(np.float32), "WB"),
        numpy_helper.from_array(np.zeros(4, np.float32), "BB"),
        numpy_helper.from_array(rng.normal(0, 1.0, (classes, 8, 1, 1)).astype(np.float32), "WC"),
        numpy_helper.from_array(np.full(classes, -1.0, np.float32), "BC"),
        numpy_helper.from_array(np.array(float(size), np.float32), "stride"),
        numpy_helper.from_array(np.array([1, 4 + classes, cells], np.int64), "shape"),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "yolo", [x], [y], initializer=inits), opset_imports=[helper.make_opsetid("", opset)]
    )
    model.ir_version = 7
    spec = PreprocessSpec(size=(size, size), color="rgb", scale=1 / 255)
    _finish(model, path, {"edged.preprocess": spec.to_metadata()})
    return path
