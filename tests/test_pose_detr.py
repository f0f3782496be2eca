"""Pose heads (YOLOv8/YOLO11-pose: `detect` with keypoints) and set-prediction detectors (`detr`: DETR,
RT-DETR, RF-DETR), on heads written by hand in each family's exported layout, so every figure is known.

No PyPI package we could find ships a pretrained pose or DETR-family ONNX file (they download theirs from
model hubs at run time), so these follow the families' published decodes: Ultralytics' pose export (boxes
and keypoints in input pixels, visibility after a sigmoid) and DETR's / RT-DETR's post-processors (boxes
cx, cy, w, h in 0..1; softmax with a "no object" class, or sigmoid scores; no NMS). The real-model checks of
the other families are in test_real_models.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edged.core.errors import ModelError
from edged.model.decoders.detect import DetectConfig
from edged.model.decoders.detr import DetrConfig
from edged.model.postprocess import make_postprocessor
from edged.model.preprocess import Geometry
from edged.tools.validate import Thresholds, ValidateOptions, judge

LETTERBOX = Geometry(width=1280, height=960, scale_x=0.5, scale_y=0.5, pad_x=0, pad_y=80)  # into 640 x 640
ANCHORS = 8400  # YOLOv8's grid cells at 640 x 640
SKELETON = np.array([[300 + 3 * k, 250 + 10 * k] for k in range(17)], np.float32)  # input pixels


def pose_head(keypoints: int = 17) -> np.ndarray[Any, Any]:
    """[1, 4 + 1 + K x 3, 8400]: one person at (320, 330) 100 x 200 with its keypoints, a weaker copy of it
    (NMS removes it), nothing elsewhere."""
    head = np.zeros((4 + 1 + keypoints * 3, ANCHORS), np.float32)
    for anchor, score, shift in ((10, 0.9, 0.0), (11, 0.6, 4.0)):
        head[:5, anchor] = [320 + shift, 330, 100, 200, score]
        points = head[5:, anchor].reshape(keypoints, 3)
        points[:, :2] = SKELETON[:keypoints] + shift
        points[:, 2] = np.linspace(0.1, 0.95, keypoints)  # visibilities, after the export's sigmoid
    return head[None]


def pose(metadata: dict[str, str], **keys: Any) -> Any:
    cfg = DetectConfig(type="detect", **keys)
    return make_postprocessor(
        cfg, ["output0"], [list(pose_head(keys.get("keypoints", 17)).shape)], metadata, (640, 640)
    )


def test_a_pose_head_publishes_keypoints_in_frame_pixels() -> None:
    """Ultralytics writes the keypoint layout in the model's metadata (kpt_shape) beside its names."""
    decode = pose({"kpt_shape": "[17, 3]", "names": "{0: 'person'}"})
    found = decode([pose_head()], LETTERBOX)["detections"]
    assert len(found) == 1  # the weaker copy was suppressed
    person = found[0]
    assert person["label"] == "person"
    assert person["box"] == [540.0, 300.0, 740.0, 700.0]  # (270..370, 230..430) in the input, unletterboxed
    expected = (SKELETON - [0, 80]) / 0.5
    assert np.allclose(person["keypoints"], expected)
    assert person["keypoint_scores"] == pytest.approx(np.linspace(0.1, 0.95, 17).tolist(), abs=1e-3)


def test_keypoints_can_be_set_for_a_model_without_metadata() -> None:
    """A YOLOv8-face export ([1, 4 + 1 + 5 x 3, N]) carries no kpt_shape: `keypoints: 5` reads it."""
    decode = pose({}, keypoints=5, labels=["face"])
    face = decode([pose_head(5)], LETTERBOX)["detections"][0]
    assert face["label"] == "face"
    assert len(face["keypoints"]) == len(face["keypoint_scores"]) == 5


def test_keypoints_on_other_heads_and_unreadable_metadata_are_refused() -> None:
    with pytest.raises(ModelError, match=r"yolov8 pose heads only"):
        make_postprocessor(
            DetectConfig(type="detect", format="yolov5", keypoints=5), ["o"], [[1, 25200, 21]], {}, (640, 640)
        )
    with pytest.raises(ModelError, match=r"kpt_shape"):
        pose({"kpt_shape": "seventeen"})
    with pytest.raises(ModelError, match=r"expected a dimension of 56"):  # 17 keypoints do not fit 5
        make_postprocessor(
            DetectConfig(type="detect", labels=["person"], keypoints=17), ["o"], [[1, 20, ANCHORS]], {}, (640, 640)
        )


COCO_91 = [f"c{i}" for i in range(91)]


def detr(shapes: list[list[Any]], names: list[str], **keys: Any) -> Any:
    return make_postprocessor(DetrConfig(type="detr", **keys), names, shapes, {}, (640, 640))


def queries(count: int, width: int, fill: float) -> np.ndarray[Any, Any]:
    return np.full((1, count, width), fill, np.float32)


def test_detr_softmax_with_a_no_object_class() -> None:
    """The original DETR (Hugging Face export: logits [1, 100, 92], pred_boxes [1, 100, 4]): softmax over
    91 classes and "no object"; two overlapping queries are both kept (set prediction: no NMS)."""
    logits = queries(100, 92, 0.0)
    logits[0, :, 91] = 8.0  # every query says "no object"...
    logits[0, 3, 17], logits[0, 7, 17] = 10.0, 9.0  # ...but two see class 17, overlapping
    boxes = queries(100, 4, 0.5)
    boxes[0, 3] = [0.5, 0.5, 0.25, 0.5]
    boxes[0, 7] = [0.52, 0.5, 0.25, 0.5]
    decode = detr([[1, 100, 92], [1, 100, 4]], ["logits", "pred_boxes"], labels=COCO_91)
    found = decode([logits, boxes], LETTERBOX)["detections"]
    assert [(d["label"], d["index"]) for d in found] == [("c17", 17), ("c17", 17)]
    assert found[0]["score"] == pytest.approx(np.exp(10) / (np.exp(10) + np.exp(8) + 90), abs=1e-4)
    assert found[0]["box"] == [480.0, 160.0, 800.0, 800.0]  # (240..400, 160..480) in the input


def test_rt_detr_single_output_and_rf_detr_sigmoid_logits() -> None:
    """Ultralytics' RT-DETR export: one [1, 300, 4 + 80] output of boxes and class scores in 0..1; RF-DETR's:
    dets [1, 300, 4] and labels [1, 300, 91] logits (sigmoid)."""
    rt = queries(300, 84, 0.01)
    rt[0, 5, :4] = [0.25, 0.25, 0.1, 0.1]
    rt[0, 5, 4 + 2] = 0.8
    found = detr([[1, 300, 84]], ["output0"])([rt], None)["detections"]
    assert [(d["index"], d["score"], d["box"]) for d in found] == [(2, 0.8, [128.0, 128.0, 192.0, 192.0])]
    dets, logits = queries(300, 4, 0.5), queries(300, 91, -9.0)
    dets[0, 0] = [0.75, 0.75, 0.2, 0.2]
    logits[0, 0, 1] = 3.0
    found = detr([[1, 300, 4], [1, 300, 91]], ["dets", "labels"])([dets, logits], None)["detections"]
    assert [(d["index"], d["score"]) for d in found] == [(1, pytest.approx(0.9526, abs=1e-4))]


@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        ([[1, 84, 8400]], r"YOLO-style head: use detect"),
        ([[1, 8400, 84]], r"at most 3000 queries"),
        ([[1, 1, 160, 120], [1, 2, 160, 120]], r"needs a boxes output"),
        ([[1, 100, 4]], r"needs \[1, Q, 4 \+ classes\]"),
    ],
    ids=["yolov8 head", "transposed yolov8 head", "heatmaps", "boxes alone"],
)
def test_detr_refuses_what_is_not_set_prediction(shapes: list[list[int]], message: str) -> None:
    with pytest.raises(ModelError, match=message):
        detr(shapes, [f"o{i}" for i in range(len(shapes))])


def test_detr_checks_dynamic_axes_on_the_first_output() -> None:
    """A YOLOv8 head exported with dynamic axes ([batch, 22, anchors]) is refused once check-config's
    synthetic frame shows its size, not read as 22 queries of 2,096 classes."""
    decode = detr([["batch", 22, "anchors"]], ["output0"])
    with pytest.raises(ModelError, match=r"use detect"):
        decode([np.zeros((1, 22, 2100), np.float32)], None)


def test_validate_gates_keypoints_of_matched_boxes() -> None:
    """quantize and validate judge a pose model by its boxes and by how far its keypoints moved (as a share
    of the box's diagonal): a candidate whose boxes match but whose points drifted fails that gate."""
    decode = pose({"kpt_shape": "[17, 3]", "names": "{0: 'person'}"})
    moved = pose_head()
    moved[0, 5::3, 10] += 30.0  # every keypoint x of the best person, 30 input pixels (13 % of the box's diagonal)
    frames = [[pose_head()], [pose_head()]]
    report = judge(["output0"], frames, [[pose_head()], [moved]], ValidateOptions(data=Path("-")), Thresholds(),
                   lambda outs: decode(outs)["detections"])  # fmt: skip
    assert report["detection"]["recall"] == 1.0
    assert report["detection"]["keypoint_error"] == pytest.approx(30 / np.hypot(100, 200) / 2, abs=1e-3)
    verdicts = {c["check"]: c["passed"] for c in report["checks"]}
    assert verdicts["detection recall >="]
    assert not verdicts["keypoint error (share of box) <="]
    assert not report["passed"]
