"""Graph surgery the quantizer needs: opset upgrade, the input signature, pinning dynamic axes, opset pruning."""

from __future__ import annotations

import logging
from typing import Any

from edged.core.errors import ToolError
from edged.tools.common import require_onnx

log = logging.getLogger(__name__)

# QuantizeLinear/DequantizeLinear take `axis` (per-channel) from opset 13; ORT's quantizer emitted an invalid
# model from an opset-12 export until it was converted, so anything older is upgraded to this first.
MIN_QUANT_OPSET = 13
ORT_INPUT_TYPES = {1: "tensor(float)", 10: "tensor(float16)", 2: "tensor(uint8)", 3: "tensor(int8)"}


def upgrade_opset(model: Any) -> tuple[Any, str | None]:
    """(model at opset >= 13, a note saying what changed or None)."""
    onnx = require_onnx()
    current = next((int(op.version) for op in model.opset_import if op.domain in ("", "ai.onnx")), None)
    if current is None or current >= MIN_QUANT_OPSET:
        return model, None
    from onnx import version_converter  # noqa: PLC0415

    try:
        upgraded = version_converter.convert_version(model, MIN_QUANT_OPSET)
        onnx.checker.check_model(upgraded)
    except Exception as exc:
        raise ToolError(
            f"the model is opset {current}; per-channel QDQ needs opset {MIN_QUANT_OPSET} and onnx's version "
            f"converter failed ({exc}). Export it again with opset >= {MIN_QUANT_OPSET}"
        ) from exc
    note = f"upgraded the model from opset {current} to {MIN_QUANT_OPSET} (per-channel QDQ needs it)"
    log.info("%s", note)
    return upgraded, note


def _graph_inputs(model: Any) -> list[Any]:
    inits = {t.name for t in model.graph.initializer}
    return [v for v in model.graph.input if v.name not in inits]


def input_signature(model: Any) -> tuple[str, list[Any], str]:
    """(name, shape with None/str for dynamic axes, ORT type string) of the model's one input."""
    inputs = _graph_inputs(model)
    if len(inputs) != 1:
        names = [v.name for v in inputs]
        raise ToolError(f"the model has {len(inputs)} inputs {names}; the edged tools handle one-input models")
    v = inputs[0]
    t = v.type.tensor_type
    shape: list[Any] = []
    for d in t.shape.dim:
        if d.HasField("dim_value") and d.dim_value > 0:
            shape.append(int(d.dim_value))
        else:
            shape.append(d.dim_param or None)
    return v.name, shape, ORT_INPUT_TYPES.get(t.elem_type, f"tensor(type {t.elem_type})")


def pin_input_shape(model: Any, shape: tuple[int, ...]) -> str | None:
    """Fix the input's dynamic axes to `shape` (and the same-named axes of the outputs); a note, or None."""
    v = _graph_inputs(model)[0]
    dims = v.type.tensor_type.shape.dim
    if len(dims) != len(shape):
        raise ToolError(f"input {v.name} has rank {len(dims)} but the shape to pin is {list(shape)}")
    named: dict[str, int] = {}
    pinned: list[str] = []
    for i, (d, size) in enumerate(zip(dims, shape, strict=True)):
        if d.HasField("dim_value") and d.dim_value > 0:
            if d.dim_value != size:
                raise ToolError(f"input {v.name} axis {i} is {d.dim_value}, not {size}; fix --shape or preprocessing")
            continue
        if d.dim_param:
            named[d.dim_param] = size
        pinned.append(f"axis {i} ({d.dim_param or '?'}) = {size}")
        d.Clear()
        d.dim_value = size
    for out in model.graph.output:
        for d in out.type.tensor_type.shape.dim:
            if d.dim_param in named:
                value = named[d.dim_param]
                d.Clear()
                d.dim_value = value
    if not pinned:
        return None
    return f"pinned the dynamic input axes of {v.name}: {', '.join(pinned)}"


def prune_opset_imports(model: Any) -> None:
    """Drop opset imports of domains no node uses (the pre-processing optimiser declares every ORT domain)."""
    used = {n.domain for n in model.graph.node} | {""}
    kept = [op for op in model.opset_import if op.domain in used or op.domain == "ai.onnx"]
    del model.opset_import[:]
    model.opset_import.extend(kept)
