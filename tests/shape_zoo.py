"""The shape zoo: generated models with each decoder family's output layouts (and deliberately wrong ones),
NCHW and NHWC inputs, static and dynamic height and width. Every output depends on the frame (a 1x1
convolution for a map, the frame's mean times a constant for a vector), so real frames give real variety.
Built with onnx.helper and run by the real ONNX Runtime."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SIZE = 32  # the input is SIZE x SIZE; the stride 8/16/32 grid has 16 + 4 + 1 = 21 cells
CELLS = 21
LABELS = ["a", "b", "c"]


@dataclass(frozen=True)
class Out:
    """One output: `vector` (a fixed shape, mean x constant), or `map` (channels over the input's grid)."""

    name: str
    kind: str  # vector | map
    shape: tuple[int, ...] = ()  # vector: the shape; map: (channels,)
    values: Callable[[np.random.Generator, tuple[int, ...]], np.ndarray] | None = None  # a vector's constant
    channels_last: bool = False  # map: [1, H, W, C]
    activation: str | None = None  # map: Sigmoid or Softmax over its channels


def _uniform(low: float, high: float) -> Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]:
    return lambda rng, shape: rng.uniform(low, high, shape)


def _yolov8(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    head = rng.uniform(0, 1, shape)
    head[0, :2] *= SIZE  # cx, cy in input pixels
    head[0, 2:4] *= SIZE / 2  # w, h
    return head


def _yolov5(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    head = rng.uniform(0, 1, shape)
    head[0, :, :2] *= SIZE
    head[0, :, 2:4] *= SIZE / 2
    return head


def _boxes6(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    n = shape[1]
    x1, y1 = rng.uniform(0, SIZE / 2, n), rng.uniform(0, SIZE / 2, n)
    w, h = rng.uniform(1, SIZE / 2, n), rng.uniform(1, SIZE / 2, n)
    return np.stack([x1, y1, x1 + w, y1 + h, rng.uniform(0, 1, n), rng.integers(0, 3, n)], axis=1)[None]


def _corners(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return _boxes6(rng, (1, shape[1], 6))[..., :4]


def _cxcywh01(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return np.concatenate([rng.uniform(0.2, 0.8, (*shape[:-1], 2)), rng.uniform(0.05, 0.3, (*shape[:-1], 2))], -1)


def _classes(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.integers(0, 3, shape).astype(np.float64)


# family -> its outputs: the right layouts of each decoder, then deliberately wrong ones
FAMILIES: dict[str, list[Out]] = {
    "classes": [Out("logits", "vector", (1, 3), _uniform(-3, 3))],
    "seg_nchw": [Out("masks", "map", (3,))],
    "seg_nhwc": [Out("masks", "map", (3,), channels_last=True, activation="Softmax")],
    "text_map": [Out("prob", "map", (1,), activation="Sigmoid")],
    "yolov8": [Out("output0", "vector", (1, 7, CELLS), _yolov8)],
    "yolov5": [Out("output0", "vector", (1, 3 * CELLS, 8), _yolov5)],
    "boxes6": [Out("dets", "vector", (1, 5, 6), _boxes6)],
    "boxes_split": [
        Out("det_boxes", "vector", (1, 5, 4), _corners),
        Out("det_scores", "vector", (1, 5), _uniform(0, 1)),
        Out("det_classes", "vector", (1, 5), _classes),
    ],
    "detr": [Out("pred_boxes", "vector", (1, 10, 4), _cxcywh01), Out("logits", "vector", (1, 10, 3), _uniform(-4, 4))],
    "centernet": [
        Out("heatmap", "map", (1,), activation="Sigmoid"),
        Out("scale", "map", (2,)),
        Out("offset", "map", (2,)),
    ],
    # wrong: a per-cell box regression beside a per-cell face softmax (a raw face detector's head)
    "regression_nhwc": [
        Out("boxes", "map", (4,), channels_last=True),
        Out("faces", "map", (2,), channels_last=True, activation="Softmax"),
    ],
    # wrong: three heads of a face model (box, landmarks, score), each a vector
    "heads": [
        Out("box", "vector", (1, 4), _uniform(-1, 1)),
        Out("landmarks", "vector", (1, 10), _uniform(-1, 1)),
        Out("score", "vector", (1, 2), _uniform(-1, 1)),
    ],
    # wrong: an SSD's raw `loc` offsets around zero beside its class scores, before the prior decode
    "ssd_raw": [
        Out("loc", "vector", (1, 20, 4), _uniform(-2, 2)),
        Out("conf", "vector", (1, 20, 3), _uniform(0, 1)),
    ],
}
RIGHT = {  # family -> the decoder that reads it (check-config must accept the pairing)
    "classes": "classify",
    "seg_nchw": "segment",
    "seg_nhwc": "segment",
    "text_map": "text",
    "yolov8": "detect",
    "yolov5": "detect",
    "boxes6": "detect",
    "boxes_split": "detect",
    "detr": "detr",
    "centernet": "centernet",
}
DECODERS: dict[str, dict[str, Any]] = {  # decoder -> its postprocess section in the zoo
    "classify": {"type": "classify", "labels": LABELS},
    "segment": {"type": "segment", "labels": LABELS},
    "text": {"type": "text"},
    "detect": {"type": "detect", "labels": LABELS},
    "detr": {"type": "detr", "labels": LABELS},
    "centernet": {"type": "centernet", "labels": ["face"], "variant": "centernet"},
    "gfl": {"type": "gfl", "labels": LABELS},
    "raw": {"type": "raw"},
}


def make_model(path: Path, family: str, *, nhwc: bool, dynamic: bool) -> Path:
    """The family's outputs over an RGB image input (NCHW or NHWC, fixed or dynamic height and width)."""
    hw: list[int | str] = ["H", "W"] if dynamic else [SIZE, SIZE]
    shape = [1, *hw, 3] if nhwc else [1, 3, *hw]
    x = helper.make_tensor_value_info("image", TensorProto.FLOAT, shape)
    nodes = [helper.make_node("Transpose", ["image"], ["nchw"], perm=[0, 3, 1, 2])] if nhwc else []
    nodes.append(helper.make_node("Identity", ["nchw" if nhwc else "image"], ["x"]))
    nodes.append(helper.make_node("ReduceMean", ["x"], ["mean"], axes=[0, 1, 2, 3], keepdims=0))
    rng = np.random.default_rng(sum(map(ord, family)))
    inits: list[onnx.TensorProto] = []
    outs = []
    for out in FAMILIES[family]:
        if out.kind == "vector":
            assert out.values is not None
            # mean + 0.5: a black frame still gives the constant's layout (halved), a white one 1.5 x
            inits.append(numpy_helper.from_array(out.values(rng, out.shape).astype(np.float32), f"k_{out.name}"))
            nodes += [
                helper.make_node("Add", ["mean", "half"], [f"m_{out.name}"]),
                helper.make_node("Mul", [f"k_{out.name}", f"m_{out.name}"], [out.name]),
            ]
            outs.append(helper.make_tensor_value_info(out.name, TensorProto.FLOAT, list(out.shape)))
            continue
        channels = out.shape[0]
        inits.append(numpy_helper.from_array(rng.normal(0, 2, (channels, 3, 1, 1)).astype(np.float32), f"w_{out.name}"))
        conv = f"c_{out.name}"
        nodes.append(helper.make_node("Conv", ["x", f"w_{out.name}"], [conv]))
        if out.channels_last:
            nodes.append(helper.make_node("Transpose", [conv], [f"t_{out.name}"], perm=[0, 2, 3, 1]))
            conv = f"t_{out.name}"
        if out.activation is not None:
            if out.activation == "Softmax":
                nodes.append(helper.make_node("Softmax", [conv], [out.name], axis=-1 if out.channels_last else 1))
            else:
                nodes.append(helper.make_node(out.activation, [conv], [out.name]))
        else:
            nodes.append(helper.make_node("Identity", [conv], [out.name]))
        dims: list[int | str] = [1, *hw, channels] if out.channels_last else [1, channels, *hw]
        outs.append(helper.make_tensor_value_info(out.name, TensorProto.FLOAT, dims))
    inits.append(numpy_helper.from_array(np.asarray(0.5, np.float32), "half"))
    graph = helper.make_graph(nodes, family, [x], outs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path
