"""Detection postprocessing on real tiny detector models: decoding per head family, NMS, box mapping."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from detect_models import LABELS, make_detector

from edged.core.errors import ModelError
from edged.model.decoders.detect import DetectConfig, make_detect, nms
from edged.model.preprocess import Geometry, Preprocessor
from edged.pipeline.model import Model, prepare_model
from edged.pipeline.settings import PipelineConfig

WHITE = np.full((64, 128, 3), 255, np.uint8)  # a 128 x 64 frame: letterboxed into 64 x 64 with 16 px bars
A = [48.0, 24.0, 80.0, 40.0]  # A's box (24, 28, 40, 36 in the input) back in frame pixels
E = [12.0, 8.0, 28.0, 24.0]
F = [104.0, 0.0, 128.0, 12.0]  # clipped to the frame on the right and at the top
EXPECTED = [("person", A, 0.9), ("car", A, 0.7), ("dog", E, 0.6), ("dog", F, 0.5)]


def pipeline_cfg(model: Path, **post: Any) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "name": "det",
            "source": {"type": "camera", "uri": "unused.mp4"},
            "model": {"path": str(model), "providers": ["CPUExecutionProvider"], "warmup_runs": 0},
            "postprocess": {"type": "detect", **post},
        }
    )


def detect(model: Model, frame: np.ndarray) -> dict[str, Any]:
    h, w = frame.shape[:2]
    assert isinstance(model.pre, Preprocessor)
    return model.post(model.loaded.run(model.pre(frame)), model.pre.geometry(w, h))


def summary(result: dict[str, Any]) -> list[tuple[str, list[float], float]]:
    return [(d["label"], d["box"], d["score"]) for d in result["detections"]]


@pytest.mark.parametrize("family", ["yolov5", "yolov8", "boxes", "boxes-split"])
def test_each_head_family_decodes_to_the_same_boxes_in_frame_pixels(tmp_path: Path, family: str) -> None:
    model = prepare_model(pipeline_cfg(make_detector(tmp_path / "d.onnx", family)), tmp_path)
    result = detect(model, WHITE)
    assert result["frame"] == {"w": 128, "h": 64}
    assert summary(result) == EXPECTED
    assert [d["index"] for d in result["detections"]] == [0, 1, 2, 2]


@pytest.mark.parametrize("family", ["yolov5", "yolov8"])
def test_format_can_be_given_when_labels_are_missing(tmp_path: Path, family: str) -> None:
    path = make_detector(tmp_path / "d.onnx", family, labels=False)
    model = prepare_model(pipeline_cfg(path, format=family), tmp_path)
    result = detect(model, WHITE)
    assert [(d["label"], d["box"]) for d in result["detections"]] == [("0", A), ("1", A), ("2", E), ("2", F)]


def test_stretch_maps_each_axis_on_its_own(tmp_path: Path) -> None:
    model = prepare_model(pipeline_cfg(make_detector(tmp_path / "d.onnx", "yolov8", resize="stretch")), tmp_path)
    first = detect(model, WHITE)["detections"][0]
    assert first["box"] == [48.0, 28.0, 80.0, 36.0]  # x halves, y stays


def test_black_frame_has_no_detections(tmp_path: Path) -> None:
    model = prepare_model(pipeline_cfg(make_detector(tmp_path / "d.onnx", "yolov5", resize="stretch")), tmp_path)
    assert detect(model, np.zeros((64, 128, 3), np.uint8))["detections"] == []


def test_threshold_class_filter_agnostic_nms_and_max_detections(tmp_path: Path) -> None:
    path = make_detector(tmp_path / "d.onnx", "yolov8")

    def labels(**post: Any) -> list[tuple[str, float]]:
        result = detect(prepare_model(pipeline_cfg(path, **post), tmp_path), WHITE)
        return [(d["label"], d["score"]) for d in result["detections"]]

    assert labels(score_threshold=0.05) == [("person", 0.9), ("car", 0.7), ("dog", 0.6), ("dog", 0.5), ("dog", 0.1)]
    assert labels(classes=["dog"]) == [("dog", 0.6), ("dog", 0.5)]
    assert labels(classes=[1]) == [("car", 0.7)]
    assert labels(class_agnostic=True) == [("person", 0.9), ("dog", 0.6), ("dog", 0.5)]
    assert labels(max_detections=2) == [("person", 0.9), ("car", 0.7)]
    assert labels(iou_threshold=0.95) == [("person", 0.9), ("person", 0.8), ("car", 0.7), ("dog", 0.6), ("dog", 0.5)]
    with pytest.raises(ModelError, match="unknown label 'cat'"):
        labels(classes=["cat"])


def test_nms_is_greedy_and_class_aware() -> None:
    boxes = np.asarray([[0, 0, 10, 10], [1, 0, 11, 10], [0, 0, 10, 10], [20, 20, 30, 30]], np.float32)
    scores = np.asarray([0.9, 0.8, 0.7, 0.6], np.float32)
    assert nms(boxes, scores, 0.5, 10).tolist() == [0, 3]
    assert nms(boxes, scores, 0.5, 10, np.asarray([0, 0, 1, 0])).tolist() == [0, 2, 3]
    assert nms(boxes, scores, 0.5, 1).tolist() == [0]
    assert nms(np.zeros((0, 4), np.float32), np.zeros(0, np.float32), 0.5, 10).tolist() == []


def test_labels_from_file_override_metadata(tmp_path: Path) -> None:
    labels = tmp_path / "labels.txt"
    labels.write_text("human\nvehicle\nanimal\n", encoding="utf-8")
    model = prepare_model(pipeline_cfg(make_detector(tmp_path / "d.onnx", "yolov5"), labels=str(labels)), tmp_path)
    assert [d["label"] for d in detect(model, WHITE)["detections"]] == ["human", "vehicle", "animal", "animal"]
    assert LABELS[0] == "person"


def test_detect_config_is_part_of_the_postprocess_union(tmp_path: Path) -> None:
    cfg = pipeline_cfg(make_detector(tmp_path / "d.onnx", "yolov8"), iou_threshold=0.5)
    assert isinstance(cfg.postprocess, DetectConfig)
    assert cfg.postprocess.iou_threshold == 0.5


def test_labels_that_do_not_fit_the_head_are_refused(tmp_path: Path) -> None:
    labels = tmp_path / "labels.txt"
    labels.write_text("a\nb\n", encoding="utf-8")
    path = make_detector(tmp_path / "d.onnx", "yolov8")
    with pytest.raises(ModelError, match="2 labels do not fit a yolov8 head"):
        prepare_model(pipeline_cfg(path, labels=str(labels), format="yolov8"), tmp_path)


def test_boxes_with_no_area_are_never_published() -> None:
    """A decoder that does not fit its model makes zero-area boxes at the origin by the thousand (a YOLOX
    head read as YOLOv5 did); so do NaN scores and boxes wholly outside the frame. None is published."""
    cfg = DetectConfig.model_validate({"type": "detect", "format": "yolov8", "score_threshold": 0.3})
    detect = make_detect(cfg, ["out"], [[1, 4 + 1, 6]], {}, (64, 64))
    rows = np.asarray(
        [  # cx, cy, w, h, score (yolov8: one class)
            [32, 32, 10, 10, 0.9],  # a real box
            [0, 0, 0, 0, 0.99],  # zero area at the origin
            [10, 10, -4, 6, 0.95],  # negative width
            [np.nan, 5, 4, 4, 0.9],  # not a number
            [40, 40, 0, 8, 0.8],  # zero width
            [20, 20, 6, 6, 0.6],  # another real one
        ],
        np.float32,
    )
    out = [rows.T[np.newaxis]]  # [1, 5, 6]
    offside = Geometry(64, 32, 1.0, 1.0, 0, 0)  # a 64 x 32 frame: a box below y = 32 lies outside it
    boxes = [d["box"] for d in detect(out, offside)["detections"]]
    assert boxes == [[27.0, 27.0, 37.0, 32.0], [17.0, 17.0, 23.0, 23.0]]  # the first clipped at the bottom
    below = np.zeros((6, 5), np.float32)
    below[0] = [32, 50, 10, 10, 0.9]  # wholly below the 32-pixel frame
    assert detect([below.T[np.newaxis]], offside)["detections"] == []  # clipped to the frame: no area left


def test_ssd_outputs_without_nms_in_the_graph_get_edgeds_nms() -> None:
    """UltraFace / MobileNet-SSD exports: decoded corners [1, N, 4] in 0..1 beside a score per class
    [1, N, C] whose column 0 is the background; the graph did no NMS, so edged does (an overlapping weaker
    box goes), and the background column is never a class."""
    scores = np.zeros((1, 4420, 2), np.float32)
    scores[0, :, 0] = 0.99  # background everywhere...
    scores[0, 7] = [0.05, 0.95]  # ...but a face, and a weaker copy of it
    scores[0, 8] = [0.2, 0.8]
    boxes = np.full((1, 4420, 4), 0.5, np.float32)
    boxes[0, 7] = [0.25, 0.25, 0.5, 0.75]
    boxes[0, 8] = [0.26, 0.25, 0.5, 0.75]
    for labels, label in ((["face"], "face"), (None, "0")):
        cfg = DetectConfig(type="detect", format="boxes", labels=labels)
        decode = make_detect(cfg, ["scores", "boxes"], [[1, 4420, 2], [1, 4420, 4]], {}, (320, 240))
        found = decode([scores, boxes], None)["detections"]
        assert [(d["label"], d["score"], d["box"]) for d in found] == [(label, 0.95, [80.0, 60.0, 160.0, 180.0])]
