"""Calibration ranges in bounded memory, computed once per calibration method for a whole recipe search.

ONNX Runtime's own calibration inside `quantize_static` either keeps every intermediate tensor of every
frame until the end (0.45 GB a frame for a 640x480 text detector), or, strided (`CalibStridedMinMax`), folds
a few frames at a time into histograms that *grow*: each histogram's bin width is fixed by the first
frames' range, and every later frame with a wider range adds bins (`merge_histogram`). A tensor whose first
range is tiny ends with millions of bins: 64 frames of the text detector peaked at 5.9 GB and took ten
minutes, most of it the entropy search over those bins.

So edged calibrates itself with ORT's public calibrators (`create_calibrator`), one frame at a time. One
pass over the frames takes each tensor's min and max (the ranges of the MinMax method, plain and
symmetric); for the histogram methods (entropy, percentile) the histograms are then seeded with those
whole ranges, so that merging never adds a bin: memory is the model plus one frame's activations plus
fixed-size histograms, whatever the number of frames, and the result is the histogram ORT would build from
all the frames at once.

The min/max pass reads every tensor of the histogram calibrators' augmented model (every tensor an output)
and reduces it here, rather than running ORT's MinMaxCalibrater: that one adds a ReduceMin and a ReduceMax
per tensor, which ORT runs late, so every activation of a frame stays alive until the end of the run. On a
608x800 PicoDet that pass peaked at 1.8 GB where one frame's activations are 0.83 GB. The ranges are the
ones ORT's MinMax computes (nanmin and nanmax per tensor, the extremes over the frames; symmetric: minus and
plus the larger magnitude). The ranges go to `quantize_static`
as its calibration cache (`calibration_cache_path`: onnxruntime 1.32 has it); without it edged falls back to the
strided calibration inside `quantize_static`.

The ranges depend on the method, the symmetry of the activations and the percentile, not on the other
parts of a recipe (weights, per-channel, kept nodes), so a search computes each at most once.

Counting into a seeded histogram is edged's own too (`add_frame`): each tensor of each frame is counted once,
at FINE_BINS equal bins over its whole range, and summed into each calibrator's coarser bins (percentile's
2048, entropy's ENTROPY_BINS), where ORT's collector flattened, scanned and histogrammed the same activations again for
every method. On PicoDet that counting was 55% of the whole search (357 of 685 s, profiled).
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import io
import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

Tensor = Any
Key = tuple[str, bool, float]  # (method, symmetric activations, percentile)
FINE_BINS = 2048  # each tensor of a frame is counted once at these bins; a calibrator's bins must divide them
# Entropy (KL) calibration tries every threshold between num_quantized_bins (128) and its histogram's whole
# width: at ORT's default of 128 bins that is one threshold, the whole range, so "entropy" gave exactly the
# MinMax ranges (measured on CenterFace: 123 of 123 tensors). ORT's histograms only grew past 128 bins by the
# merging that edged's seeding stops. 512 bins give 193 thresholds to choose from; TensorRT's 2048 cost ORT's
# search 0.4 s a tensor (PicoDet: 521 tensors), 512 about 0.06 s.
ENTROPY_BINS = 512


def cache_supported() -> bool:
    """Whether this onnxruntime's quantize_static takes ready ranges (`calibration_cache_path`)."""
    from onnxruntime.quantization import quantize_static  # noqa: PLC0415

    return "calibration_cache_path" in inspect.signature(quantize_static).parameters


class RangeCache:
    """The calibration ranges of one prepared model on one set of frames, per (method, symmetric,
    percentile), as files `quantize_static` reads."""

    def __init__(self, model: Path, input_name: str, inputs: list[Tensor], folder: Path) -> None:
        self.model = model
        self.input_name = input_name
        self.inputs = inputs
        self.folder = folder
        self._paths: dict[Key, Path] = {}
        self._minmax: dict[bool, Any] = {}  # symmetric -> TensorsData of the min/max pass
        self._planned: list[Key] = []  # what a search will ask for: histograms that share one pass
        self._ready: dict[Key, Any] = {}  # computed with another key's pass, not yet asked for

    def plan(self, keys: list[Key]) -> None:
        """The keys a search will ask for: the histogram methods among them are collected in one pass over
        the frames (each frame's activations feed every histogram), not one pass each."""
        self._planned = list(dict.fromkeys(keys))

    def reads(self, key: Key) -> int:
        """Frames `path(key)` will read (0 when its ranges are there already): for the progress bar."""
        if key in self._paths or key in self._ready:
            return 0
        n = len(self.inputs)
        scan = 0 if self._minmax else n  # one pass gives the plain and the symmetric min/max ranges
        return scan if key[0] == "minmax" else scan + n

    def path(self, key: Key, advance: Callable[[int], None]) -> Path:
        """The ranges for `key` as a calibration cache file, computed on first use."""
        if key not in self._paths:
            from onnxruntime.quantization.calibrate import save_tensors_data  # noqa: PLC0415

            data = self._compute(key, advance)
            path = self.folder / f"ranges-{len(self._paths)}.json"
            save_tensors_data(data, path)
            self._paths[key] = path
        return self._paths[key]

    def _compute(self, key: Key, advance: Callable[[int], None]) -> Any:
        if key in self._ready:
            return self._ready.pop(key)
        if key[0] == "minmax":
            return self._minmax_ranges(key[1], advance)
        done = {*self._paths, *self._ready}
        keys = [key] + [k for k in self._planned if k[0] != "minmax" and k != key and k not in done]
        data = self._histograms(keys, advance)
        self._ready.update({k: data[k] for k in keys[1:]})
        return data[key]

    def _histograms(self, keys: list[Key], advance: Callable[[int], None]) -> dict[Key, Any]:
        """The histogram methods' ranges for `keys`, from one pass: each frame runs once, and its activations
        go into every key's histograms (seeded with the tensors' whole ranges) before the next frame."""
        bounds = self._minmax_ranges(False, advance)  # each tensor's whole range seeds its histogram
        with contextlib.ExitStack() as stack:
            calibrators: dict[Key, Any] = {}
            for i, (method, symmetric, percentile) in enumerate(keys):
                extra: dict[str, Any] = {"symmetric": symmetric}
                if method == "percentile":
                    extra["percentile"] = percentile
                if method == "entropy":
                    extra["num_bins"] = ENTROPY_BINS
                calibrator = stack.enter_context(self._calibrator(method, extra, f"augmented-{i}.onnx", run=i == 0))
                seed_histograms(calibrator, bounds)
                calibrators[keys[i]] = calibrator
            session = calibrators[keys[0]].infer_session
            names = [o.name for o in session.get_outputs()]
            for x in self.inputs:
                outputs = dict(zip(names, session.run(None, {self.input_name: x}), strict=True))
                add_frame(list(calibrators.values()), outputs)
                del outputs
                advance(1)
            with contextlib.redirect_stdout(io.StringIO()):  # ORT prints its threshold search on stdout
                return {k: c.compute_data() for k, c in calibrators.items()}

    def _minmax_ranges(self, symmetric: bool, advance: Callable[[int], None]) -> Any:
        if not self._minmax:
            self._minmax = self._scan_ranges(advance)
        return self._minmax[symmetric]

    def _scan_ranges(self, advance: Callable[[int], None]) -> dict[bool, Any]:
        """{symmetric: TensorsData} of the MinMax method, from one pass over the frames."""
        from onnxruntime.quantization import CalibrationMethod  # noqa: PLC0415
        from onnxruntime.quantization.calibrate import TensorsData  # noqa: PLC0415

        low: dict[str, float] = {}
        high: dict[str, float] = {}
        with self._calibrator("percentile", {}) as calibrator:  # its augmented model: every tensor an output
            session = calibrator.infer_session
            names = [o.name for o in session.get_outputs()]
            wanted = set(calibrator.tensors_to_calibrate)
            for x in self.inputs:
                for name, value in zip(names, session.run(None, {self.input_name: x}), strict=True):
                    if name in wanted and value.size:
                        low[name] = float(np.nanmin([np.nanmin(value), low.get(name, np.inf)]))
                        high[name] = float(np.nanmax([np.nanmax(value), high.get(name, -np.inf)]))
                advance(1)

        def pair(a: float, b: float) -> tuple[Any, Any]:
            return np.array([a], dtype=np.float32), np.array([b], dtype=np.float32)

        magnitude = {n: max(abs(low[n]), abs(high[n])) for n in low}
        return {
            False: TensorsData(CalibrationMethod.MinMax, {n: pair(low[n], high[n]) for n in low}),
            True: TensorsData(CalibrationMethod.MinMax, {n: pair(-m, m) for n, m in magnitude.items()}),
        }

    @contextlib.contextmanager
    def _calibrator(
        self, method: str, extra: dict[str, Any], name: str = "augmented.onnx", *, run: bool = True
    ) -> Iterator[Any]:
        """An ORT calibrator of `method` with its augmented model (every tensor an output); with `run`, its
        session is an arena-free one, else it has none (another calibrator's session runs the frames)."""
        from onnxruntime.quantization import CalibrationMethod  # noqa: PLC0415
        from onnxruntime.quantization.calibrate import create_calibrator  # noqa: PLC0415

        kind = {
            "minmax": CalibrationMethod.MinMax,
            "entropy": CalibrationMethod.Entropy,
            "percentile": CalibrationMethod.Percentile,
        }[method]
        augmented = self.folder / name
        with contextlib.redirect_stdout(sys.stderr):  # ORT prints its progress on stdout, which is for --json
            calibrator = create_calibrator(
                self.model,
                None,  # every tensor: the recipes' op types and kept nodes choose among them later
                augmented_model_path=str(augmented),
                calibrate_method=kind,
                extra_options=extra,
            )
        calibrator.infer_session = arena_free_session(augmented) if run else None
        try:
            yield calibrator
        finally:
            # the session of a model whose every tensor is an output is the big one: let it go now, not when the
            # cyclic collector gets to the calibrator
            calibrator.infer_session = None
            calibrator = None
            gc.collect()
            augmented.unlink(missing_ok=True)


def arena_free_session(path: Path) -> Any:
    """A CPU session of an augmented model (every tensor an output), unoptimised as ORT's calibrators and
    qdq_loss_debug make it (the calibration and the sensitivity search both use it), without ORT's memory
    arena: the arena keeps the largest run's buffers (all of one frame's activations, most of a GB at
    640x480) for the life of the session; without it they go back after each frame."""
    import onnxruntime as ort  # noqa: PLC0415

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # as ORT's calibrators run it
    opts.enable_cpu_mem_arena = False
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])


def add_frame(calibrators: list[Any], outputs: dict[str, Tensor]) -> None:
    """One frame's activations into every calibrator's histograms. A tensor seeded with its whole range
    (`seed_histograms`) is counted once per range and kind (values, or magnitudes for a symmetric percentile)
    at FINE_BINS bins, and the counts are summed into each calibrator's bins; any other tensor goes through
    ORT's own collector, as its collect_data would take one frame."""
    fine: dict[tuple[str, bool, float, float], np.ndarray[Any, Any]] = {}
    for calibrator in calibrators:
        absolute = calibrator.method == "percentile" and calibrator.symmetric  # ORT's collect_absolute_value
        hists = calibrator.collector.histogram_dict
        left: dict[str, list[Tensor]] = {}
        for name in calibrator.tensors_to_calibrate:
            if name not in outputs:
                continue
            entry = hists.get(name)
            bins = len(entry[0]) if entry is not None else 0
            if not bins or FINE_BINS % bins:  # not seeded, or bins that do not divide the fine ones
                left[name] = [outputs[name]]
                continue
            low, high = float(entry[1][0]), float(entry[1][-1])
            key = (name, absolute, low, high)
            if key not in fine:
                fine[key] = fine_counts(outputs[name], low, high, absolute=absolute)
            entry[0][:] += fine[key].reshape(bins, FINE_BINS // bins).sum(axis=1)
        if left:
            calibrator.collector.collect(left)


def fine_counts(data: Tensor, low: float, high: float, *, absolute: bool = False) -> np.ndarray[Any, Any]:
    """How many values of `data` (or of their magnitudes) fall in each of FINE_BINS equal bins over [low, high];
    values beyond either end count in the end bins (a seeded range holds every value: none are)."""
    flat = np.asarray(data, dtype=np.float32).reshape(-1)
    if absolute:
        flat = np.abs(flat)
    scaled = np.subtract(flat, np.float32(low), dtype=np.float32)
    scaled *= np.float32(FINE_BINS / (high - low))
    index = scaled.astype(np.int32)
    np.clip(index, 0, FINE_BINS - 1, out=index)
    nan = np.isnan(scaled)
    if nan.any():  # not a value: not counted (as np.histogram in ORT's collector)
        index = index[~nan]
    return np.bincount(index, minlength=FINE_BINS)


def seed_histograms(calibrator: Any, bounds: Any) -> None:
    """Give every tensor's histogram its whole range before the first frame, so that ORT's merging of later
    frames never widens it by adding bins: the bins ORT would choose seeing all the frames at once."""
    from onnxruntime.quantization.calibrate import HistogramCollector  # noqa: PLC0415

    collector = HistogramCollector(
        method=calibrator.method,
        symmetric=calibrator.symmetric,
        num_bins=calibrator.num_bins,
        num_quantized_bins=calibrator.num_quantized_bins,
        percentile=calibrator.percentile,
        scenario=calibrator.scenario,
    )
    absolute = calibrator.method == "percentile" and calibrator.symmetric  # ORT's collect_absolute_value
    for name, data in bounds.data.items():
        low, high = (np.asarray(v, dtype=np.float32).reshape(()) for v in data.range_value)
        threshold = np.float32(max(abs(float(low)), abs(float(high))))
        if not np.isfinite(threshold) or threshold <= 0:
            continue  # an all-zero or broken tensor: ORT builds its histogram from the data as usual
        hist = np.zeros(calibrator.num_bins, dtype=np.int64)
        if absolute:
            edges = np.linspace(0.0, threshold, calibrator.num_bins + 1, dtype=np.float32)
            collector.histogram_dict[name] = (hist, edges, low, high)
        else:
            edges = np.linspace(-threshold, threshold, calibrator.num_bins + 1, dtype=np.float32)
            collector.histogram_dict[name] = (hist, edges, low, high, threshold)
    calibrator.collector = collector
