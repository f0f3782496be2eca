"""From the parsed `edged <tool>` arguments to the tool call, and its report to the terminal or JSON."""

from __future__ import annotations

import argparse
import functools
import logging
import sys
from dataclasses import replace
from typing import Any

from edged.tools.common import (
    pipeline_postprocess,
    preprocess_overrides,
    print_json,
    stderr_console,
    stdout_console,
)

log = logging.getLogger(__name__)


def run_tool(args: argparse.Namespace) -> int:
    """Run the tool named by `args.command`; the process exit code."""
    handlers = {
        "inspect": _inspect,
        "quantize": _quantize,
        "validate": _validate,
        "bench": _bench,
        "budget": _budget,
        "record": _record,
    }
    return handlers[args.command](args)


def _progress(args: argparse.Namespace) -> bool:
    return not args.json or sys.stderr.isatty()


def _emit(args: argparse.Namespace, report: dict[str, Any], render: Any) -> None:
    if args.json:
        print_json(report)
    else:
        render(report)


def _inspect(args: argparse.Namespace) -> int:
    from edged.tools.inspect import inspect_model, render_inspect  # noqa: PLC0415

    report = inspect_model(args.model)
    _emit(args, report, render_inspect)
    return 0 if report["onnxruntime"]["loads"] else 1  # the report says why; a script sees it too


def _quantize(args: argparse.Namespace) -> int:
    from edged.tools.quantize import (  # noqa: PLC0415
        EXIT_SLOWER,
        Int8SlowerError,
        NoRecipePassedError,
        QuantizeOptions,
        quantize_model,
        render_quantize,
        render_search,
    )

    fixed = [args.method, args.activation_type, args.weight_type, args.per_tensor or None]
    fixed.append(args.asymmetric_activations or None)
    exclude = tuple(n.strip() for n in (args.exclude_nodes or "").split(",") if n.strip())
    fixed.append(exclude or None)
    opts = QuantizeOptions(
        calib=args.calib,
        method=args.method or "minmax",
        activation_type=args.activation_type or "int8",
        weight_type=args.weight_type or "int8",
        per_channel=not args.per_tensor,
        reduce_range={"auto": None, "yes": True, "no": False}[args.reduce_range],
        symmetric_activations=False if args.asymmetric_activations else None,
        exclude_nodes=exclude,
        search=all(f is None for f in fixed),  # today's flags are a fixed recipe: no search
        recipe=args.recipe,
        target=args.target,
        accept_slower=args.accept_slower,
        labels=_labels(args.labels),
        calib_limit=args.calib_limit,
        shape=args.shape,
        preprocess=preprocess_overrides(args.config, args.pipeline, args.preprocess),
        postprocess=pipeline_postprocess(args.config, args.pipeline),
        gates=_gates(args),
        percentile=args.percentile,
        optimize=not args.no_optimize,
        progress=_progress(args),
    )
    try:
        report = quantize_model(args.model, args.output, opts)
    except (Int8SlowerError, NoRecipePassedError) as exc:
        if args.json:
            print_json({"written": False, "error": str(exc), "search": exc.search})
        else:
            render_search(exc.search)
            stderr_console().print(f"edged: {exc}", markup=False, highlight=False)
        return EXIT_SLOWER if isinstance(exc, Int8SlowerError) else 1
    _emit(args, report, render_quantize)
    return 0


def _labels(given: str | None) -> list[str] | None:
    """`--labels`: a file with one label per line, else a comma-separated list."""
    from pathlib import Path  # noqa: PLC0415

    from edged.model.postprocess import load_labels  # noqa: PLC0415

    if given is None:
        return None
    path = Path(given)
    return load_labels(path, {}) if path.is_file() else [x.strip() for x in given.split(",") if x.strip()]


def _validate(args: argparse.Namespace) -> int:
    from edged.tools.validate import ValidateOptions, render_validate, validate_models  # noqa: PLC0415

    opts = ValidateOptions(
        data=args.data,
        limit=args.limit,
        top_k=args.top_k,
        rtol=args.rtol,
        atol=args.atol,
        task=args.task,
        mask_threshold=args.mask_threshold,
        ref_provider=args.ref_provider,
        provider=args.provider,
        preprocess=preprocess_overrides(args.config, args.pipeline, args.preprocess),
        postprocess=pipeline_postprocess(args.config, args.pipeline),
        progress=_progress(args),
    )
    gates = replace(_gates(args), max_abs=args.max_abs, require_allclose=args.require_allclose)
    report = validate_models(args.reference, args.candidate, opts, gates)
    _emit(args, report, functools.partial(render_validate, wide=args.wide))
    return 0 if report["passed"] else 1


def _gates(args: argparse.Namespace) -> Any:
    """The agreement gates given on the command line (validate, quantize)."""
    from edged.tools.validate import Thresholds  # noqa: PLC0415

    return Thresholds(
        min_top1=args.min_top1,
        min_topk=args.min_topk,
        min_cosine=args.min_cosine,
        min_mask_iou=args.min_mask_iou,
        max_pixel_error=args.max_pixel_error,
        min_detection_match=args.min_detection_match,
        max_keypoint_error=args.max_keypoint_error,
    )


def _bench(args: argparse.Namespace) -> int:
    from edged.tools.bench import BenchOptions, bench_models, plot_bench, render_bench  # noqa: PLC0415

    opts = BenchOptions(
        providers=[p.strip() for p in args.providers.split(",")] if args.providers else None,
        threads=args.threads,
        runs=args.runs,
        warmup=args.warmup,
        data=args.data,
        shape=args.shape,
        preprocess=preprocess_overrides(args.config, args.pipeline, args.preprocess),
        progress=_progress(args),
    )
    report = bench_models(args.models, opts)
    if args.plot is not None:
        sys.stderr.write(plot_bench(report, args.plot) + "\n")
    _emit(args, report, render_bench)
    return 0


def _budget(args: argparse.Namespace) -> int:
    from dataclasses import replace  # noqa: PLC0415

    from edged.tools.budget import (  # noqa: PLC0415
        BudgetInputs,
        compute_budget,
        jpeg_payload_bytes,
        measure_edge_ms,
        render_budget,
    )
    from edged.tools.networks import PRESETS  # noqa: PLC0415

    net = PRESETS[args.preset]
    overrides = {"uplink_mbps": args.uplink, "downlink_mbps": args.downlink, "rtt_ms": args.rtt}
    given = {k: v for k, v in overrides.items() if v is not None}
    if given:
        net = replace(net, **given, description=f"{args.preset} preset with {', '.join(given)} overridden")
    edge_ms, edge_from, frame = args.edge_ms, "given", args.frame or (640, 480)
    if args.model is not None:
        edge_ms, provider, model_frame = measure_edge_ms(args.model, args.provider, 50, args.shape)
        edge_from = f"measured here: p50 of {args.model.name} on {provider}"
        frame = args.frame or model_frame  # the cloud would be sent what the model takes
    payload = args.payload_kb * 1000 if args.payload_kb is not None else jpeg_payload_bytes(*frame)
    inputs = BudgetInputs(
        edge_infer_ms=edge_ms,
        payload_bytes=payload,
        network=net,
        response_bytes=args.response_bytes,
        cloud_infer_ms=args.cloud_ms,
        queue_ms=args.queue_ms,
        fps=args.fps,
        price_per_1k_calls=args.price_per_1k,
        data_price_per_gb=args.data_price_gb,
        edge_monthly_cost=args.edge_monthly,
    )
    report = compute_budget(inputs)
    report["edge"]["source"] = edge_from
    report["preset"] = args.preset
    _emit(args, report, render_budget)
    return 0


def _record(args: argparse.Namespace) -> int:
    from edged.config import load_config  # noqa: PLC0415
    from edged.core.configfile import default_config_path  # noqa: PLC0415
    from edged.tools.record import record  # noqa: PLC0415

    config = load_config(args.config or default_config_path())
    path = record(
        config, args.pipeline, args.out, frames=max(1, args.frames), every=max(1, args.every), timeout_s=args.timeout
    )
    stdout_console().print(f"wrote {path}: use it as --calib {path} or --data {path}")
    return 0
