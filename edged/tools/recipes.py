"""Quantization recipes, and the measurements `edged quantize` picks one by.

A recipe is one way to quantize: activation and weight types, symmetric or asymmetric activations,
per-channel or per-tensor weights, the calibration method, and which op types are quantized. Which one
is fastest depends on the machine (VNNI or not, ARM dot-product instructions, TensorRT) and on the model
(a Relu after a convolution stays in float between Q/DQ pairs with symmetric activations), so quantize
does not guess: it tries the candidates for the target, times each beside the fp32 model on this machine
the way `edged bench` does (one thread, interleaved rounds), checks each against the fp32 outputs on
held-out calibration frames the way `edged validate` does, and keeps the fastest that passes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from edged.core.errors import ToolError
from edged.model.session import CPU, TENSORRT
from edged.tools.frames import Tensor

HEAVY_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")  # where int8 kernels pay off most
ROUNDS = 3  # timing rounds, models interleaved in each (the machine is shared and noisy)
TIME_PER_ROUND_S = 0.4  # per model and round


@dataclass(frozen=True)
class Recipe:
    """One way to quantize."""

    name: str
    activation_type: str = "int8"
    weight_type: str = "int8"
    symmetric_activations: bool = True
    per_channel: bool = True
    method: str = "minmax"
    op_types: tuple[str, ...] | None = None  # quantize only these op types; None: every one ORT can
    exclude_nodes: tuple[str, ...] = ()  # nodes left in float (the noisiest, found by measuring)

    def describe(self) -> str:
        """One line: what this recipe does."""
        acts = f"{self.activation_type} {'symmetric' if self.symmetric_activations else 'asymmetric'}"
        weights = f"{self.weight_type} {'per-channel' if self.per_channel else 'per-tensor'}"
        ops = "all ops" if self.op_types is None else "only " + "/".join(self.op_types)
        if self.exclude_nodes:
            ops += f" but {len(self.exclude_nodes)} noisiest nodes"
        return f"activations {acts}, weights {weights}, {self.method}, {ops}"

    def keeping_in_float(self, nodes: tuple[str, ...]) -> Recipe:
        """This recipe with `nodes` left out of quantization (named `<recipe>-float-<how many>`)."""
        return replace(self, name=f"{self.name}{FLOAT_SUFFIX}{len(nodes)}", exclude_nodes=nodes)


FLOAT_SUFFIX = "-float-"  # a recipe derived from another by keeping some nodes in float (mixed.py)


RECIPES = {
    r.name: r
    for r in (
        Recipe("s8-sym"),  # the only QDQ form TensorRT takes; the CPU runs it too
        Recipe("s8-sym-percentile", method="percentile"),
        Recipe("s8-sym-per-tensor", per_channel=False),
        Recipe("s8-sym-entropy", method="entropy"),  # what TensorRT's own calibrator minimises
        Recipe("u8s8", activation_type="uint8", symmetric_activations=False),  # folds Relu into ranges
        Recipe("u8s8-per-tensor", activation_type="uint8", symmetric_activations=False, per_channel=False),
        Recipe("u8s8-percentile", activation_type="uint8", symmetric_activations=False, method="percentile"),
        Recipe("u8s8-entropy", activation_type="uint8", symmetric_activations=False, method="entropy"),
        Recipe("u8s8-heavy-ops", activation_type="uint8", symmetric_activations=False, op_types=HEAVY_OPS),
        Recipe("s8-sym-heavy-ops", op_types=HEAVY_OPS),
    )
}
CANDIDATES = {
    "tensorrt": ("s8-sym", "s8-sym-percentile", "s8-sym-entropy", "s8-sym-per-tensor"),
    "cpu": (
        "s8-sym",
        "u8s8",
        "u8s8-per-tensor",
        "u8s8-percentile",
        "u8s8-entropy",
        "u8s8-heavy-ops",
        "s8-sym-heavy-ops",
    ),
}


def resolve_target(target: str) -> str:
    """`auto`: tensorrt where this onnxruntime offers TensorRT, else cpu."""
    if target == "auto":
        return "tensorrt" if TENSORRT in ort.get_available_providers() else "cpu"
    if target not in CANDIDATES:
        raise ToolError(f"--target must be auto, cpu or tensorrt, not {target!r}")
    return target


def candidates(target: str) -> list[Recipe]:
    """The recipes worth trying for a target."""
    return [RECIPES[name] for name in CANDIDATES[resolve_target(target)]]


def recipe(name: str) -> Recipe:
    """A recipe by name (`--recipe`)."""
    base, _, count = name.rpartition(FLOAT_SUFFIX)
    if base in RECIPES and (count.isdigit() or count == "noisiest"):
        raise ToolError(
            f"{name} is {base} with some nodes kept in float: give --recipe {base} --exclude-nodes with the "
            "nodes the model's edged.quantization metadata lists"
        )
    try:
        return RECIPES[name]
    except KeyError:
        raise ToolError(f"unknown recipe {name!r}; known: {', '.join(RECIPES)}") from None


def session(path: Path) -> ort.InferenceSession:
    """A one-thread CPU session, as `edged bench --threads 1` times models."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), sess_options=opts, providers=[CPU])


def outputs(sess: ort.InferenceSession, name: str, inputs: list[Tensor]) -> list[list[Tensor]]:
    """Every output of every input."""
    return [list(sess.run(None, {name: x})) for x in inputs]


def time_models(paths: list[Path], name: str, x: Tensor, tick: Any = None) -> list[float]:
    """p50 milliseconds of each model on input `x`, one thread, the models interleaved over ROUNDS rounds
    (each round runs every model for about TIME_PER_ROUND_S) so that load on a shared machine hits all alike."""
    sessions = [session(p) for p in paths]
    feed = {name: x}
    samples: list[list[float]] = [[] for _ in paths]
    for sess in sessions:  # warm-up
        for _ in range(3):
            sess.run(None, feed)
    for _ in range(ROUNDS):
        for i, sess in enumerate(sessions):
            end = time.perf_counter() + TIME_PER_ROUND_S
            runs = 0
            while runs < 5 or time.perf_counter() < end:
                t0 = time.perf_counter_ns()
                sess.run(None, feed)
                samples[i].append((time.perf_counter_ns() - t0) / 1e6)
                runs += 1
            if tick is not None:
                tick(1)
    return [float(np.median(s)) for s in samples]
