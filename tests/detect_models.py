"""Tiny real detector models: the head emits known boxes, scaled by the brightest input value.

A white frame gives exactly the boxes in `SCENE` (in model-input pixels), a black frame (stretched, so
no grey padding) gives all-zero scores: nothing. The graph is ReduceMax(image) x constant head, built with
onnx.helper and run by the real ONNX Runtime.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edged.model.preprocess import PreprocessSpec

LABELS = ["person", "car", "dog"]
SIZE = 64  # model input is SIZE x SIZE
# (cx, cy, w, h, class, score) in model-input pixels
SCENE = [
    (32.0, 32.0, 16.0, 8.0, 0, 0.9),  # A: person
    (33.0, 32.0, 16.0, 8.0, 0, 0.8),  # B: overlaps A (IoU 0.88), same class -> suppressed by NMS
    (32.0, 32.0, 16.0, 8.0, 1, 0.7),  # C: A's box, other class -> kept unless class_agnostic
    (48.0, 48.0, 8.0, 8.0, 2, 0.1),  # D: under the score threshold
    (10.0, 24.0, 8.0, 8.0, 2, 0.6),  # E: dog
    (60.0, 18.0, 16.0, 8.0, 2, 0.5),  # F: dog reaching into the letterbox padding / beyond the frame
]


EMPTY_ANCHORS = 10  # anchors with zero scores, so that N > 4 + nc as in real heads (8400 vs 84)


def xyxy(cx: float, cy: float, w: float, h: float) -> list[float]:
    return [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]


def yolov5_head() -> np.ndarray:
    rows = []
    for cx, cy, w, h, cls, score in SCENE:
        obj = 1.0 if cls == 0 else 0.5
        scores = [0.01] * len(LABELS)
        scores[cls] = score / obj  # objectness x class score = score
        rows.append([cx, cy, w, h, obj, *scores])
    rows += [[0.0] * (5 + len(LABELS))] * EMPTY_ANCHORS
    return np.asarray([rows], np.float32)  # [1, N, 5 + nc]


def yolov8_head() -> np.ndarray:
    rows = []
    for cx, cy, w, h, cls, score in SCENE:
        scores = [0.01] * len(LABELS)
        scores[cls] = score
        rows.append([cx, cy, w, h, *scores])
    rows += [[0.0] * (4 + len(LABELS))] * EMPTY_ANCHORS
    head: np.ndarray = np.asarray([rows], np.float32).transpose(0, 2, 1).copy()  # [1, 4 + nc, N]
    return head


def boxes_head() -> np.ndarray:
    """What a graph with NMS inside gives: the kept boxes (B already suppressed), x1 y1 x2 y2 score class."""
    rows = [[*xyxy(cx, cy, w, h), score, cls] for i, (cx, cy, w, h, cls, score) in enumerate(SCENE) if i != 1]
    return np.asarray([rows], np.float32)


def _brightest(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], rank: int) -> str:
    if not any(n.output[0] == "m4" for n in nodes):
        nodes.append(helper.make_node("ReduceMax", ["image"], ["m4"], axes=[1, 2, 3], keepdims=1))
    inits.append(numpy_helper.from_array(np.ones(rank, np.int64), f"shape{rank}"))
    nodes.append(helper.make_node("Reshape", ["m4", f"shape{rank}"], [f"m{rank}"]))
    return f"m{rank}"


def make_detector(path: Path, family: str, *, resize: str = "letterbox", labels: bool = True) -> Path:
    """family: yolov5 | yolov8 | boxes (one [1, N, 6] output) | boxes-split (normalised, 4 outputs)."""
    x = helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, SIZE, SIZE])
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    outputs = []
    if family == "boxes-split":
        head = boxes_head()[0]
        m3 = _brightest(nodes, inits, 3)
        m2 = _brightest(nodes, inits, 2)
        inits += [
            numpy_helper.from_array((head[None, :, :4] / SIZE).astype(np.float32), "KB"),
            numpy_helper.from_array(head[None, :, 4].astype(np.float32), "KS"),
            numpy_helper.from_array(head[None, :, 5].astype(np.int64), "KC"),
            numpy_helper.from_array(np.asarray([len(head)], np.int64), "KN"),
        ]
        nodes += [
            helper.make_node("Mul", ["KB", m3], ["det_boxes"]),
            helper.make_node("Mul", ["KS", m2], ["det_scores"]),
            helper.make_node("Identity", ["KC"], ["det_classes"]),
            helper.make_node("Identity", ["KN"], ["num_dets"]),
        ]
        n = len(head)
        outputs = [
            helper.make_tensor_value_info("num_dets", TensorProto.INT64, [1]),
            helper.make_tensor_value_info("det_boxes", TensorProto.FLOAT, [1, n, 4]),
            helper.make_tensor_value_info("det_scores", TensorProto.FLOAT, [1, n]),
            helper.make_tensor_value_info("det_classes", TensorProto.INT64, [1, n]),
        ]
    else:
        head = {"yolov5": yolov5_head, "yolov8": yolov8_head, "boxes": boxes_head}[family]()
        m3 = _brightest(nodes, inits, 3)
        inits.append(numpy_helper.from_array(head, "K"))
        nodes.append(helper.make_node("Mul", ["K", m3], ["output0"]))
        outputs = [helper.make_tensor_value_info("output0", TensorProto.FLOAT, list(head.shape))]
    graph = helper.make_graph(nodes, "detector", [x], outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    spec = PreprocessSpec(size=(SIZE, SIZE), resize=resize, color="rgb", layout="nchw", dtype="float32")
    props = {"edged.preprocess": spec.to_metadata(), "edged.name": f"det-{family}"}
    if labels:
        props["edged.labels"] = json.dumps(LABELS)
    helper.set_model_props(model, props)
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path
