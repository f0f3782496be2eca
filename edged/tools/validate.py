"""`edged validate REFERENCE CANDIDATE --data SOURCE`: does the int8 model still say what the fp32 one said?

Both models run on the same held-out frames through the same preprocessing (the reference model's, from
its metadata or the flags). Runtimes, providers and precisions never give bit-identical outputs, so the gate
is on agreement, not on equality, and by what the output serves: a classifier by top-1 agreement and the
cosine of its scores; a detector by matched boxes; a dense map (segmentation, a text detector's probability
map) by the IoU of its masks and its per-pixel error; anything else by cosine. The cosine of a dense map
says little: a text map whose masks agree to 0.96 IoU with 0.6% mean pixel error has a cosine of 0.97,
because most of its pixels are near zero and the few text pixels carry the norm. The report shows where the
models differ.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from edged.core.errors import EdgedError, ModelError, ToolError
from edged.model.preprocess import METADATA_KEY, Preprocessor
from edged.model.session import CPU, LoadedModel
from edged.model.settings import PreprocessConfig
from edged.tools.common import open_model, resolve_preprocessor, stdout_console
from edged.tools.frames import Tensor, describe, load_inputs
from edged.tools.progress import progress_bar

log = logging.getLogger(__name__)

IDENTICAL_NOTE = (
    "Runtimes, providers and precisions never give bit-identical results (different kernels, fused "
    "operators, summation order, int8 rounding): judge by agreement, not equality."
)


@dataclass(frozen=True)
class Thresholds:
    """Gates; a None threshold is reported but not enforced."""

    min_top1: float | None = 0.95
    min_topk: float | None = None
    min_cosine: float | None = 0.98
    min_mask_iou: float | None = 0.9  # dense maps: IoU of the thresholded masks
    max_pixel_error: float | None = 0.02  # dense maps: mean absolute error per pixel, as a share of the map's range
    min_detection_match: float | None = 0.9  # detectors: precision and recall of the candidate's boxes
    max_keypoint_error: float | None = 0.05  # keypoints of matched boxes: mean distance / the box's diagonal
    max_abs: float | None = None
    require_allclose: bool = False


@dataclass(frozen=True)
class ValidateOptions:
    """What to compare and how."""

    data: Path
    limit: int | None = 500
    top_k: int = 5
    rtol: float = 1e-3
    atol: float = 1e-3
    task: str = "auto"  # auto | classify | detect | dense | raw
    mask_threshold: float = 0.5  # dense maps: a pixel is "on" above this
    ref_provider: str = CPU
    provider: str = CPU
    preprocess: PreprocessConfig | None = None
    postprocess: Any = None  # the pipeline's postprocess section (--config): the judge is the daemon's decode
    progress: bool = True


def validate_models(ref: Path, cand: Path, opts: ValidateOptions, gates: Thresholds) -> dict[str, Any]:
    """Run both models on the frames and return the report; `report["passed"]` is the gate's verdict."""
    with open_model(ref, opts.ref_provider) as a, open_model(cand, opts.provider) as b:
        _check_compatible(a, b)
        pre = pair_preprocessor(a, b, opts.preprocess, opts.data)
        inputs = load_inputs(opts.data, pre, a.input_shape, opts.limit)
        outs_a, outs_b = _run_both(a, b, inputs, opts.progress)
        shapes = [list(o.shape) for o in a.session.get_outputs()]
        task, detector = task_judge(opts, a.output_names, shapes, a.metadata, pre.spec.size, outs_a[0])
        opts = replace(opts, task=task)
        report: dict[str, Any] = {
            "reference": {"path": str(ref), "provider": a.provider, "sha256": a.sha256},
            "candidate": {"path": str(cand), "provider": b.provider, "sha256": b.sha256},
            "data": {"source": str(opts.data), "kind": describe(opts.data), "frames": len(inputs)},
            **judge(a.output_names, outs_a, outs_b, opts, gates, detector),
            "note": IDENTICAL_NOTE,
        }
    _name_classes(report.get("classification"), a.metadata)
    return report


def _name_classes(cls: dict[str, Any] | None, metadata: dict[str, str]) -> None:
    """Disagreements with the model's labels beside the class indices."""
    from edged.model.postprocess import load_labels  # noqa: PLC0415

    labels = load_labels(None, metadata)
    if cls is None or not labels:
        return
    for d in cls["disagreeing_frames"]:
        for side in ("reference", "candidate"):
            index = d[side]
            d[f"{side}_label"] = labels[index] if 0 <= index < len(labels) else str(index)


Detector = Callable[[list[Tensor]], list[dict[str, Any]]]
BORDERLINE = 0.05  # a detection scoring within this of the decoder's score threshold can fall either side by rounding


@dataclass(frozen=True)
class BoxJudge:
    """A detector for judging: the decoder's detections, and the score threshold it keeps them at (None when
    unknown), so that a detection that only crossed the threshold by rounding is not counted as lost."""

    decode: Detector
    threshold: float | None

    def __call__(self, outputs: list[Tensor]) -> list[dict[str, Any]]:
        return self.decode(outputs)


ClassMapper = Callable[[list[Tensor]], tuple[npt.NDArray[np.int64], bool]]  # segment: (class map, one-class?)


def judge(  # noqa: PLR0917  (both models' outputs and how to judge them)
    names: list[str],
    outs_a: list[list[Tensor]],
    outs_b: list[list[Tensor]],
    opts: ValidateOptions,
    gates: Thresholds,
    detector: Detector | ClassMapper | None = None,
) -> dict[str, Any]:
    """Compare two models' outputs on the same frames by the task the first output serves: `task`,
    `classification` or `dense` (the measures of that task), `outputs` (errors and cosine per output),
    `checks` (the gates) and `passed`. Used by validate and by quantize's recipe search."""
    if [np.asarray(x).shape for x in outs_b[0]] != [np.asarray(x).shape for x in outs_a[0]]:
        raise ToolError("the models' outputs differ in shape; they are not two versions of one model")
    task = output_task(np.asarray(outs_a[0][0]).shape, opts.task)
    first_a, first_b = _stack(outs_a, 0), _stack(outs_b, 0)
    parts: dict[str, Any] = {
        "task": task,
        "classification": _classification(first_a, first_b, opts.top_k) if task == "classify" else None,
        "dense": _dense(first_a, first_b, opts.mask_threshold) if task == "dense" else None,
        "detection": _detection(outs_a, outs_b, detector) if task == "detect" and detector is not None else None,  # type: ignore[arg-type]
        "segmentation": _segmentation(outs_a, outs_b, detector) if task == "segment" and detector else None,  # type: ignore[arg-type]
        "outputs": [_compare(name, _stack(outs_a, i), _stack(outs_b, i), opts) for i, name in enumerate(names)],
    }
    parts["checks"] = _checks(parts, gates)
    parts["passed"] = all(c["passed"] for c in parts["checks"])
    return parts


def output_task(shape: tuple[int, ...], task: str = "auto") -> str:
    """What an output serves, from its shape (one frame's): `detect` for a YOLO-style head or ready boxes,
    `classify` for class scores ([1, C] or [1, C, 1, 1], C > 1), `dense` for a map with spatial axes
    ([N, C, H, W] with H, W > 1: segmentation, probability maps), else `raw`. A `task` other than auto wins."""
    if task != "auto":
        return task
    dims = [d for d in shape[1:] if d != 1] if len(shape) > 1 else list(shape)
    if len(shape) == 3 and min(shape[1:]) >= 5 and (max(shape[1:]) >= 1000 >= min(shape[1:]) - 5 or shape[2] in (6, 7)):
        return "detect"  # a YOLO head ([1, 4 + nc, N] or [1, N, 5 + nc], N anchors) or ready boxes [1, N, 6]
    if len(shape) >= 4 and sum(1 for d in shape[-2:] if d > 1) == 2:
        return "dense"  # rank 3 ([1, N, 6] boxes, [1, 84, 8400] YOLO heads) is not a map: --task dense forces it
    if len(dims) == 1 and dims[0] > 1:
        return "classify"
    return "raw"


def task_judge(  # noqa: PLR0917  (the model's outputs as the daemon's decoder sees them)
    opts: ValidateOptions,
    names: list[str],
    shapes: list[list[Any]],
    metadata: dict[str, str],
    input_size: tuple[int, int],
    sample: list[Tensor],
) -> tuple[str, Detector | ClassMapper | None]:
    """(task, decoder): with the pipeline's postprocess (`--config`), its own decoder is the judge (a
    detector's boxes gate, a segmenter's class maps; other outputs are reported only); otherwise the task
    comes from the first output's shape and a detector is judged with `detect`'s defaults, when they can read
    the model."""
    if opts.postprocess is not None:
        return _pipeline_judge(opts.postprocess, names, shapes, metadata, input_size)
    task = output_task(tuple(np.asarray(sample[0]).shape), opts.task)
    if task != "detect":
        return task, None
    try:
        detector = detector_for(names, shapes, metadata, input_size)
        detector(sample)
    except EdgedError as exc:
        log.info("judging by the outputs' cosine: detect's defaults cannot read this model (%s)", exc)
        return "raw", None
    return task, detector


def _pipeline_judge(
    post: Any, names: list[str], shapes: list[list[Any]], metadata: dict[str, str], input_size: tuple[int, int]
) -> tuple[str, Detector | ClassMapper | None]:
    """The judge from the pipeline's own postprocess section."""
    from edged.model.postprocess import CLASSES, RAW, SEGMENTS, make_postprocessor, produces  # noqa: PLC0415

    kind = produces(post)
    if kind == CLASSES:
        return "classify", None
    if kind == RAW:
        return "raw", None
    decode = make_postprocessor(post, names, shapes, metadata, input_size)
    if kind == SEGMENTS:  # its class maps are judged
        class_map = getattr(decode, "class_map", None)
        return ("segment", class_map) if callable(class_map) else ("raw", None)
    return "detect", BoxJudge(lambda outputs: list(decode(outputs)["detections"]), _threshold(post))


def detector_for(
    names: list[str], shapes: list[list[Any]], metadata: dict[str, str], input_size: tuple[int, int]
) -> Detector:
    """The daemon's own detect postprocessing (defaults, the model's labels), for judging detectors."""
    from edged.model.decoders.detect import DetectConfig, make_detect  # noqa: PLC0415

    cfg = DetectConfig(type="detect")
    post = make_detect(cfg, names, shapes, metadata, input_size)
    return BoxJudge(lambda outputs: list(post(outputs)["detections"]), cfg.score_threshold)


def _threshold(post: Any) -> float | None:
    """The score threshold a decoder keeps detections at (its `score_threshold`), when it has one."""
    value = getattr(post, "score_threshold", None)
    return float(value) if isinstance(value, int | float) else None


def _detection(outs_a: list[list[Tensor]], outs_b: list[list[Tensor]], detector: Detector) -> dict[str, Any]:
    """Detections of both models matched per frame (same label, IoU >= 0.5, best score first): precision and
    recall of the candidate against the reference, and how far matched scores drift. A detection left unmatched
    whose score is within BORDERLINE of the decoder's threshold is not counted either way (`borderline`): it
    sits where any rounding moves it across, and the other model may well have it just under the threshold;
    `precision_strict` and `recall_strict` count it."""
    threshold = getattr(detector, "threshold", None)
    near = (lambda d: float(d["score"]) < threshold + BORDERLINE) if threshold is not None else (lambda _d: False)
    matched = ref_total = cand_total = ref_borderline = cand_borderline = 0
    drift: list[float] = []
    point_errors: list[float] = []
    refused: list[str] = []  # the candidate's frames the decoder refuses (the daemon would publish nothing)
    for a, b in zip(outs_a, outs_b, strict=True):
        ref, cand = detector(a), _decoded(detector, b, refused)
        ref_total, cand_total = ref_total + len(ref), cand_total + len(cand)
        free = list(range(len(ref)))
        for c in sorted(cand, key=lambda d: -float(d["score"])):
            best = max(
                (i for i in free if ref[i]["label"] == c["label"]),
                key=lambda i: box_iou(ref[i]["box"], c["box"]),
                default=None,
            )
            if best is not None and box_iou(ref[best]["box"], c["box"]) >= 0.5:
                free.remove(best)
                matched += 1
                drift.append(abs(float(c["score"]) - float(ref[best]["score"])))
                point_errors.extend(keypoint_errors(ref[best], c))
            elif near(c):
                cand_borderline += 1
        ref_borderline += sum(1 for i in free if near(ref[i]))
    ref_counted, cand_counted = ref_total - ref_borderline, cand_total - cand_borderline
    return {
        "reference_detections": ref_total,
        "candidate_detections": cand_total,
        "matched": matched,
        "precision": matched / cand_counted if cand_counted else 1.0,
        "recall": matched / ref_counted if ref_counted else 1.0,
        "borderline": ref_borderline + cand_borderline,  # unmatched, within BORDERLINE of the threshold
        "precision_strict": matched / cand_total if cand_total else 1.0,
        "recall_strict": matched / ref_total if ref_total else 1.0,
        "score_drift_mean": float(np.mean(drift)) if drift else 0.0,
        "keypoint_error": float(np.mean(point_errors)) if point_errors else None,
        "refused_frames": len(refused),
        "refused_why": refused[0] if refused else None,
    }


def _decoded(detector: Detector, outputs: list[Tensor], refused: list[str]) -> list[dict[str, Any]]:
    """The candidate's detections on one frame; none when the decoder refuses its outputs (a quantized head's
    scores past 1, boxes out of order: the daemon refuses that frame's result), noted in `refused`."""
    try:
        return detector(outputs)
    except ModelError as exc:
        refused.append(str(exc).splitlines()[0][:300])
        return []


def keypoint_errors(ref: dict[str, Any], cand: dict[str, Any]) -> list[float]:
    """Each keypoint's distance between two matched detections, as a share of the reference box's diagonal."""
    a, b = ref.get("keypoints"), cand.get("keypoints")
    if not a or not b or len(a) != len(b):
        return []
    x1, y1, x2, y2 = ref["box"]
    diagonal = max(float(np.hypot(x2 - x1, y2 - y1)), 1e-6)
    distances = np.hypot(*(np.asarray(a, np.float64) - np.asarray(b, np.float64)).T) / diagonal
    return [float(d) for d in distances]


def _segmentation(outs_a: list[list[Tensor]], outs_b: list[list[Tensor]], mapper: ClassMapper) -> dict[str, Any]:
    """Both models' class maps per frame: the mean over the classes either shows (a one-class map's off pixels
    aside) of each class's IoU; both empty agree."""
    ious: list[float] = []
    for a, b in zip(outs_a, outs_b, strict=True):
        (map_a, one_class), (map_b, _) = mapper(a), mapper(b)
        present = set(np.unique(map_a).tolist()) | set(np.unique(map_b).tolist())
        per_class = [
            float(((map_a == c) & (map_b == c)).sum() / ((map_a == c) | (map_b == c)).sum())
            for c in sorted(present)
            if not (one_class and c == 0)
        ]
        ious.append(float(np.mean(per_class)) if per_class else 1.0)
    return {
        "mask_iou_mean": float(np.mean(ious)),
        "mask_iou_min": float(np.min(ious)),
        "worst_frame": int(np.argmin(ious)),
    }


def box_iou(a: list[float], b: list[float]) -> float:
    """Intersection over union of two x1, y1, x2, y2 boxes (0 when they have no area)."""
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def _dense(ref: npt.NDArray[np.float64], cand: npt.NDArray[np.float64], threshold: float) -> dict[str, Any]:
    """Maps per frame: IoU of the masks above `threshold`, and how many pixels agree on either side."""
    mask_a, mask_b = ref > threshold, cand > threshold
    inter = (mask_a & mask_b).sum(axis=1)
    union = (mask_a | mask_b).sum(axis=1)
    iou = np.where(union > 0, inter / np.where(union > 0, union, 1), 1.0)  # both empty: they agree
    return {
        "threshold": threshold,
        "mask_iou_mean": float(iou.mean()),
        "mask_iou_min": float(iou.min()),
        "worst_frame": int(iou.argmin()),
        "pixel_agreement": float((mask_a == mask_b).mean()),
        "pixel_error": float(np.abs(ref - cand).mean() / span) if (span := float(np.ptp(ref))) > 0 else 0.0,
        "reference_on_fraction": float(mask_a.mean()),
    }


def _check_compatible(a: LoadedModel, b: LoadedModel) -> None:
    if a.output_names != b.output_names:
        raise ToolError(f"the models have different outputs: {a.output_names} vs {b.output_names}")
    if a.input_type != b.input_type:
        raise ToolError(f"the models take different input types: {a.input_type} vs {b.input_type}")


def pair_preprocessor(a: LoadedModel, b: LoadedModel, overrides: PreprocessConfig | None, data: Path) -> Preprocessor:
    """The reference's preprocessing; the candidate's when the reference cannot tell (e.g. dynamic fp32 axes)."""
    try:
        return resolve_preprocessor(overrides, a.metadata, a.input_shape, a.input_type)
    except EdgedError as first:
        if METADATA_KEY in b.metadata:
            log.info("using the candidate's %s metadata (%s)", METADATA_KEY, first)
            return resolve_preprocessor(overrides, b.metadata, b.input_shape, b.input_type)
        try:
            return resolve_preprocessor(overrides, a.metadata, a.input_shape, a.input_type, data)
        except EdgedError:
            raise ToolError(f"{first}; give --preprocess '{{\"size\": [W, H]}}'") from first


def _run_both(
    a: LoadedModel, b: LoadedModel, inputs: list[Tensor], progress: bool
) -> tuple[list[list[Tensor]], list[list[Tensor]]]:
    outs_a: list[list[Tensor]] = []
    outs_b: list[list[Tensor]] = []
    with progress_bar("validating", len(inputs), enabled=progress) as advance:
        for x in inputs:
            outs_a.append(a.run(x))
            outs_b.append(b.run(x))
            advance(1)
    return outs_a, outs_b


def _stack(outs: list[list[Tensor]], i: int) -> npt.NDArray[np.float64]:
    """Output i of every frame as float64, one row per frame."""
    return np.stack([np.asarray(o[i], dtype=np.float64).reshape(-1) for o in outs])


def _classification(ref: npt.NDArray[np.float64], cand: npt.NDArray[np.float64], k: int) -> dict[str, Any]:
    k = min(k, ref.shape[1])
    top1_a, top1_b = ref.argmax(axis=1), cand.argmax(axis=1)
    agree = top1_a == top1_b
    topk_a = np.argsort(-ref, axis=1)[:, :k]
    topk_b = np.argsort(-cand, axis=1)[:, :k]
    overlap = np.array([len(set(x) & set(y)) / k for x, y in zip(topk_a, topk_b, strict=True)])
    disagree = np.flatnonzero(~agree)
    return {
        "top1_agreement": float(agree.mean()),
        "top_k": k,
        "topk_overlap": float(overlap.mean()),
        "disagreements": int(disagree.size),
        "distinct_top1": int(np.unique(top1_a).size),  # 1: a model that always says the same says little
        "disagreeing_frames": [
            {"frame": int(f), "reference": int(top1_a[f]), "candidate": int(top1_b[f])} for f in disagree[:10]
        ],
    }


def _compare(
    name: str, a: npt.NDArray[np.float64], b: npt.NDArray[np.float64], opts: ValidateOptions
) -> dict[str, Any]:
    diff = np.abs(a - b)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    dots = np.einsum("ij,ij->i", a, b)
    cosine = np.where(norms > 0, dots / np.where(norms > 0, norms, 1.0), np.where(diff.max(axis=1) == 0, 1.0, 0.0))
    worst_frame, worst_index = np.unravel_index(int(diff.argmax()), diff.shape)
    close = np.isclose(b, a, rtol=opts.rtol, atol=opts.atol)
    ref_range = float(a.max() - a.min()) if a.size else 0.0
    return {
        "name": name,
        "max_abs_error": float(diff.max()),
        "mean_abs_error": float(diff.mean()),
        "p99_abs_error": float(np.percentile(diff, 99)),
        "reference_range": ref_range,
        "cosine_mean": float(cosine.mean()),
        "cosine_min": float(cosine.min()),
        "worst_cosine_frame": int(cosine.argmin()),
        "max_error_at": {"frame": int(worst_frame), "index": int(worst_index)},
        "allclose": bool(close.all()),
        "allclose_fraction": float(close.mean()),
        "rtol": opts.rtol,
        "atol": opts.atol,
    }


def _checks(report: dict[str, Any], gates: Thresholds) -> list[dict[str, Any]]:
    checks: list[dict[str, Any]] = []

    def add(what: str, value: float | bool, limit: float | bool, ok: bool) -> None:
        checks.append({"check": what, "value": value, "threshold": limit, "passed": bool(ok)})

    _task_checks(report, gates, add)
    judged = _judged_by_task(report)
    for i, out in enumerate(report["outputs"]):
        if gates.min_cosine is not None and i not in judged:
            add(
                f"{out['name']}: mean cosine >=",
                out["cosine_mean"],
                gates.min_cosine,
                out["cosine_mean"] >= gates.min_cosine,
            )
        if gates.max_abs is not None:
            add(
                f"{out['name']}: max abs error <=",
                out["max_abs_error"],
                gates.max_abs,
                out["max_abs_error"] <= gates.max_abs,
            )
        if gates.require_allclose:
            add(f"{out['name']}: allclose", out["allclose"], True, out["allclose"])
    return checks


def _task_checks(report: dict[str, Any], gates: Thresholds, add: Callable[[str, Any, Any, bool], None]) -> None:
    """The gates of the task's own measures: top-1 (top-k), matched boxes, masks and pixel error."""
    cls = report["classification"]
    if cls is not None and gates.min_top1 is not None:
        add("top-1 agreement >=", cls["top1_agreement"], gates.min_top1, cls["top1_agreement"] >= gates.min_top1)
    if cls is not None and gates.min_topk is not None:
        add(
            f"top-{cls['top_k']} overlap >=", cls["topk_overlap"], gates.min_topk, cls["topk_overlap"] >= gates.min_topk
        )
    det = report.get("detection")
    if det is not None and gates.min_detection_match is not None:
        limit = gates.min_detection_match
        add("detection precision >=", det["precision"], limit, det["precision"] >= limit)
        add("detection recall >=", det["recall"], limit, det["recall"] >= limit)
    if det is not None and det.get("refused_frames"):  # the daemon would publish nothing for these frames
        add("frames the decoder refuses <=", det["refused_frames"], 0, False)
    if det is not None and det.get("keypoint_error") is not None and gates.max_keypoint_error is not None:
        limit, value = gates.max_keypoint_error, det["keypoint_error"]
        add("keypoint error (share of box) <=", value, limit, value <= limit)
    dense = report.get("dense") or report.get("segmentation")
    if dense is not None and gates.min_mask_iou is not None:
        limit = gates.min_mask_iou
        add("mask IoU (mean) >=", dense["mask_iou_mean"], limit, dense["mask_iou_mean"] >= limit)
    if dense is not None and "pixel_error" in dense and gates.max_pixel_error is not None:
        limit = gates.max_pixel_error
        add("pixel error (share of range) <=", dense["pixel_error"], limit, dense["pixel_error"] <= limit)


def _judged_by_task(report: dict[str, Any]) -> set[int]:
    """The outputs a task measure gates instead of cosine: every output a detector reads (its boxes are
    judged), the first output of a dense map (its masks and pixel error are). Class scores keep the cosine
    gate: the published score comes from them."""
    if report.get("detection") is not None:
        return set(range(len(report["outputs"])))
    return {0} if report.get("dense") is not None or report.get("segmentation") is not None else set()


def render_validate(report: dict[str, Any], *, wide: bool = False) -> None:
    """Print agreement, per-output errors, the checks and the verdict (80 columns; `wide`: every figure)."""
    console = stdout_console()
    ref, cand = report["reference"], report["candidate"]
    console.print(
        f"reference {ref['path']} ({ref['provider']})\ncandidate {cand['path']} ({cand['provider']})\n"
        f"{report['data']['frames']} frame(s) from {report['data']['source']} ({report['data']['kind']})"
    )
    cls = report["classification"]
    if cls is not None:
        console.print(
            f"top-1 agreement {cls['top1_agreement']:.2%} ({cls['disagreements']} frame(s) differ), "
            f"top-{cls['top_k']} overlap {cls['topk_overlap']:.2%}; the reference chose "
            f"{cls['distinct_top1']} distinct class(es)"
        )
        for d in cls["disagreeing_frames"]:
            ref_says = d.get("reference_label", d["reference"])
            cand_says = d.get("candidate_label", d["candidate"])
            console.print(f"  frame {d['frame']}: reference says {ref_says}, candidate {cand_says}")
    det = report.get("detection")
    if det is not None:
        console.print(
            f"detections: {det['matched']} matched (same label, IoU >= 0.5) of {det['reference_detections']} "
            f"reference / {det['candidate_detections']} candidate: precision {det['precision']:.2%}, recall "
            f"{det['recall']:.2%}, score drift {det['score_drift_mean']:.4f}"
            + (
                f"; {det['borderline']} unmatched within {BORDERLINE} of the score threshold not counted (counting "
                f"them: precision {det['precision_strict']:.2%}, recall {det['recall_strict']:.2%})"
                if det.get("borderline")
                else ""
            )
            + (f", keypoints off by {det['keypoint_error']:.2%} of the box" if det.get("keypoint_error") else "")
        )
    dense = report.get("dense")
    if dense is not None:
        console.print(
            f"dense map: mask IoU {dense['mask_iou_mean']:.2%} mean, {dense['mask_iou_min']:.2%} worst (frame "
            f"{dense['worst_frame']}); {dense['pixel_agreement']:.2%} of pixels agree at threshold "
            f"{dense['threshold']:g}; mean pixel error {dense['pixel_error']:.2%} of the range"
        )
    seg = report.get("segmentation")
    if seg is not None:
        console.print(
            f"segmentation: class-map IoU {seg['mask_iou_mean']:.2%} mean, {seg['mask_iou_min']:.2%} worst "
            f"(frame {seg['worst_frame']})"
        )
    console.print(_output_table(report["outputs"], wide=wide))
    console.print(f"[dim]{report['note']}[/]")
    for c in report["checks"]:
        mark = "[green]PASS[/]" if c["passed"] else "[red]FAIL[/]"
        value = c["value"] if isinstance(c["value"], bool) else f"{c['value']:.5g}"
        console.print(f"{mark} {c['check']} {c['threshold']}: {value}")
    console.print("[bold green]passed[/]" if report["passed"] else "[bold red]FAILED[/]: exit 1")


def _output_table(outputs: list[dict[str, Any]], *, wide: bool) -> Any:
    """Per-output errors: five columns that fit 80, or every figure with `wide` (`--wide`)."""
    from rich.table import Table  # noqa: PLC0415

    cols = ["output", "max abs err", "cosine mean", "cosine min (frame)", "allclose"]
    if wide:
        cols[2:2] = ["(frame, index)", "mean abs err", "p99 abs err", "ref range"]
    table = Table(title="per output", title_justify="left", header_style="bold")
    for col in cols:
        table.add_column(col, justify="left" if col == "output" else "right", overflow="fold")
    for o in outputs:
        at = o["max_error_at"]
        cells = {
            "output": o["name"],
            "max abs err": f"{o['max_abs_error']:.4g}",
            "(frame, index)": f"({at['frame']}, {at['index']})",
            "mean abs err": f"{o['mean_abs_error']:.4g}",
            "p99 abs err": f"{o['p99_abs_error']:.4g}",
            "ref range": f"{o['reference_range']:.4g}",
            "cosine mean": f"{o['cosine_mean']:.5f}",
            "cosine min (frame)": f"{o['cosine_min']:.5f} ({o['worst_cosine_frame']})",
            "allclose": f"{o['allclose_fraction']:.1%}"
            + (f" (rtol={o['rtol']:g}, atol={o['atol']:g})" if wide else ""),
        }
        table.add_row(*(cells[c] for c in cols))
    return table
