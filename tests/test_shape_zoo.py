"""The shape zoo (tests/shape_zoo.py) through every decoder: check-config and run agree on each pairing, the
right pairings are accepted, and whatever is accepted never publishes anything out of range (a label beyond
the configured ones, a box off the frame or inside out, a score outside 0..1), on noise, black, white and
colour frames; a frame whose outputs do not fit is refused, not published."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import base_config, write_config
from shape_zoo import DECODERS, FAMILIES, LABELS, RIGHT, SIZE, make_model

from edged.config import load_config
from edged.core.errors import ModelError, RefusedResultError
from edged.model.preprocess import Preprocessor
from edged.pipeline.model import check_pipeline_model, prepare_model
from edged.pipeline.worker import decode

FRAME = (48, 40)  # w, h: not the model's square, so every box goes through the frame's geometry
CASES = [(f, nhwc, dynamic) for f in FAMILIES for nhwc in (False, True) for dynamic in (False, True)]


def frames() -> list[np.ndarray]:
    w, h = FRAME
    rng = np.random.default_rng(7)
    red = np.zeros((h, w, 3), np.uint8)
    red[..., 2] = 255
    half = np.zeros((h, w, 3), np.uint8)
    half[:, : w // 2] = (0, 255, 0)
    noise = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    return [noise, np.zeros((h, w, 3), np.uint8), np.full((h, w, 3), 255, np.uint8), red, half]


def in_range(decoder: str, result: dict[str, Any]) -> list[str]:
    """What the result holds that must never be published."""
    wrong: list[str] = []
    labels = DECODERS[decoder].get("labels")
    w, h = FRAME
    for d in result.get("detections", []):
        x1, y1, x2, y2 = d["box"]
        if not (0 <= x1 <= x2 <= w and 0 <= y1 <= y2 <= h):
            wrong.append(f"box {d['box']} off the {w}x{h} frame or inside out")
        if not 0.0 <= d["score"] <= 1.0:
            wrong.append(f"score {d['score']}")
        if labels is not None and d["label"] not in labels:
            wrong.append(f"label {d['label']!r}")
    top = result.get("top", [])
    wrong += [f"class {t}" for t in top if t["label"] not in (labels or []) or not 0.0 <= t["score"] <= 1.0]
    segments = result.get("segments", [])
    wrong += [
        f"segment {s['label']!r}" for s in segments if s["label"] not in (labels or []) or not 0 <= s["area"] <= 1
    ]
    return wrong


@pytest.mark.parametrize(
    ("family", "nhwc", "dynamic"),
    CASES,
    ids=[f"{f}-{'nhwc' if n else 'nchw'}-{'dyn' if d else 'fixed'}" for f, n, d in CASES],
)
def test_every_decoder_on_every_layout_agrees_with_check_config_and_publishes_nothing_out_of_range(
    tmp_path: Path, family: str, nhwc: bool, dynamic: bool
) -> None:
    model = make_model(tmp_path / f"{family}.onnx", family, nhwc=nhwc, dynamic=dynamic)
    pre = {"size": [SIZE, SIZE], "resize": "stretch", "color": "rgb", "scale": 1 / 255}
    pre["layout"] = "nhwc" if nhwc else "nchw"
    accepted = set()
    for decoder, post in DECODERS.items():
        data = base_config(tmp_path, model, "/dev/video9")
        data["pipelines"][0].update(preprocess=pre, postprocess=post)
        cfg = load_config(write_config(tmp_path / "edged.yaml", data))
        pipeline = cfg.pipelines[0].model_copy(update={"frame_size": FRAME})
        problem = check_pipeline_model(pipeline, cfg.state_dir)
        if problem is not None:  # run refuses it the same way
            with pytest.raises(ModelError):
                prepare_model(pipeline, cfg.state_dir, cores=1)
            continue
        prepared = prepare_model(pipeline, cfg.state_dir, cores=1)  # check-config took it: run takes it too
        accepted.add(decoder)
        assert isinstance(prepared.pre, Preprocessor)
        for frame in frames():
            outputs = prepared.loaded.run(prepared.pre(frame))
            try:
                result = decode(prepared, outputs, prepared.pre.geometry(*FRAME))
            except RefusedResultError:
                continue  # refused on this frame: counted and reported by the worker, never published
            assert not in_range(decoder, result), f"{decoder} would publish {in_range(decoder, result)}"
    assert "raw" in accepted  # raw reads anything
    if family in RIGHT:
        assert RIGHT[family] in accepted, f"{family} is {RIGHT[family]}'s layout: refused"
    if family in ("regression_nhwc", "ssd_raw", "heads"):
        assert not accepted & {"detect", "detr", "centernet", "gfl"}, f"{family} read as boxes by {accepted}"


def test_the_right_pairings_decode_as_a_plain_numpy_reading_of_the_outputs(tmp_path: Path) -> None:
    """Right pairings decode exactly: classify's best class is the logits' argmax; a decoded-boxes model's rows
    above the threshold are published as given, scaled from the 32x32 input to the 48x40 frame (stretch)."""
    grey = np.full((FRAME[1], FRAME[0], 3), 100, np.uint8)  # the constants x 0.89: scores stay 0..1
    pre = {"size": [SIZE, SIZE], "resize": "stretch", "color": "rgb", "scale": 1 / 255}
    for family, decoder in (("classes", "classify"), ("boxes6", "detect")):
        data = base_config(
            tmp_path, make_model(tmp_path / f"{family}.onnx", family, nhwc=False, dynamic=False), "/dev/video9"
        )
        data["pipelines"][0].update(preprocess=pre, postprocess={**DECODERS[decoder], "max_detections": 100})
        if decoder == "classify":
            del data["pipelines"][0]["postprocess"]["max_detections"]
        cfg = load_config(write_config(tmp_path / "edged.yaml", data))
        prepared = prepare_model(cfg.pipelines[0], cfg.state_dir, cores=1)
        assert isinstance(prepared.pre, Preprocessor)
        (out, *_) = prepared.loaded.run(prepared.pre(grey))
        result = decode(prepared, [out], prepared.pre.geometry(*FRAME))
        if decoder == "classify":
            assert result["top"][0]["index"] == int(np.argmax(out))
            assert result["top"][0]["label"] == LABELS[int(np.argmax(out))]
            continue
        rows = out.reshape(-1, 6)
        kept = rows[rows[:, 4] >= 0.25]
        kept = kept[np.argsort(-kept[:, 4], kind="stable")]
        scale = np.asarray([FRAME[0] / SIZE, FRAME[1] / SIZE] * 2, np.float32)
        boxes = np.clip(kept[:, :4] * scale, 0, [FRAME[0], FRAME[1], FRAME[0], FRAME[1]])
        want = [
            (LABELS[int(r[5])], round(float(r[4]), 4), [round(float(v), 1) for v in b])
            for r, b in zip(kept, boxes, strict=True)
        ]
        got = [(d["label"], d["score"], d["box"]) for d in result["detections"]]
        assert got == want
