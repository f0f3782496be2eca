"""`edged inspect MODEL`: what a model is, what it needs, and whether this machine can run it."""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import onnxruntime as ort

from edged.core.errors import ToolError
from edged.model.session import file_sha256, load_problem
from edged.tools.common import available_providers, check_model_file, human_bytes, require_onnx, stdout_console
from edged.tools.propose import propose

log = logging.getLogger(__name__)

QDQ_OPS = {"QuantizeLinear", "DequantizeLinear"}
QOPERATOR_OPS = {
    "QLinearConv",
    "QLinearMatMul",
    "QLinearAdd",
    "QLinearMul",
    "QLinearGlobalAveragePool",
    "ConvInteger",
    "MatMulInteger",
    "DynamicQuantizeLinear",
}
PER_CHANNEL_QDQ_OPSET = 13  # QuantizeLinear/DequantizeLinear gained `axis` (per-channel) in opset 13


def inspect_model(path: Path) -> dict[str, Any]:
    """The report: I/O, opsets, size, sha256, quantization, external data, metadata, providers, loadability."""
    onnx = require_onnx()
    check_model_file(path)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        raise ToolError(f"{path} is not a readable ONNX model: {exc}") from exc
    graph = model.graph
    init_names = {t.name for t in graph.initializer}
    opsets = {op.domain or "ai.onnx": int(op.version) for op in model.opset_import}
    load_error = load_problem(path)
    loads = load_error is None
    report: dict[str, Any] = {
        "path": str(path),
        "size_bytes": path.stat().st_size,
        "sha256": file_sha256(path),
        "ir_version": int(model.ir_version),
        "producer": f"{model.producer_name} {model.producer_version}".strip(),
        "opsets": opsets,
        "onnxruntime": {"version": ort.__version__, "loads": loads, "error": load_error},
        "inputs": [_value_info(v) for v in graph.input if v.name not in init_names],
        "outputs": [_value_info(v) for v in graph.output],
        "nodes": len(graph.node),
        "parameters": _parameters(graph),
        "quantization": _quantization(model),
        "external_data": sorted(_external_files(graph)),
        "metadata": {p.key: _maybe_json(p.value) for p in model.metadata_props},
        "providers_available": available_providers(),
        "warnings": [],
    }
    report["dynamic"] = any(d is None or isinstance(d, str) for io in report["inputs"] for d in io["shape"])
    raw_metadata = {p.key: p.value for p in model.metadata_props}
    report["proposal"] = propose(report["inputs"], report["outputs"], raw_metadata) if loads else None
    report["warnings"] = _warnings(report)
    return report


def _value_info(v: Any) -> dict[str, Any]:
    t = v.type.tensor_type
    from onnx import TensorProto  # noqa: PLC0415

    shape: list[int | str | None] = []
    for d in t.shape.dim:
        if d.HasField("dim_value"):
            shape.append(int(d.dim_value))
        elif d.HasField("dim_param"):
            shape.append(d.dim_param)
        else:
            shape.append(None)
    return {
        "name": v.name,
        "dtype": TensorProto.DataType.Name(t.elem_type).lower() if t.elem_type else "unknown",
        "shape": shape,
        "dynamic_axes": [i for i, d in enumerate(shape) if not isinstance(d, int)],
    }


def _numel(dims: Any) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n


def _quantization(model: Any) -> dict[str, Any]:
    from onnx import TensorProto, numpy_helper  # noqa: PLC0415

    ops = Counter(n.op_type for n in model.graph.node)
    qdq = sum(ops[o] for o in QDQ_OPS)
    qop = sum(ops[o] for o in QOPERATOR_OPS)
    if not qdq and not qop:
        return {"quantized": False, "format": None}
    inits = {t.name: t for t in model.graph.initializer}
    per_channel = per_tensor = 0
    types: Counter[str] = Counter()
    for node in model.graph.node:
        if node.op_type != "DequantizeLinear" or len(node.input) < 2:
            continue
        scale = inits.get(node.input[1])
        if scale is not None:
            if _numel(scale.dims) > 1:
                per_channel += 1
            else:
                per_tensor += 1
        zp = inits.get(node.input[2]) if len(node.input) > 2 else None
        if zp is not None:
            dtype = TensorProto.DataType.Name(zp.data_type).lower()
            symmetric = zp.raw_data == b"" or not numpy_helper.to_array(zp).any()
            types[f"{dtype}{' symmetric' if symmetric else ''}"] += 1
    return {
        "quantized": True,
        "format": "QDQ" if qdq >= qop else "QOperator",
        "qdq_nodes": qdq,
        "qoperator_nodes": qop,
        "granularity": "per-channel" if per_channel else ("per-tensor" if per_tensor else "unknown"),
        "per_channel_tensors": per_channel,
        "per_tensor_tensors": per_tensor,
        "types": dict(types),
    }


def _parameters(graph: Any) -> int:
    """Weights held as initializers and as Constant nodes (some exporters, e.g. PaddlePaddle's, write every
    weight as a Constant: a count of initializers alone says 0)."""
    count = sum(_numel(t.dims) for t in graph.initializer)
    for node in graph.node:
        if node.op_type == "Constant":
            count += sum(_numel(a.t.dims) for a in node.attribute if a.name == "value")
    return int(count)


def _external_files(graph: Any) -> set[str]:
    from onnx import TensorProto  # noqa: PLC0415

    files: set[str] = set()
    for t in graph.initializer:
        if t.data_location == TensorProto.EXTERNAL:
            files.update(e.value for e in t.external_data if e.key == "location")
    return files


def _maybe_json(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return value


def _warnings(report: dict[str, Any]) -> list[str]:
    out = []
    opset = report["opsets"].get("ai.onnx")
    if opset is not None and opset < PER_CHANNEL_QDQ_OPSET and not report["quantization"]["quantized"]:
        out.append(
            f"opset {opset} < {PER_CHANNEL_QDQ_OPSET}: per-channel QDQ needs {PER_CHANNEL_QDQ_OPSET}; "
            "`edged quantize` upgrades it first"
        )
    if report["dynamic"]:
        out.append("dynamic input axes: give `edged quantize --shape` or preprocessing with a size")
    if not report["onnxruntime"]["loads"]:
        out.append(f"onnxruntime {ort.__version__} cannot load it: {report['onnxruntime']['error']}")
    if "edged.preprocess" not in report["metadata"]:
        out.append("no edged.preprocess metadata: the pipeline needs a preprocess section (or quantize writes one)")
    return out


def render_inspect(report: dict[str, Any]) -> None:
    """Print the report as tables."""
    from rich.table import Table  # noqa: PLC0415

    console = stdout_console()
    q = report["quantization"]
    quant = "no (fp32)" if not q["quantized"] else f"{q['format']}, {q['granularity']}, {dict(q['types']) or ''}"
    ort_info = report["onnxruntime"]
    summary = Table(box=None, show_header=False, pad_edge=False)
    summary.add_column(no_wrap=True)
    summary.add_column(overflow="fold")  # a path or a sha256 folds at the width rather than losing its end
    for key, value in (
        ("model", report["path"]),
        ("size", f"{human_bytes(report['size_bytes'])} ({report['size_bytes']} bytes)"),
        ("sha256", report["sha256"]),
        ("ir version", str(report["ir_version"])),
        ("opsets", ", ".join(f"{d} {v}" for d, v in report["opsets"].items())),
        (
            "onnxruntime",
            f"{ort_info['version']}: " + ("loads it" if ort_info["loads"] else f"FAILS: {ort_info['error']}"),
        ),
        ("producer", report["producer"] or "-"),
        ("nodes / parameters", f"{report['nodes']} / {report['parameters']:,}"),
        ("quantized", quant),
        ("external data", ", ".join(report["external_data"]) or "none"),
        ("providers here", ", ".join(report["providers_available"])),
    ):
        summary.add_row(f"[bold]{key}[/]", value)
    console.print(summary)
    io = Table(title="inputs and outputs (? = dynamic axis)", title_justify="left", header_style="bold")
    for col in ("", "name", "dtype", "shape"):
        io.add_column(col, no_wrap=col != "name", overflow="fold")  # a long tensor name folds; the rest stays whole
    for kind in ("inputs", "outputs"):
        for v in report[kind]:
            dims = ", ".join(str(d) if isinstance(d, int) else f"?{d or ''}" for d in v["shape"])
            io.add_row(kind[:-1], v["name"], v["dtype"], f"[{dims}]")
    console.print(io)
    if report["metadata"]:
        meta = Table(title="metadata", title_justify="left", header_style="bold")
        meta.add_column("key")
        meta.add_column("value", overflow="fold")
        for key, value in report["metadata"].items():
            meta.add_row(key, value if isinstance(value, str) else json.dumps(value))
        console.print(meta)
    for warning in report["warnings"]:
        console.print(f"[yellow]note:[/] {warning}")
    _render_proposal(report.get("proposal"), console)


def _render_proposal(proposal: dict[str, Any] | None, console: Any) -> None:
    """The sections that fit, as a config snippet, and what the user must decide."""
    if proposal is None:
        return
    lines = []
    for section in ("preprocess", "postprocess"):
        keys = proposal[section]
        if keys:
            body = ", ".join(f"{k}: {json.dumps(v)}" for k, v in keys.items())
            lines.append(f"    {section}: {{{body}}}")
    if lines:
        console.print("[bold]proposed[/] (pipeline keys that fit this model):")
        console.print("\n".join(lines), markup=False, highlight=False)
    for line in proposal["decide"]:
        console.print(f"[yellow]decide:[/] {line}", markup=True, highlight=False)
