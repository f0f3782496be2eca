"""`segment`: semantic segmentation maps of every layout the families export, mapped back through the
letterbox; the judge quantize and validate use; what on_change and Home Assistant make of it. The maps here
are written by hand so each figure is known; the decoder against a real model and its own package's decode
is in test_real_models.py (rembg's U²-Net-p)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import reference_decodes as ref
import third_party as tp
from conftest import base_config, write_config
from jinja2.sandbox import SandboxedEnvironment

from edged.config import config_from_dict
from edged.core.errors import ModelError
from edged.model.decoders.segment import SegmentConfig
from edged.model.postprocess import make_postprocessor
from edged.model.preprocess import Geometry
from edged.pipeline.resultfilter import signature
from edged.tools.common import pipeline_postprocess, preprocess_overrides
from edged.tools.frames import save_frames
from edged.tools.validate import Thresholds, ValidateOptions, validate_models
from edged.uplink.homeassistant import Discovery

LABELS = ["background", "person", "car"]


def scene() -> np.ndarray[Any, Any]:
    """A 64 x 64 class map of a 640 x 480 frame letterboxed into 640 x 640 (8 rows of padding top and bottom,
    in map pixels): a person in the left half of the picture, a car in a corner, background elsewhere."""
    cmap = np.zeros((64, 64), np.int64)
    cmap[8:56, 0:32] = 1  # the person: the whole left half of the picture
    cmap[40:56, 48:64] = 2  # the car: 16 x 16 map pixels at the bottom right
    return cmap


def scores(cmap: np.ndarray[Any, Any], classes: int = 3) -> np.ndarray[Any, Any]:
    """Logits [1, C, H, W] whose argmax is `cmap`."""
    onehot = np.eye(classes, dtype=np.float32)[cmap]  # [H, W, C]
    return np.asarray(onehot.transpose(2, 0, 1)[None] * 4.0 - 2.0, dtype=np.float32)


LETTERBOX = Geometry(width=640, height=480, scale_x=1.0, scale_y=1.0, pad_x=0, pad_y=80)


def decoder(shape: list[Any], **keys: Any) -> Any:
    cfg = SegmentConfig(**({"type": "segment", "labels": LABELS} | keys))
    return make_postprocessor(cfg, ["out"], [shape], {}, (640, 640))


def test_each_layout_gives_the_same_classes_in_frame_pixels() -> None:
    cmap = scene()
    layouts = {
        "nchw": ([1, 3, 64, 64], scores(cmap)),
        "nhwc": ([1, 64, 64, 3], scores(cmap).transpose(0, 2, 3, 1)),
        "class map": ([1, 64, 64], cmap[None]),
    }
    for name, (shape, out) in layouts.items():
        result = decoder(shape)([out], LETTERBOX)
        segs = {s["label"]: s for s in result["segments"]}
        assert set(segs) == {"person", "car"}, name  # background is not reported
        assert segs["person"]["area"] == pytest.approx(0.5), name  # of the picture, not of the padded input
        assert segs["car"]["area"] == pytest.approx(16 * 16 / (64 * 48), abs=1e-5), name  # 5 places
        assert segs["person"]["box"] == [0.0, 0.0, 320.0, 480.0], name  # the padding mapped away
        assert segs["car"]["box"] == [480.0, 320.0, 640.0, 480.0], name
        assert result["frame"] == {"w": 640, "h": 480}
        assert [s["label"] for s in result["segments"]] == ["person", "car"]  # largest first


def test_polygons_outline_each_region_in_frame_pixels() -> None:
    result = decoder([1, 3, 64, 64], polygons=True)([scores(scene())], LETTERBOX)
    car = next(s for s in result["segments"] if s["label"] == "car")
    assert len(car["polygons"]) == 1
    xs, ys = zip(*car["polygons"][0], strict=True)
    assert (min(xs), max(xs), min(ys), max(ys)) == pytest.approx((485, 635, 325, 475))  # pixel centres


def test_a_one_class_map_is_thresholded_after_its_activation() -> None:
    prob = np.full((1, 1, 64, 64), -6.0, np.float32)  # logits: a sigmoid first
    prob[0, 0, 8:56, 0:16] = 6.0
    result = decoder([1, 1, 64, 64], labels=["person"])([prob], LETTERBOX)
    assert [(s["label"], s["class"], s["area"]) for s in result["segments"]] == [("person", 1, 0.25)]
    stretched = np.where(prob > 0, 0.3, 0.1).astype(np.float32)  # below 0.5 until min-max stretched
    assert decoder([1, 1, 64, 64])([stretched], LETTERBOX)["segments"] == []
    found = decoder([1, 1, 64, 64], normalize="minmax", labels=None)([stretched], LETTERBOX)["segments"]
    assert [(s["label"], s["area"]) for s in found] == [("foreground", 0.25)]
    named = decoder([1, 1, 64, 64], labels=["background", "person"])([prob], LETTERBOX)["segments"]
    assert [s["label"] for s in named] == ["person"]  # a [background, X] label list names the class X


def test_classes_and_min_area_choose_what_is_reported() -> None:
    out = [scores(scene())]
    only = decoder([1, 3, 64, 64], classes=["car", 0])(out, LETTERBOX)["segments"]
    assert [s["label"] for s in only] == ["background", "car"]  # asked for by label and by index
    big = decoder([1, 3, 64, 64], min_area=0.1)(out, LETTERBOX)["segments"]
    assert [s["label"] for s in big] == ["person"]  # the car covers 8 % of the frame


@pytest.mark.parametrize(
    "shape",
    [[1, 7600, 10], [1, 22, 2100], [1, 3549, 6], [1, 1000], [1, 3, 1, 64]],
    ids=["picodet head", "yolov8 head", "yolox head", "class scores", "a row"],
)
def test_what_is_not_a_map_is_refused(shape: list[int]) -> None:
    with pytest.raises(ModelError, match=r"segment needs a map"):
        decoder(shape)


def test_a_dynamic_axis_is_checked_on_the_first_output() -> None:
    """An output declared [1, C, h, w] with names for h and w is checked once the sizes are known (check-config's
    synthetic frame), so a detector's head with dynamic axes is refused before the first real frame."""
    post = decoder([1, "c", "n"])
    with pytest.raises(ModelError, match=r"shaped like the 640x640 input"):
        post([np.zeros((1, 22, 2100), np.float32)], LETTERBOX)


def test_on_change_compares_the_classes_seen() -> None:
    a = {"segments": [{"label": "person", "area": 0.5}, {"label": "car", "area": 0.1}]}
    b = {"segments": [{"label": "car", "area": 0.12}, {"label": "person", "area": 0.48}]}
    assert signature(a) == signature(b)  # areas move every frame; the classes present did not change
    assert signature(a) != signature({"segments": [{"label": "person", "area": 0.5}]})


def test_home_assistant_gets_an_area_and_a_presence_per_label(tmp_path: Path) -> None:
    data = base_config(tmp_path, tp.package_dir("rembg") / "u2netp.onnx", "/dev/video9")
    data["pipelines"][0]["postprocess"] = {"type": "segment", "labels": ["person"], "classes": ["person"]}
    data["homeassistant"] = {"enabled": True}
    data["mqtt"]["enabled"] = True  # discovery needs a broker in the config; nothing connects here
    cfg = config_from_dict(data)
    configs = dict(
        Discovery(
            cfg.homeassistant,
            device_id=cfg.device_id,
            pipelines=cfg.pipelines,
            results_topic={"cam0": "r"},
            stats_topic="s",
            availability_topic="a",
        ).configs()
    )
    area = next(c for t, c in configs.items() if t.endswith("cam0_person_area/config"))
    present = next(c for t, c in configs.items() if t.endswith("/cam0_person/config"))
    message = {"result": {"segments": [{"label": "person", "area": 0.25}]}}
    env = SandboxedEnvironment()
    assert env.from_string(area["value_template"]).render(value_json=message).strip() == "25.0"
    assert env.from_string(present["value_template"]).render(value_json=message).strip() == "ON"
    assert env.from_string(present["value_template"]).render(value_json={"result": {"segments": []}}) == "OFF"


def test_validate_judges_a_segmenter_by_its_class_maps(tmp_path: Path) -> None:
    """With --config naming `segment`, validate (and quantize's search) gate on the IoU of the decoded class
    maps; the six side outputs of U²-Net-p are reported, not gated on."""
    model = tp.package_dir("rembg") / "u2netp.onnx"
    data = base_config(tmp_path, model, "/dev/video9")
    data["pipelines"][0]["preprocess"] = {"size": [320, 320], "resize": "stretch", "color": "rgb", **ref.IMAGENET}
    data["pipelines"][0]["postprocess"] = {"type": "segment", "output": ref.U2NETP_FUSED, "normalize": "minmax"}
    config = write_config(tmp_path / "edged.yaml", data)
    frames = np.stack([tp.photo(n)[:300, :400] for n in ref.SALIENT_PHOTOS[:4]])
    opts = ValidateOptions(
        data=save_frames(tmp_path / "photos.npz", frames),
        progress=False,
        preprocess=preprocess_overrides(config, None, None),
        postprocess=pipeline_postprocess(config, None),
    )
    report = validate_models(model, model, opts, Thresholds())
    assert report["task"] == "segment"
    assert report["segmentation"]["mask_iou_mean"] == 1.0
    assert "mask IoU (mean) >=" in [c["check"] for c in report["checks"]]
    assert report["passed"]
