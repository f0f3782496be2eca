"""`edged bench MODEL [MODEL2 ...]`: latency percentiles and throughput per model, provider and thread count.

Each combination gets its own session (made as the daemon makes one), `warmup` untimed runs, then `runs`
timed runs one after another on the same input; throughput is runs / total time of that single stream.
"""

from __future__ import annotations

import logging
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from edged.core.errors import EdgedError, ToolError
from edged.model.preprocess import DTYPES, ORT_TYPES
from edged.model.session import CPU, LoadedModel, usable_cores
from edged.model.settings import PreprocessConfig
from edged.tools.common import (
    available_providers,
    check_model_file,
    human_bytes,
    open_model,
    resolve_preprocessor,
    stdout_console,
)
from edged.tools.frames import Tensor, load_inputs
from edged.tools.progress import progress_bar

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BenchOptions:
    """What to measure."""

    providers: list[str] | None = None  # None: every provider this machine offers
    threads: list[int] = field(default_factory=lambda: [0])  # 0 = ONNX Runtime's default (one per core)
    runs: int = 100
    warmup: int = 10
    data: Path | None = None  # real frames instead of a random tensor
    shape: tuple[int, ...] | None = None  # for dynamic input axes
    preprocess: PreprocessConfig | None = None
    progress: bool = True


def bench_models(paths: list[Path], opts: BenchOptions) -> dict[str, Any]:
    """Measure every model on every provider and thread count; the report holds one row per combination."""
    if opts.runs < 1 or opts.warmup < 0:
        raise ToolError("--runs must be >= 1 and --warmup >= 0")
    for path in paths:
        check_model_file(path)  # before anything reads one (each model's metadata is read first)
    have = available_providers()
    providers = opts.providers or have
    missing = [p for p in providers if p not in have]
    if missing:
        raise ToolError(
            f"provider(s) not offered by this onnxruntime build: {', '.join(missing)} (here: {', '.join(have)})"
        )
    plan = [(m, p, t) for m in paths for p in providers for t in (opts.threads if p == CPU else [0])]
    rows: list[dict[str, Any]] = []
    peers = [_metadata(p) for p in paths]  # versions of one model: one that knows its input size tells the rest
    with progress_bar("benchmarking", len(plan) * (opts.runs + opts.warmup), enabled=opts.progress) as advance:
        for model_path, provider, threads in plan:
            with open_model(model_path, provider, threads) as model:
                x = _input(model, opts, peers)
                samples = _measure(model, x, opts, advance)
            rows.append({**_row(model_path, model, provider, threads, samples), "input_shape": list(x.shape)})
    return {
        "machine": {
            "platform": platform.platform(),
            "processor": platform.machine(),
            "cores": usable_cores(),
            "onnxruntime": ort.__version__,
            "providers": have,
        },
        "runs": opts.runs,
        "warmup": opts.warmup,
        "results": rows,
        "comparison": _comparison(rows, paths),
    }


def _metadata(path: Path) -> dict[str, str]:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(path), sess_options=opts, providers=[CPU])
    return dict(sess.get_modelmeta().custom_metadata_map)


def _input(model: LoadedModel, opts: BenchOptions, peers: list[dict[str, str]]) -> Tensor:
    """The input, by the shape rule of every tool (common.resolve_preprocessor): --shape, else the model's
    metadata or one of the other models' (an fp32 parent beside its quantized child), else --data's frames."""
    shape = opts.shape
    if shape is None:
        for metadata in [model.metadata, *peers]:
            try:
                pre = resolve_preprocessor(opts.preprocess, metadata, model.input_shape, model.input_type, opts.data)
            except EdgedError:
                continue
            if opts.data is not None:
                return load_inputs(opts.data, pre, model.input_shape, 1)[0]
            shape = pre.spec.tensor_shape
            break
    if shape is None:
        if not all(isinstance(d, int) and d > 0 for d in model.input_shape):
            raise ToolError(
                f"{model.path.name} has dynamic input axes {model.input_shape} and no size in its metadata or the "
                "frames: give --shape, --preprocess '{\"size\": [W, H]}' or --data"
            )
        shape = tuple(int(d) for d in model.input_shape)
    dtype = DTYPES.get(ORT_TYPES.get(model.input_type, "float32"), np.float32)
    rng = np.random.default_rng(0)
    if dtype is np.uint8:
        return rng.integers(0, 256, size=shape, dtype=np.uint8)
    if dtype is np.int8:
        return rng.integers(-128, 128, size=shape, dtype=np.int8)
    return rng.random(size=shape).astype(dtype)


def _measure(model: LoadedModel, x: Tensor, opts: BenchOptions, advance: Any) -> npt.NDArray[np.float64]:
    feed = {model.input_name: x}
    run = model.session.run
    try:
        for _ in range(opts.warmup):
            run(None, feed)
            advance(1)
        samples = np.empty(opts.runs, dtype=np.float64)
        for i in range(opts.runs):
            t0 = time.perf_counter_ns()
            run(None, feed)
            samples[i] = (time.perf_counter_ns() - t0) / 1e6
            advance(1)
    except Exception as exc:
        raise ToolError(f"{model.path.name} failed to run on {model.provider}: {exc}") from exc
    return samples


def _row(path: Path, model: LoadedModel, provider: str, threads: int, ms: npt.NDArray[np.float64]) -> dict[str, Any]:
    p50, p95, p99 = (float(v) for v in np.percentile(ms, [50, 95, 99]))
    return {
        "model": path.name,
        "path": str(path),
        "size_bytes": path.stat().st_size,
        "sha256": model.sha256,
        "provider": provider,
        "threads": threads,
        "p50_ms": round(p50, 4),
        "p95_ms": round(p95, 4),
        "p99_ms": round(p99, 4),
        "mean_ms": round(float(ms.mean()), 4),
        "min_ms": round(float(ms.min()), 4),
        "throughput_fps": round(len(ms) / (float(ms.sum()) / 1000.0), 2),
        "samples_ms": [round(float(v), 4) for v in ms],
    }


def _comparison(rows: list[dict[str, Any]], paths: list[Path]) -> list[dict[str, Any]]:
    """With two or more models: each later model against the first, per provider and thread count."""
    if len(paths) < 2:
        return []
    base = str(paths[0])
    by_key = {(r["path"], r["provider"], r["threads"]): r for r in rows}
    out = []
    for r in rows:
        ref = by_key.get((base, r["provider"], r["threads"]))
        if r["path"] == base or ref is None:
            continue
        out.append(
            {
                "baseline": ref["model"],
                "model": r["model"],
                "provider": r["provider"],
                "threads": r["threads"],
                "p50_speedup": round(ref["p50_ms"] / r["p50_ms"], 3),
                "throughput_ratio": round(r["throughput_fps"] / ref["throughput_fps"], 3),
                "size_ratio": round(r["size_bytes"] / ref["size_bytes"], 4),
            }
        )
    return out


def render_bench(report: dict[str, Any]) -> None:
    """Print one row per measurement, then the side-by-side comparison."""
    from rich.table import Table  # noqa: PLC0415

    console = stdout_console()
    m = report["machine"]
    console.print(
        f"{m['platform']}, {m['cores']} core(s), onnxruntime {m['onnxruntime']}; "
        f"{report['warmup']} warm-up + {report['runs']} timed runs each"
    )
    # no box and whole figures: 80 columns hold the figures, and a long model name folds onto a second line
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("model", "size", "provider", "threads", "p50 ms", "p95 ms", "p99 ms", "frames/s"):
        table.add_column(
            col, justify="left" if col in ("model", "provider") else "right", no_wrap=col != "model", overflow="fold"
        )
    for r in report["results"]:
        table.add_row(
            r["model"],
            human_bytes(r["size_bytes"]),
            r["provider"].removesuffix("ExecutionProvider"),
            str(r["threads"] or "auto"),
            f"{r['p50_ms']:.3f}",
            f"{r['p95_ms']:.3f}",
            f"{r['p99_ms']:.3f}",
            f"{r['throughput_fps']:.1f}",
        )
    console.print(table)
    if report["comparison"]:
        side = Table(
            title="side by side (vs the first model)",
            title_justify="left",
            header_style="bold",
            box=None,
            pad_edge=False,
        )
        for col in ("model", "vs", "provider", "threads", "p50 speed-up", "throughput", "size"):
            side.add_column(col, no_wrap=col not in ("model", "vs"), overflow="fold")
        for c in report["comparison"]:
            side.add_row(
                c["model"],
                c["baseline"],
                c["provider"].removesuffix("ExecutionProvider"),
                str(c["threads"] or "auto"),
                f"{c['p50_speedup']:.2f}x",
                f"{c['throughput_ratio']:.2f}x",
                f"{c['size_ratio']:.0%}",
            )
        console.print(side)


def plot_bench(report: dict[str, Any], out: Path) -> str:
    """Box plot of the latency distributions to a PNG; returns a message (how to install matplotlib if missing)."""
    try:
        import matplotlib as mpl  # noqa: PLC0415

        mpl.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return "matplotlib is not installed, so no plot: pip install 'edged[plot]'"
    rows = report["results"]
    labels = [
        f"{r['model']}\n{r['provider'].removesuffix('ExecutionProvider')} t={r['threads'] or 'auto'}" for r in rows
    ]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(rows)), 4.5))
    ax.boxplot([r["samples_ms"] for r in rows], showfliers=True)
    ax.set_xticks(range(1, len(rows) + 1), labels, fontsize=8)
    ax.set_ylabel("latency per run (ms)")
    ax.set_title(f"edged bench: {report['runs']} runs after {report['warmup']} warm-up")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return f"plot written to {out}"
