"""`edged quantize MODEL -o OUT --calib SOURCE`: static post-training int8 quantization (QDQ) with ORT.

Default: QDQ format, per-channel int8 weights, signed int8 activations with zero point 0 (symmetric),
MinMax calibration. Symmetric signed int8 everywhere is the only QDQ form TensorRT's explicit quantization
accepts, and TensorRT comes first in edged's provider list (Jetson); the CPU provider runs it too. On an
x86 CPU with VNNI, uint8 activations (U8S8, `--activation-type uint8`) can be faster; that model is then not
for TensorRT.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from edged import __version__
from edged.core.errors import EdgedError, ToolError
from edged.model.postprocess import LABELS_KEY
from edged.model.preprocess import METADATA_KEY, Preprocessor
from edged.model.session import file_sha256, is_quantized
from edged.model.settings import PreprocessConfig
from edged.tools import CALIBRATION_METHODS, QUANT_TYPES, mixed, recipes, sensitivity
from edged.tools.calibration import RangeCache, cache_supported
from edged.tools.common import human_bytes, require_onnx, resolve_preprocessor, stdout_console
from edged.tools.cpu import Cpu
from edged.tools.frames import Tensor, describe, holds_tensors, load_inputs
from edged.tools.graph import input_signature, pin_input_shape, prune_opset_imports, upgrade_opset
from edged.tools.progress import CountingReader, progress_bar
from edged.tools.validate import Thresholds, ValidateOptions, judge, task_judge

log = logging.getLogger(__name__)

QUANTIZED_FROM_KEY = "edged.quantized_from"
QUANTIZATION_KEY = "edged.quantization"
GATES = Thresholds()  # validate's default gates judge every candidate
JUDGE = ValidateOptions(data=Path(), progress=False)


@dataclass(frozen=True)
class QuantizeOptions:
    """What `edged quantize` was asked to do."""

    calib: Path
    method: str = "minmax"
    activation_type: str = "int8"
    weight_type: str = "int8"
    per_channel: bool = True
    reduce_range: bool | None = None  # 7-bit weights; None: when this CPU is x86 without VNNI (see below)
    symmetric_activations: bool | None = None  # None: symmetric for int8, asymmetric for uint8
    calib_limit: int = 256
    shape: tuple[int, ...] | None = None
    preprocess: PreprocessConfig | None = None
    percentile: float = 99.999
    optimize: bool = True
    progress: bool = True
    op_types: tuple[str, ...] | None = None  # quantize only these op types (None: every one)
    exclude_nodes: tuple[str, ...] = ()  # nodes left in float, by name
    search: bool = True  # try the target's candidate recipes, keep what `choose` picks (else: as given)
    recipe: str | None = None  # a recipe by name: no search
    target: str = "auto"  # cpu | tensorrt | auto (what this machine's providers say)
    accept_slower: bool = False  # write the best int8 model even when fp32 is faster here
    search_s: float = 540.0  # the search starts no new mixed-precision step after this (10 min with the rest)
    labels: list[str] | None = None  # written as the model's edged.labels metadata
    postprocess: Any = None  # the pipeline's postprocess section (--config): candidates are judged by its decode
    gates: Thresholds = GATES  # what a candidate must keep (validate's gates; the CLI sets them)

    def judge(self) -> ValidateOptions:
        """How candidates are compared with fp32 (validate's options, the pipeline's decoder)."""
        return replace(JUDGE, postprocess=self.postprocess)


class Int8SlowerError(ToolError):
    """Every int8 candidate that kept the answers was slower than fp32 on this machine; `search` holds the
    measurements (the CLI prints them and exits with EXIT_SLOWER)."""

    def __init__(self, message: str, search: dict[str, Any]) -> None:
        super().__init__(message)
        self.search = search


class NoRecipePassedError(ToolError):
    """No candidate kept the fp32 model's answers; `search` holds each one's speed and how far it missed
    (the CLI prints the table, then the error)."""

    def __init__(self, message: str, search: dict[str, Any]) -> None:
        super().__init__(message)
        self.search = search


EXIT_SLOWER = 3  # `edged quantize`: int8 is slower than fp32 here, nothing written
CALIB_STRIDE = 1  # calibration frames whose activations are held at once (any count divides by it)
MIN_SPEEDUP = 1.05  # int8 must beat fp32 by more than the timing noise of a shared machine to count as faster


def quantize_model(src: Path, out: Path, opts: QuantizeOptions) -> dict[str, Any]:
    """Quantize `src` into `out` and return the report (sizes, what was changed on the way, provenance)."""
    onnx = require_onnx()
    if opts.method not in CALIBRATION_METHODS or {opts.activation_type, opts.weight_type} - set(QUANT_TYPES):
        raise ToolError(f"method must be one of {CALIBRATION_METHODS} and types one of {QUANT_TYPES}")
    src, out = src.resolve(), out.resolve()  # ORT works in a temporary folder (below): no relative paths
    opts = replace(opts, calib=opts.calib.resolve())
    _check_paths(src, out)
    started = time.monotonic()
    notes: list[str] = []
    try:
        model = onnx.load(str(src))
    except Exception as exc:
        raise ToolError(f"{src} is not a readable ONNX model: {exc}") from exc
    metadata = {p.key: p.value for p in model.metadata_props}
    opset_before = _default_opset(model)
    model, upgraded = upgrade_opset(model)
    if upgraded:
        notes.append(upgraded)
    name, shape, input_type = input_signature(model)
    preprocessor = _preprocessor(opts, metadata, list(opts.shape) if opts.shape else shape, input_type)
    inputs = _calibration_inputs(opts, preprocessor, shape)
    pinned = opts.shape or tuple(int(d) for d in inputs[0].shape)
    pin_note = pin_input_shape(model, pinned)
    if pin_note:
        notes.append(pin_note)
    search: dict[str, Any] | None = None
    with tempfile.TemporaryDirectory(prefix="edged-quantize-") as tmp, _quiet_in(Path(tmp)):
        staged = Path(tmp) / "staged.onnx"
        onnx.save(model, str(staged))
        prepared = _named(_pre_process(staged, Path(tmp) / "prepared.onnx", opts.optimize, notes), Path(tmp))
        _check_excluded(prepared, opts.exclude_nodes)
        if opts.recipe is not None:
            opts = with_recipe(opts, recipes.recipe(opts.recipe))
        if opts.search and opts.recipe is None:
            opts, raw, search = _search(src, prepared, name, inputs, opts, Path(tmp), _frame_size(preprocessor, inputs))
        else:
            raw = Path(tmp) / "quantized.onnx"
            _quantize_static(prepared, raw, name, inputs, opts, RangeCache(prepared, name, inputs, Path(tmp)))
        result = onnx.load(str(raw))
    provenance = _provenance(src, opts, len(inputs), opset_before)
    if search is not None:
        _note_search(search, len(inputs), provenance, notes)
    _note_float_activations(result, opts, notes)
    if opts.labels is not None:
        metadata = {**metadata, LABELS_KEY: json.dumps(opts.labels)}
        notes.append(f"wrote {len(opts.labels)} labels into the {LABELS_KEY} metadata")
    _write(result, out, metadata, provenance, preprocessor, notes)
    _check_runs(out, name, inputs[0])
    fp32, int8 = src.stat().st_size, out.stat().st_size
    return {
        "input": str(src),
        "output": str(out),
        "search": search,
        "fp32_bytes": fp32,
        "int8_bytes": int8,
        "size_ratio": round(int8 / fp32, 4) if fp32 else None,
        "calibration": {"source": str(opts.calib), "kind": describe(opts.calib), "frames": len(inputs)},
        "input_shape": list(pinned),
        "quantization": provenance,
        "notes": notes,
        "seconds": round(time.monotonic() - started, 2),
    }


def _note_search(search: dict[str, Any], frames: int, provenance: dict[str, Any], notes: list[str]) -> None:
    """The search into the provenance; a note when too few frames left none to hold out."""
    provenance["search"] = {k: v for k, v in search.items() if k != "table"} | {"candidates": search["table"]}
    if search["held_out_shared"]:
        notes.append(
            f"only {frames} frames: the recipes were judged on the calibration frames themselves, which "
            f"flatters them; give at least {2 * MIN_HELD_OUT} frames so that {MIN_HELD_OUT} are held out"
        )


def _write(  # noqa: PLR0917  (the model and what goes into its metadata)
    result: Any,
    out: Path,
    metadata: dict[str, str],
    provenance: dict[str, Any],
    preprocessor: Preprocessor | None,
    notes: list[str],
) -> None:
    """The parent's metadata plus provenance (and the preprocessing used, when the parent had none); then
    the ONNX checker, then the file."""
    onnx = require_onnx()
    props = {**metadata, QUANTIZED_FROM_KEY: provenance["source_sha256"], QUANTIZATION_KEY: json.dumps(provenance)}
    if METADATA_KEY not in metadata and preprocessor is not None:
        props[METADATA_KEY] = preprocessor.spec.to_metadata()
        notes.append(f"wrote the preprocessing used for calibration into the {METADATA_KEY} metadata")
    del result.metadata_props[:]
    onnx.helper.set_model_props(result, props)
    prune_opset_imports(result)
    try:
        onnx.checker.check_model(result)
    except Exception as exc:
        raise ToolError(f"the quantized model fails the ONNX checker ({exc}); nothing was written") from exc
    onnx.save(result, str(out))


def with_recipe(opts: QuantizeOptions, r: recipes.Recipe) -> QuantizeOptions:
    """The options with a recipe's settings."""
    return replace(
        opts,
        method=r.method,
        activation_type=r.activation_type,
        weight_type=r.weight_type,
        per_channel=r.per_channel,
        symmetric_activations=r.symmetric_activations,
        op_types=r.op_types,
        exclude_nodes=r.exclude_nodes or opts.exclude_nodes,
        recipe=r.name,
    )


MIN_HELD_OUT = 16  # held-out frames at least: with fewer, one frame moves a 0.95 gate by more than 5 points


def split_held_out(inputs: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
    """(calibration, held-out): the last quarter (MIN_HELD_OUT to 64 frames) is held out to judge the
    candidates; with fewer than 2 x MIN_HELD_OUT frames every frame does both (the report says so)."""
    if len(inputs) < 2 * MIN_HELD_OUT:
        return inputs, inputs
    held = min(64, max(MIN_HELD_OUT, len(inputs) // 4))
    return inputs[:-held], inputs[-held:]


@dataclass
class _Trial:
    """Quantizes the prepared model with a recipe and judges it against fp32 on the held-out frames."""

    prepared: Path
    name: str
    calib: list[Tensor]
    held: list[Tensor]
    opts: QuantizeOptions
    tmp: Path
    reference: list[list[Tensor]]
    names: list[str]
    task: str
    detector: Any = None
    failed: list[dict[str, Any]] = field(default_factory=list)  # table rows of recipes ORT could not apply
    stopped: bool = False  # the mixed-precision search met its time limit
    ended: str = ""  # how the mixed-precision search ended (why nothing better exists, when nothing passed)
    ranges: RangeCache | None = None  # the calibration ranges, computed once per method for every recipe

    @classmethod
    def of(  # noqa: PLR0917  (the prepared model and its surroundings)
        cls,
        src: Path,
        prepared: Path,
        name: str,
        inputs: list[Tensor],
        opts: QuantizeOptions,
        tmp: Path,
        size: tuple[int, int],
    ) -> _Trial:
        calib, held = split_held_out(inputs)
        parent = recipes.session(src)
        reference = recipes.outputs(parent, name, held)
        names = [o.name for o in parent.get_outputs()]
        shapes = [list(o.shape) for o in parent.get_outputs()]
        metadata = dict(parent.get_modelmeta().custom_metadata_map)
        task, detector = task_judge(opts.judge(), names, shapes, metadata, size, reference[0])
        ranges = RangeCache(prepared, name, calib, tmp)
        ranges.plan([range_key(with_recipe(opts, r)) for r in recipes.candidates(recipes.resolve_target(opts.target))])
        return cls(prepared, name, calib, held, opts, tmp, reference, names, task, detector, ranges=ranges)

    def run(self, r: recipes.Recipe) -> tuple[recipes.Recipe, Path, dict[str, Any]] | None:
        """(recipe, model, verdict), or None when ORT cannot quantize the model this way (logged, and kept in
        `failed` for the table)."""
        path = self.tmp / f"{r.name}.onnx"
        try:
            _quantize_static(self.prepared, path, self.name, self.calib, with_recipe(self.opts, r), self.ranges)
        except ToolError as exc:
            log.info("recipe %s: quantization failed: %s", r.name, exc)
            why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            self.failed.append(_failed_row(r, why[:200]))
            return None
        outs = recipes.outputs(recipes.session(path), self.name, self.held)
        judging = replace(self.opts.judge(), task=self.task)
        return r, path, judge(self.names, self.reference, outs, judging, self.opts.gates, self.detector)


def _frame_size(preprocessor: Preprocessor | None, inputs: list[Tensor]) -> tuple[int, int]:
    """The model input's width and height, as the decoders see them: from the preprocessing (the pipeline's
    config, NHWC or NCHW), else from ready NCHW tensors."""
    if preprocessor is not None:
        return preprocessor.spec.size
    return int(inputs[0].shape[-1]), int(inputs[0].shape[-2])


def _search(  # noqa: PLR0917  (the prepared model and its surroundings)
    src: Path,
    prepared: Path,
    name: str,
    inputs: list[Tensor],
    opts: QuantizeOptions,
    tmp: Path,
    size: tuple[int, int],
) -> tuple[QuantizeOptions, Path, dict[str, Any]]:
    """Quantize with every candidate recipe, judge each on held-out frames and time it beside fp32; when the
    fastest fails the gates, try it again with more and more nodes in float (mixed.py). Return the one that
    `choose` picks: the fastest that passes, or one within 10% of it and more accurate.
    Int8SlowerError when every passing one is slower than fp32 here (unless `accept_slower`); ToolError when
    none passes."""
    started = time.monotonic()
    cpu = Cpu.read()
    target = recipes.resolve_target(opts.target)
    trial = _Trial.of(src, prepared, name, inputs, opts, tmp, size)
    tried = [t for r in recipes.candidates(target) if (t := trial.run(r)) is not None]
    if not tried:
        raise ToolError(
            "every candidate recipe failed to quantize this model: "
            + "; ".join(f"{row['recipe']}: {row['why']}" for row in trial.failed)
        )
    with progress_bar("timing fp32 and int8", recipes.ROUNDS * (len(tried) + 1), enabled=opts.progress) as tick:
        times = recipes.time_models([src] + [path for _, path, _ in tried], name, trial.held[0], tick)
    fp32_ms = times[0]
    table = [_row(r, verdict, ms, fp32_ms) for (r, _, verdict), ms in zip(tried, times[1:], strict=True)]
    _mixed_search(src, trial, tried, table, fp32_ms, started + opts.search_s)
    best = choose(table, fp32_ms)
    search = {
        "target": target,
        "task": trial.task,
        "fp32_ms": round(fp32_ms, 4),
        "chosen": None,
        "int8_ms": None,
        "speedup": None,
        "held_out_frames": len(trial.held),
        "held_out_shared": trial.held is trial.calib,  # too few frames to hold any out: judged on the calibration
        "seconds": round(time.monotonic() - started, 1),
        "stopped_at_limit": trial.stopped,  # the mixed-precision search ran out of time (search_s)
        "search_ended": trial.ended,  # how the mixed-precision search ended ("" when it was not needed)
        "cpu": cpu.as_json(),
        "table": table + trial.failed,
    }
    if best is None:
        raise NoRecipePassedError(_no_pass_message(table, trial.ended), search)
    search |= {"chosen": table[best]["recipe"], "int8_ms": table[best]["int8_ms"], "speedup": table[best]["speedup"]}
    if table[best]["int8_ms"] * MIN_SPEEDUP > fp32_ms and not opts.accept_slower:
        raise Int8SlowerError(
            f"int8 is slower than fp32 on this machine (or less than {MIN_SPEEDUP:.2f}x faster): the best recipe "
            "that keeps the answers, "
            f"{table[best]['recipe']}, runs in {table[best]['int8_ms']:.3f} ms vs {fp32_ms:.3f} ms for fp32 "
            f"({table[best]['speedup']:.2f}x); nothing written (--accept-slower writes it anyway)" + cpu.slower_hint(),
            search,
        )
    chosen, path, _ = tried[best]
    return with_recipe(opts, chosen), path, search


def _mixed_search(  # noqa: PLR0917  (the search's state)
    src: Path,
    trial: _Trial,
    tried: list[tuple[recipes.Recipe, Path, dict[str, Any]]],
    table: list[dict[str, Any]],
    fp32_ms: float,
    deadline: float,
) -> None:
    """When the fastest candidate fails the gates (and is faster than fp32, or no candidate passes), quantize a
    failing candidate (`search_base`) again with more and more nodes in float (mixed.py: the head's trouble
    spots by structure, then where its error comes in, measured), judging and timing each, until one passes
    or `deadline` (monotonic) comes; appended to `tried` and `table`."""
    fastest = min(range(len(table)), key=lambda i: table[i]["int8_ms"])
    if table[fastest]["passed"]:
        return
    if table[fastest]["int8_ms"] * MIN_SPEEDUP > fp32_ms and any(row["passed"] for row in table):
        return  # nothing it becomes can beat fp32, and a passing candidate exists
    graph = require_onnx().load(str(trial.prepared)).graph
    structural = mixed.structural_groups(graph)
    whole = [r.op_types is None for r, _, _ in tried]
    base, path, _ = tried[search_base(table, whole, fp32_ms, structural=bool(structural))]
    try:
        measured = mixed.sensitivity_groups(
            graph, sensitivity.tensor_errors(trial.prepared, path, trial.name, trial.calib, trial.tmp)
        )
    except ToolError as exc:  # the intermediate outputs could not be compared: the structure alone
        log.info("sensitivity not measured: %s", exc)
        measured = []
    reasons = {n: g.why for g in [*reversed(measured), *reversed(structural)] for n in g.nodes}

    def attempt(nodes: tuple[str, ...]) -> bool:
        """Quantize the base with `nodes` in float, judge and time it, add it to the table; whether it passed."""
        derived = trial.run(base.keeping_in_float(nodes))
        if derived is None:
            return False
        with progress_bar("timing fp32 and int8", recipes.ROUNDS * 2, enabled=trial.opts.progress) as tick:
            again = recipes.time_models([src, derived[1]], trial.name, trial.held[0], tick)
        tried.append(derived)  # its time, in this run's fp32 terms: the ratio is what the two runs share
        row = _row(derived[0], derived[2], fp32_ms * again[1] / again[0], fp32_ms)
        row["float_for"] = sorted({reasons[n] for n in nodes if n in reasons})
        table.append(row)
        return bool(row["passed"])

    plan = mixed.steps(structural, measured, len(graph.node))
    kept: tuple[str, ...] = ()
    for step, nodes in enumerate(plan.sets):
        if time.monotonic() >= deadline:
            log.info("the mixed-precision search stopped at its time limit")
            trial.stopped = True
            break
        kept = nodes
        if attempt(nodes):
            fewest = _bisect_back(plan, step, attempt, deadline) or nodes
            trial.ended = f"passed with {len(fewest)} of {len(graph.node)} nodes in float"
            return
    trial.ended = _search_end(trial, plan, len(kept), len(graph.node))


BISECT_STEPS = 2  # tries back from a passing step that added several groups at once


def _bisect_back(
    plan: mixed.Plan, step: int, attempt: Callable[[tuple[str, ...]], bool], deadline: float
) -> tuple[str, ...] | None:
    """After `step` passed: fewer of the groups it added, halving (BISECT_STEPS tries at most, within the
    deadline); the smallest set that passed, or None when none of these did."""
    lo, hi, best = 0, len(plan.batches[step]), None  # lo groups failed (the step before), hi passed
    for _ in range(BISECT_STEPS):
        if hi - lo < 2 or time.monotonic() >= deadline:
            break
        mid = (lo + hi) // 2
        nodes = plan.narrower(step, mid)
        if attempt(nodes):
            hi, best = mid, nodes
        else:
            lo = mid
    return best


def search_base(table: list[dict[str, Any]], whole: list[bool], fp32_ms: float, *, structural: bool) -> int:
    """The failing candidate the mixed-precision search starts from: the one that keeps the most of the answers
    (its agreement), then the fastest, among those faster than fp32 (when any is). Where the graph has a head's
    trouble spots, only a recipe of every op (`whole`) quantizes them, so only those are taken (when any
    fails). Starting from the most accurate: PP-PicoDet's fastest recipe kept 3% of the boxes and another
    nearly as fast 64%; the float nodes mend what is left, not what the fastest broke."""
    failing = [i for i, row in enumerate(table) if not row["passed"]]
    if structural and any(whole[i] for i in failing):
        failing = [i for i in failing if whole[i]]
    faster = [i for i in failing if table[i]["int8_ms"] * MIN_SPEEDUP <= fp32_ms]
    return max(faster or failing, key=lambda i: (table[i]["agreement"]["value"], -table[i]["int8_ms"]))


def _search_end(trial: _Trial, plan: mixed.Plan, kept: int, total: int) -> str:
    """Why the mixed-precision search found nothing that passes, in one sentence for the refusal."""
    if not plan.sets:
        return ("it had nothing to keep in float: no trouble spot of a detection head in the graph, and no "
                "stretch measured losing accuracy")  # fmt: skip
    if trial.stopped:
        return f"it met its time limit ({trial.opts.search_s:.0f} s) with {kept} of {total} nodes in float"
    if plan.capped:
        return (f"it kept {kept} of {total} nodes in float and stopped before {plan.cap} (half the graph): beyond, "
                "int8 has nothing left to gain")  # fmt: skip
    return (f"every trouble spot of the head and every stretch measured losing accuracy was kept in float "
            f"({kept} of {total} nodes) and the answers still changed")  # fmt: skip


def _no_pass_message(table: list[dict[str, Any]], ended: str) -> str:
    """The refusal: the best candidate found, how far it missed, and why the search found nothing better."""
    judged = [row for row in table if row["agreement"] is not None]
    best = max(judged, key=lambda row: (row["agreement"]["value"], -row["int8_ms"]))
    message = (
        f"no int8 recipe kept the fp32 model's answers on the held-out frames; the closest, {best['recipe']} "
        f"({best['agreement']['check']} {best['agreement']['value']:.4g}, {best['speedup'] or 0:.2f}x fp32), missed: "
        f"{best['why']}"
    )
    return message + (f". The mixed-precision search: {ended}" if ended else "")


ACCURATE_WITHIN = 1.10  # a passing recipe at most this much slower than the fastest one, but more accurate, wins


def choose(table: list[dict[str, Any]], fp32_ms: float) -> int | None:
    """The row to write: of the passing ones, the most accurate among those within ACCURATE_WITHIN of the
    fastest (what an operator would pick: 9% of speed is not worth a tenth of the detections) and still faster
    than fp32 when the fastest is, then the faster; None when none passes."""
    passing = [i for i, row in enumerate(table) if row["passed"]]
    if not passing:
        return None
    fastest = min(table[i]["int8_ms"] for i in passing)
    pays = fastest * MIN_SPEEDUP <= fp32_ms
    near = [
        i
        for i in passing
        if table[i]["int8_ms"] <= fastest * ACCURATE_WITHIN
        and (not pays or table[i]["int8_ms"] * MIN_SPEEDUP <= fp32_ms)
    ]
    return max(near, key=lambda i: (table[i]["agreement"]["value"], -table[i]["int8_ms"]))


def _failed_row(r: recipes.Recipe, why: str) -> dict[str, Any]:
    """A table row for a recipe ORT could not apply to this model."""
    return {
        "recipe": r.name,
        "what": r.describe(),
        "kept_in_float": [],
        "int8_ms": None,
        "speedup": None,
        "task": None,
        "agreement": None,
        "passed": False,
        "why": f"quantization failed: {why}",
    }


def _row(r: recipes.Recipe, verdict: dict[str, Any], ms: float, fp32_ms: float) -> dict[str, Any]:
    failed = [c for c in verdict["checks"] if not c["passed"]]
    key = {
        "classify": "top-1 agreement >=",
        "dense": "mask IoU (mean) >=",
        "segment": "mask IoU (mean) >=",
        "detect": "detection recall >=",
    }.get(verdict["task"])
    shown = next((c for c in verdict["checks"] if c["check"] == key), None) or verdict["checks"][0]
    return {
        "recipe": r.name,
        "what": r.describe(),
        "kept_in_float": list(r.exclude_nodes),
        "int8_ms": round(ms, 4),
        "speedup": round(fp32_ms / ms, 3) if ms > 0 else None,
        "task": verdict["task"],
        "agreement": {"check": shown["check"].removesuffix(" >="), "value": round(float(shown["value"]), 5)},
        "measures": {
            c["check"].removesuffix(" >=").removesuffix(" <="): round(float(c["value"]), 5) for c in verdict["checks"]
        },  # every gate's figure: precision beside recall
        "passed": verdict["passed"],
        "why": _why(failed, verdict),
    }


def _why(failed: list[dict[str, Any]], verdict: dict[str, Any]) -> str:
    """The gates a candidate missed and by how much; the first frame its decoder refused, when one was."""
    why = "; ".join(f"{c['check']} {c['threshold']}: {c['value']:.4g}" for c in failed) or "passed"
    refused = (verdict.get("detection") or {}).get("refused_why")
    return f"{why} (the first refused: {refused[:160]})" if refused else why


@contextlib.contextmanager
def _quiet_in(folder: Path) -> Iterator[None]:
    """Run ORT's quantization tools inside `folder` (some of them write scratch files, such as
    sym_shape_infer_temp.onnx or a <uuid>.data of external weights, into the working directory) and with
    ORT's own log at errors only (it warns once per initializer of many exported models: thousands of lines)."""
    import onnxruntime as ort  # noqa: PLC0415

    before = Path.cwd()
    os.chdir(folder)
    ort.set_default_logger_severity(3)
    try:
        yield
    finally:
        ort.set_default_logger_severity(2)  # ORT's default: warnings
        os.chdir(before)


def _check_paths(src: Path, out: Path) -> None:
    if not src.is_file():
        raise ToolError(f"model file not found: {src}")
    if out.resolve() == src.resolve() or (out.exists() and out.samefile(src)):
        raise ToolError(f"refusing to overwrite the input model {src}; give another -o path")
    if out.is_dir():
        raise ToolError(f"-o {out} is a folder; give the output .onnx file name")
    if not out.parent.exists():
        raise ToolError(f"output folder {out.parent} does not exist")
    if is_quantized(src):
        raise ToolError(
            f"{src} is already quantized (it holds QuantizeLinear / QLinear operators): quantize the fp32 model "
            "it came from (an edged-quantized model names its sha256 in the edged.quantized_from metadata)"
        )


def _default_opset(model: Any) -> int | None:
    for op in model.opset_import:
        if op.domain in ("", "ai.onnx"):
            return int(op.version)
    return None


def _preprocessor(
    opts: QuantizeOptions, metadata: dict[str, str], shape: list[Any], input_type: str
) -> Preprocessor | None:
    try:
        return resolve_preprocessor(opts.preprocess, metadata, shape, input_type, None if opts.shape else opts.calib)
    except EdgedError as exc:
        if holds_tensors(opts.calib):
            log.info("preprocessing unresolved (%s); the calibration set must hold ready tensors", exc)
            return None
        raise ToolError(
            f"{exc}. For a model with dynamic input axes give --shape (e.g. --shape 1,3,224,224) or "
            "--preprocess '{\"size\": [224, 224]}'"
        ) from exc


def _calibration_inputs(opts: QuantizeOptions, pre: Preprocessor | None, shape: list[Any]) -> list[Tensor]:
    inputs = load_inputs(opts.calib, pre, list(opts.shape) if opts.shape else shape, opts.calib_limit)
    first = tuple(inputs[0].shape)
    if any(tuple(t.shape) != first for t in inputs):
        raise ToolError("calibration inputs differ in shape; preprocessing must give one shape")
    if opts.shape and first != opts.shape:
        raise ToolError(f"--shape {list(opts.shape)} but the calibration inputs are {list(first)}")
    if len(inputs) < 16:
        log.warning("only %d calibration frame(s): ranges may not cover real inputs (100-500 is typical)", len(inputs))
    return inputs


def _pre_process(src: Path, dst: Path, optimize: bool, notes: list[str]) -> Path:
    """ORT's quant_pre_process (shape inference, optional optimisation), degrading step by step on failure."""
    from onnxruntime.quantization.shape_inference import quant_pre_process  # noqa: PLC0415

    attempts: list[tuple[str, dict[str, bool]]] = [
        ("full", {"skip_optimization": not optimize}),
        ("without symbolic shape inference", {"skip_optimization": not optimize, "skip_symbolic_shape": True}),
        ("shape inference only", {"skip_optimization": True, "skip_symbolic_shape": True}),
    ]
    for label, kwargs in attempts:
        try:
            quant_pre_process(str(src), str(dst), **kwargs)
        except Exception as exc:  # noqa: BLE001  (ORT raises anything from here; we degrade instead)
            why = str(exc).strip().splitlines()[0] if str(exc).strip() else f"{type(exc).__name__} (no message)"
            log.info("quant_pre_process (%s) failed: %s", label, why)
            continue
        if label != "full":
            notes.append(f"quant_pre_process ran {label} (the full run failed)")
        return dst
    notes.append("quant_pre_process failed; quantized the model without pre-processing")
    return src


def _named(prepared: Path, tmp: Path) -> Path:
    """The prepared model with every node named (nodes are kept in float by name)."""
    onnx = require_onnx()
    model = onnx.load(str(prepared))
    if not sensitivity.name_nodes(model):
        return prepared
    named = tmp / "named.onnx"
    onnx.save(model, str(named))
    return named


def _check_excluded(prepared: Path, nodes: tuple[str, ...]) -> None:
    """`--exclude-nodes` must name nodes of the model as quantize prepares it."""
    if not nodes:
        return
    known = {n.name for n in require_onnx().load(str(prepared)).graph.node}
    missing = [n for n in nodes if n not in known]
    if missing:
        raise ToolError(
            f"--exclude-nodes names {len(missing)} node(s) the prepared model does not have: "
            f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''} (the names the search wrote into "
            "edged.quantization are those of the model after quantize's pre-processing, with the same options)"
        )


def _quantize_static(  # noqa: PLR0917  (the model, its frames, the recipe and the ranges found so far)
    src: Path, dst: Path, input_name: str, inputs: list[Tensor], opts: QuantizeOptions, ranges: RangeCache | None
) -> None:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static  # noqa: PLC0415

    qtype = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8}
    method = {
        "minmax": CalibrationMethod.MinMax,
        "entropy": CalibrationMethod.Entropy,
        "percentile": CalibrationMethod.Percentile,
    }[opts.method]
    extra: dict[str, Any] = {
        "ActivationSymmetric": _symmetric(opts),
        "WeightSymmetric": opts.weight_type == "int8",
    }
    if opts.method == "percentile":
        extra["CalibPercentile"] = opts.percentile
    cached = ranges is not None and cache_supported()
    if not cached:
        # ORT's own strided calibration (an onnxruntime without calibration_cache_path): CALIB_STRIDE frames'
        # activations at a time; histograms may still grow (edged/tools/calibration.py)
        extra["CalibStridedMinMax"] = CALIB_STRIDE
    key = range_key(opts)
    reads = ranges.reads(key) if ranges is not None and cached else len(inputs)
    # ORT prints calibration chatter on stdout, which is for --json: it goes to stderr
    with (
        progress_bar(f"calibrating ({opts.method})", reads, enabled=opts.progress and reads > 0) as advance,
        contextlib.redirect_stdout(sys.stderr),
    ):
        reader = None if cached else CountingReader(input_name, inputs, advance)
        cache = {"calibration_cache_path": str(ranges.path(key, advance))} if ranges is not None and cached else {}
        try:
            quantize_static(
                str(src),
                str(dst),
                reader,
                quant_format=QuantFormat.QDQ,
                per_channel=opts.per_channel,
                reduce_range=_reduce_range(opts),
                op_types_to_quantize=list(opts.op_types) if opts.op_types else None,
                nodes_to_exclude=list(opts.exclude_nodes) or None,
                activation_type=qtype[opts.activation_type],
                weight_type=qtype[opts.weight_type],
                calibrate_method=method,
                extra_options=extra,
                **cache,
            )
        except Exception as exc:
            raise ToolError(f"onnxruntime's quantizer failed: {exc}") from exc


def range_key(opts: QuantizeOptions) -> tuple[str, bool, float]:
    """What a recipe's calibration ranges depend on (edged/tools/calibration.py RangeCache)."""
    return (opts.method, _symmetric(opts), opts.percentile)


def _note_float_activations(model: Any, opts: QuantizeOptions, notes: list[str]) -> None:
    """Say when symmetric activations left Relu/Clip in float between Q/DQ pairs (slow on a CPU, free on TensorRT)."""
    left = sum(1 for n in model.graph.node if n.op_type in ("Relu", "Clip"))
    if left and _symmetric(opts):
        notes.append(
            f"{left} Relu/Clip node(s) stay in float between QuantizeLinear/DequantizeLinear pairs: with symmetric "
            "activations (zero point 0, what TensorRT needs) the quantizer cannot fold them into the ranges. TensorRT "
            "fuses them; on a CPU-only device (Raspberry Pi) --asymmetric-activations folds them and runs faster, "
            "but that model is not for TensorRT"
        )


def _reduce_range(opts: QuantizeOptions) -> bool:
    return opts.reduce_range if opts.reduce_range is not None else Cpu.read().x86_without_vnni


def _symmetric(opts: QuantizeOptions) -> bool:
    if opts.symmetric_activations is not None:
        return opts.symmetric_activations
    return opts.activation_type == "int8"


def _provenance(src: Path, opts: QuantizeOptions, frames: int, opset_before: int | None) -> dict[str, Any]:
    return {
        "source_sha256": file_sha256(src),
        "source_file": src.name,
        "source_opset": opset_before,
        "format": "QDQ",
        "method": opts.method,
        "calibration_frames": frames,
        "activation_type": opts.activation_type,
        "activation_symmetric": _symmetric(opts),
        "weight_type": opts.weight_type,
        "per_channel": opts.per_channel,
        "reduce_range": _reduce_range(opts),
        "recipe": opts.recipe,
        "op_types": list(opts.op_types) if opts.op_types else None,
        "exclude_nodes": list(opts.exclude_nodes),
        "date": dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat(),
        "tool": f"edged {__version__}",
    }


def _check_runs(path: Path, input_name: str, sample: Tensor) -> None:
    """Load the written model in ONNX Runtime and run it once, so a broken output fails here, not on the device."""
    import onnxruntime as ort  # noqa: PLC0415

    try:
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        outputs = sess.run(None, {input_name: sample})
    except Exception as exc:
        raise ToolError(f"the quantized model {path} was written but does not run in onnxruntime: {exc}") from exc
    if not all(np.all(np.isfinite(np.asarray(o, dtype=np.float64))) for o in outputs):
        log.warning("the quantized model gives non-finite outputs on a calibration frame")


def describe_candidate(row: dict[str, Any]) -> str:
    """One candidate of the search in a few words: its speed-up, and the gate it failed or why it could not
    be made (the benchmarks' and docs/models.md's lists)."""
    if row["speedup"] is None:
        return f"{row['recipe']} ({row['why']})"
    return f"{row['recipe']} {row['speedup']:.2f}x" + ("" if row["passed"] else f" (fails: {row['why']})")


def render_search(search: dict[str, Any]) -> None:
    """The candidates tried: time beside fp32, agreement, verdict (80 columns)."""
    from rich.table import Table  # noqa: PLC0415

    table = Table(
        title=f"recipes tried ({search['target']}; fp32 {search['fp32_ms']:.3f} ms, 1 thread; "
        f"{search['held_out_frames']} held-out frames; {search['seconds']} s)",
        title_justify="left",
        header_style="bold",
        box=None,
        pad_edge=False,
    )
    for col in ("recipe", "int8 ms", "speed-up", "agreement", "verdict"):
        table.add_column(col, justify="left" if col in ("recipe", "verdict") else "right", overflow="fold")
    for row in search["table"]:
        if row["int8_ms"] is None:
            table.add_row(row["recipe"], "-", "-", "-", "not applicable")
            continue
        mark = "chosen" if row["recipe"] == search["chosen"] else ("ok" if row["passed"] else "fails")
        agree = f"{row['agreement']['check']} {row['agreement']['value']:.4f}"
        table.add_row(row["recipe"], f"{row['int8_ms']:.3f}", f"{row['speedup']:.2f}x", agree, mark)
    stdout_console().print(table)
    for row in search["table"]:
        if not row["passed"]:
            stdout_console().print(f"  {row['recipe']}: {row['why']}", markup=False, highlight=False)
        for why in row.get("float_for") or []:  # a mixed-precision step: what its float nodes are for
            stdout_console().print(f"  {row['recipe']} keeps in float: {why}", markup=False, highlight=False)
    if search.get("search_ended"):
        stdout_console().print(f"  the mixed-precision search: {search['search_ended']}", markup=False, highlight=False)


def render_quantize(report: dict[str, Any]) -> None:
    """Print what was done and the fp32 vs int8 sizes."""
    console = stdout_console()
    if report.get("search"):
        render_search(report["search"])
    for note in report["notes"]:
        console.print(f"[yellow]note:[/] {note}")
    q = report["quantization"]
    sym = "symmetric" if q["activation_symmetric"] else "asymmetric"
    console.print(
        f"quantized {report['input']} -> [bold]{report['output']}[/]\n"
        f"  QDQ, weights {q['weight_type']} {'per-channel' if q['per_channel'] else 'per-tensor'}, "
        f"activations {q['activation_type']} {sym}, {q['method']} calibration on "
        f"{report['calibration']['frames']} frame(s) ({report['calibration']['kind']}), input {report['input_shape']}\n"
        f"  size: fp32 {human_bytes(report['fp32_bytes'])} -> int8 {human_bytes(report['int8_bytes'])} "
        f"({report['size_ratio']:.0%} of the original) in {report['seconds']} s\n"
        f"  next: edged validate {report['input']} {report['output']} --data HELD_OUT_FRAMES"
    )
