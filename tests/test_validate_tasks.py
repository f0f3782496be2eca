"""`edged validate` judges by the task an output serves: class scores by top-1, a dense map by the IoU of its
masks (a text detector's 1 x 1 x H x W probability map was judged as a 230,400-class classifier), anything
else by its errors. Real models made here, real ONNX Runtime, real int8."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tools_models import make_conv_model, make_frames, make_map_model

from edged.tools.quantize import QuantizeOptions, quantize_model
from edged.tools.validate import Thresholds, ValidateOptions, output_task, validate_models


@pytest.mark.parametrize(
    ("shape", "task"),
    [
        ((1, 1000), "classify"),
        ((1, 2, 1, 1), "classify"),
        ((1, 1, 480, 480), "dense"),
        ((1, 21, 64, 64), "dense"),
        ((1, 1), "raw"),
        ((1, 84, 8400), "detect"),
        ((1, 25200, 85), "detect"),
        ((1, 100, 6), "detect"),
        ((1, 197, 768), "raw"),  # transformer tokens: not a head
    ],
)
def test_the_task_comes_from_the_output_shape(shape: tuple[int, ...], task: str) -> None:
    assert output_task(shape) == task
    assert output_task(shape, "raw") == "raw"  # --task wins


def test_a_probability_map_is_judged_by_mask_iou_not_as_a_classifier(tmp_path: Path) -> None:
    fp32 = make_map_model(tmp_path / "map.onnx")
    frames = make_frames(tmp_path / "f.npz", 24, size=(16, 16))
    int8 = tmp_path / "map.int8.onnx"
    quantize_model(fp32, int8, QuantizeOptions(calib=frames, progress=False, search=False))
    report = validate_models(fp32, int8, ValidateOptions(data=frames, progress=False), Thresholds())
    assert report["task"] == "dense"
    assert report["classification"] is None  # no top-1 over pixels
    dense = report["dense"]
    assert dense["mask_iou_mean"] > 0.9
    assert dense["pixel_agreement"] > 0.95
    assert dense["pixel_error"] < 0.02
    # the map is gated by its masks and pixel error, not by cosine (a mostly-empty map's cosine says little)
    assert [c["check"] for c in report["checks"]] == ["mask IoU (mean) >=", "pixel error (share of range) <="]
    assert report["passed"]
    strict = validate_models(fp32, int8, ValidateOptions(data=frames, progress=False), Thresholds(min_mask_iou=1.01))
    assert not strict["passed"]  # the gate is enforced


def test_a_classifier_is_still_judged_by_top1(tmp_path: Path) -> None:
    fp32 = make_conv_model(tmp_path / "conv.onnx")
    frames = make_frames(tmp_path / "f.npz", 24)
    report = validate_models(fp32, fp32, ValidateOptions(data=frames, progress=False), Thresholds())
    assert report["task"] == "classify"
    assert report["classification"]["top1_agreement"] == 1.0
    assert report["dense"] is None


def test_a_detector_is_judged_by_matched_boxes(tmp_path: Path) -> None:
    from detect_models import make_detector

    from edged.tools.frames import save_frames

    model = make_detector(tmp_path / "det.onnx", "yolov8")
    frames = np.zeros((6, 64, 64, 3), np.uint8)
    frames[:, 8:40, 8:24] = 255  # a bright box the detector reports
    data = save_frames(tmp_path / "f.npz", frames)
    # a toy head has few anchors, so --task says what it is (auto knows real ones: [1, 84, 8400], ...)
    report = validate_models(model, model, ValidateOptions(data=data, progress=False, task="detect"), Thresholds())
    assert report["task"] == "detect"
    det = report["detection"]
    assert det["reference_detections"] > 0
    assert det["precision"] == det["recall"] == 1.0
    assert "detection recall >=" in [c["check"] for c in report["checks"]]
    assert report["passed"]


def test_a_candidate_whose_outputs_the_decoder_refuses_fails_its_gate_and_says_why() -> None:
    """An int8 YOLO head that mixes ranges can give scores past 1, which the daemon's decoder refuses (no silent
    garbage): the judge counts those frames as refused, the candidate fails, and nothing raises (it used to
    end `edged quantize` with a traceback)."""
    from edged.tools.validate import detector_for, judge

    rng = np.random.default_rng(0)
    head = np.zeros((1, 7, 64), np.float32)
    head[0, :2] = rng.uniform(8, 24, (2, 64))  # cx, cy
    head[0, 2:4] = rng.uniform(4, 8, (2, 64))  # w, h
    head[0, 4:] = rng.uniform(0, 1, (3, 64))  # class scores
    broken = head.copy()
    broken[0, 4, :4] = 1.3  # what one int8 scale for pixels and scores made of them
    decode = detector_for(["output0"], [[1, 7, 64]], {}, (32, 32))
    verdict = judge(["output0"], [[head]] * 3, [[head], [broken], [broken]],
                    ValidateOptions(data=Path(), progress=False, task="detect"), Thresholds(), decode)  # fmt: skip
    assert verdict["task"] == "detect"
    assert verdict["detection"]["refused_frames"] == 2
    assert "outside 0..1" in verdict["detection"]["refused_why"]
    assert not verdict["passed"]
    assert any(c["check"] == "frames the decoder refuses <=" and not c["passed"] for c in verdict["checks"])


def test_a_box_that_only_crossed_the_score_threshold_is_not_counted_lost() -> None:
    """fp32 keeps a box at 0.27, int8 has it at 0.24 under the 0.25 threshold: a rounding, not a loss. A box
    lost at 0.9 counts."""
    from edged.tools.validate import BoxJudge, _detection

    def box(score: float, x: float = 0.0) -> dict[str, object]:
        return {"label": "face", "box": [x, 0.0, x + 10.0, 10.0], "score": score}

    frames = {"ref": [box(0.9), box(0.27, 50.0), box(0.8, 100.0)], "int8": [box(0.88), box(0.26, 200.0)]}
    judge = BoxJudge(lambda outputs: frames[str(outputs[0])], threshold=0.25)
    got = _detection([["ref"]], [["int8"]], judge)  # type: ignore[list-item]
    assert (got["matched"], got["borderline"]) == (1, 2)  # 0.27 lost and 0.26 extra: both at the threshold
    assert got["recall"] == pytest.approx(1 / 2)  # the box lost at 0.8 still counts
    assert got["precision"] == 1.0
    assert got["recall_strict"] == pytest.approx(1 / 3)
    unknown = _detection([["ref"]], [["int8"]], BoxJudge(judge.decode, threshold=None))  # type: ignore[list-item]
    assert (unknown["borderline"], unknown["recall"]) == (0, pytest.approx(1 / 3))
