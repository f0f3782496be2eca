"""Where an int8 model loses its accuracy: fp32 and int8 intermediate outputs compared tensor by tensor.

Both models are augmented to output every intermediate tensor (onnxruntime.quantization.qdq_loss_debug), run
on a few calibration frames, and each tensor of the int8 model (its dequantized value) is compared with the
same tensor of the fp32 model as a signal-to-quantization-noise ratio (SQNR, dB). Error accumulates along
the graph, so a tensor is ranked by the SQNR its producing node *loses* against the worst of its inputs:
the nodes where the error comes in, not the deep ones that only inherit it. Such a node is kept in float
with its neighbourhood: the nodes that make its inputs and the nodes that read its output, so that neither
side of it is quantized (a tensor between two quantized nodes gets a Q/DQ pair even when the node between
is left out; and a node can lose its answer to an input whose SQNR looks fine, when an outlier in one
channel sets the range and the channel it needs rounds to zero).
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edged.core.errors import ToolError
from edged.tools.calibration import arena_free_session
from edged.tools.common import require_onnx
from edged.tools.frames import Tensor

log = logging.getLogger(__name__)

FRAMES = 4  # enough to rank the nodes: millions of values per tensor (a chunk of one frame of both models is held)
SHARE = 0.05  # of the quantized graph's nodes whose output tensors stay in float
CLEAN_DB = 60.0  # the SQNR a node's input counts as when nothing before it was quantized


@dataclass(frozen=True)
class TensorError:
    """How much SQNR is lost between the nearest measured tensors before `tensor` and `tensor` itself
    (`added_db`), the SQNR left (`sqnr_db`), and the nodes that keep that stretch in float (`region`: the
    node making `tensor`, the nodes between it and those measured inputs, and the makers of those inputs)."""

    tensor: str
    node: str
    op_type: str
    sqnr_db: float
    added_db: float
    region: tuple[str, ...]


@dataclass
class _Graph:
    makers: dict[str, Any]  # tensor -> the node that makes it
    readers: dict[str, list[str]]  # tensor -> names of the nodes that read it

    @classmethod
    def of(cls, graph: Any) -> _Graph:
        makers: dict[str, Any] = {}
        readers: dict[str, list[str]] = {}
        for node in graph.node:
            for name in node.input:
                readers.setdefault(name, []).append(node.name)
            for name in node.output:
                makers[name] = node
        return cls(makers, readers)

    def upstream(self, node: Any, measured: dict[str, float]) -> tuple[float, set[str]]:
        """The worst SQNR of the nearest measured tensors above `node` (through tensors the int8 model does
        not hold, such as a Relu folded into its convolution), and the nodes on the way, their makers included."""
        worst, region, todo, seen = CLEAN_DB, {node.name}, list(node.input), set()
        while todo and len(region) < MAX_REGION:
            name = todo.pop()
            if name in seen or name not in self.makers:
                continue  # a graph input or a weight
            seen.add(name)
            maker = self.makers[name]
            region.add(maker.name)
            if name in measured:
                worst = min(worst, measured[name])
            else:
                todo.extend(maker.input)
        return worst, region


MAX_REGION = 8  # nodes one stretch may keep in float


def tensor_errors(
    float_model: Path, int8_model: Path, input_name: str, inputs: list[Tensor], tmp: Path
) -> list[TensorError]:
    """Every tensor both models hold, noisiest (most SQNR lost on the way to it) first.

    Frame by frame and a few tensors at a time: both models' activations of those tensors for one frame are
    compared and folded into per-tensor sums of signal and noise power, then dropped, so memory holds a
    chunk of one frame's activations of the two models, however many frames and tensors there are (the
    SQNR over the frames is the same as ORT's over all of them at once)."""
    onnx = require_onnx()
    with contextlib.redirect_stdout(sys.stderr):  # ORT's calibrater prints to stdout, which is for --json
        float_aug = _augmented("fp32", float_model, tmp)
        int8_aug = _augmented("int8", int8_model, tmp)
    try:
        power = _noise_power(float_aug, int8_aug, _sizes(float_model), input_name, inputs[:FRAMES], tmp)
    except Exception as exc:
        raise ToolError(f"could not compare the models' intermediate outputs: {exc}") from exc
    sqnr = {name: 10 * math.log10(max(signal, EPS) / max(noise, EPS)) for name, (signal, noise) in power.items()}
    graph = onnx.load(str(float_model)).graph
    shape = _Graph.of(graph)
    found: list[TensorError] = []
    for node in graph.node:
        for out in node.output:
            if out in sqnr:
                before, region = shape.upstream(node, sqnr)
                found.append(TensorError(out, node.name, node.op_type, sqnr[out], before - sqnr[out], tuple(region)))
    return sorted(found, key=lambda e: -e.added_db)


SAVED_SUFFIX = "_ReshapedSavedOutput"  # how ORT's qdq_loss_debug names the intermediate outputs it adds
EPS = float(np.finfo(np.float64).eps) ** 2  # ORT's SQNR floors both norms at eps (here: squared norms)


def _augmented(label: str, path: Path, tmp: Path) -> Any:
    """The model with every intermediate tensor as an extra output (ORT's qdq_loss_debug), as a ModelProto."""
    from onnxruntime.quantization import qdq_loss_debug as debug  # noqa: PLC0415

    augmented = tmp / f"{path.stem}.{label}.debug.onnx"
    try:
        debug.modify_model_output_intermediate_tensors(str(path), str(augmented))
        return require_onnx().load(str(augmented))
    except Exception as exc:
        raise ToolError(f"could not read the {label} model's intermediate outputs: {exc}") from exc
    finally:
        augmented.unlink(missing_ok=True)


CHUNK_BYTES = 384 * 2**20  # one frame's activations compared per run, of each model (estimated from shapes)


def _sizes(model_path: Path) -> dict[str, int]:
    """Bytes of each tensor of one frame whose shape is known (the prepared model's input is pinned, and
    ORT's pre-processing inferred the shapes)."""
    onnx = require_onnx()
    graph = onnx.shape_inference.infer_shapes(onnx.load(str(model_path))).graph
    sizes: dict[str, int] = {}
    for info in (*graph.value_info, *graph.output):
        dims = [d.dim_value for d in info.type.tensor_type.shape.dim]
        if dims and all(d > 0 for d in dims):
            itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(info.type.tensor_type.elem_type)).itemsize
            sizes[info.name] = math.prod(dims) * itemsize
    return sizes


def _saved(model: Any) -> list[str]:
    """The model's added outputs (every intermediate tensor, named with ORT's SAVED_SUFFIX)."""
    return [o.name for o in model.graph.output if o.name.endswith(SAVED_SUFFIX)]


def _base(name: str, suffixes: tuple[str, ...]) -> str:
    """The tensor an int8 model's saved activation belongs to (its pre- and post-QDQ forms share it)."""
    name = name.removesuffix(SAVED_SUFFIX)
    return next((name[: -len(s)] for s in suffixes if s and name.endswith(s)), name)


def _chunks(bases: list[str], cost: dict[str, int]) -> list[list[str]]:
    """Consecutive tensors whose activations (both models') add up to CHUNK_BYTES at most (one at least)."""
    chunks: list[list[str]] = [[]]
    held = 0
    for b in bases:
        if chunks[-1] and held + cost[b] > CHUNK_BYTES:
            chunks.append([])
            held = 0
        chunks[-1].append(b)
        held += cost[b]
    return [c for c in chunks if c]


def _noise_power(  # noqa: PLR0917  (the two models, what their tensors weigh, and the frames)
    float_aug: Any, int8_aug: Any, sizes: dict[str, int], input_name: str, frames: list[Tensor], tmp: Path
) -> dict[str, list[float]]:
    """Per tensor: [sum of the float tensor's squares, sum of the squared int8 - float differences].

    ORT keeps every graph output of a run until the run ends, whether it was asked for or not; so the
    tensors are compared a chunk at a time (CHUNK_BYTES of one frame's activations, from the shapes), each
    chunk with models whose only outputs are that chunk's tensors: memory holds a chunk's worth of both
    models, not every tensor of a frame (4.2 GB for two 640x480 text detectors, where ORT's own debug tool
    asks for all of them at once), and each frame runs once per chunk."""
    from onnxruntime.quantization import qdq_loss_debug as debug  # noqa: PLC0415

    suffixes = tuple(
        str(getattr(debug, n)) for n in ("QUANT_INPUT_SUFFIX", "DEQUANT_OUTPUT_SUFFIX", "_POST_QDQ_POSTFIX1")
        if hasattr(debug, n)
    )  # fmt: skip
    floats = {n.removesuffix(SAVED_SUFFIX): n for n in _saved(float_aug)}
    int8: dict[str, list[str]] = {}
    for n in _saved(int8_aug):
        int8.setdefault(_base(n, suffixes), []).append(n)
    bases = [b for b in floats if b in int8]
    guess = int(frames[0].nbytes) if frames else 1  # a tensor of unknown shape: as large as the input
    cost = {b: sizes.get(b, guess) * (1 + len(int8[b])) for b in bases}
    power: dict[str, list[float]] = {}
    for chunk in _chunks(bases, cost):
        float_names = [floats[b] for b in chunk]
        int8_names = [n for b in chunk for n in int8[b]]
        float_sess = _session_for(float_aug, float_names, tmp / "chunk.fp32.onnx")
        int8_sess = _session_for(int8_aug, int8_names, tmp / "chunk.int8.onnx")
        for x in frames:
            feed = {input_name: x}
            float_acts = _run(float_sess, float_names, feed)
            matched = debug.create_activation_matching(_run(int8_sess, int8_names, feed), float_acts)
            _accumulate(power, matched)
        del float_sess, int8_sess  # the next chunk's sessions replace them
    return power


def _session_for(model: Any, names: list[str], path: Path) -> Any:
    """A session of `model` whose graph outputs are `names` only (unoptimised, as qdq_loss_debug runs it)."""
    require_onnx().save(trimmed_to(model, names), str(path))
    try:
        return arena_free_session(path)
    finally:
        path.unlink(missing_ok=True)


def trimmed_to(model: Any, names: list[str]) -> Any:
    """A copy of the augmented `model` whose saved outputs are `names` only.

    The nodes that made the other saved outputs go too: each is a Reshape whose output ORT lays over its
    input, so left without a reader it would keep that activation alive to the end of the run (one output
    kept of 526 still held 0.74 GB of a PicoDet frame's activations)."""
    keep = set(names)
    dropped = {o.name for o in model.graph.output if o.name.endswith(SAVED_SUFFIX) and o.name not in keep}
    trimmed = require_onnx().ModelProto()
    trimmed.CopyFrom(model)
    outputs = [o for o in trimmed.graph.output if o.name not in dropped]
    nodes = [n for n in trimmed.graph.node if not (n.output and set(n.output) <= dropped)]
    del trimmed.graph.output[:]
    trimmed.graph.output.extend(outputs)
    del trimmed.graph.node[:]
    trimmed.graph.node.extend(nodes)
    return trimmed


def _run(sess: Any, names: list[str], feed: dict[str, Tensor]) -> dict[str, list[Tensor]]:
    return {n.removesuffix(SAVED_SUFFIX): [out] for n, out in zip(names, sess.run(names, feed), strict=True)}


def _accumulate(power: dict[str, list[float]], matched: dict[str, Any]) -> None:
    for name, m in matched.items():
        if not m.get("float") or not m.get("post_qdq"):
            continue
        ref = np.asarray(m["float"][0], dtype=np.float64).reshape(-1)
        got = np.asarray(m["post_qdq"][0], dtype=np.float64).reshape(-1)
        acc = power.setdefault(name, [0.0, 0.0])
        acc[0] += float(ref @ ref)
        acc[1] += float((ref - got) @ (ref - got))


def nodes_to_float(float_model: Path, errors: list[TensorError], share: float = SHARE) -> tuple[str, ...]:
    """The names of the nodes to leave out of quantization for the noisiest stretches (the worst `share` of
    the graph's nodes, at least one): each stretch's region and the readers of its output, so that no Q/DQ
    pair is left on either side of it."""
    onnx = require_onnx()
    graph = onnx.load(str(float_model)).graph
    shape = _Graph.of(graph)
    count = max(1, math.ceil(share * len(graph.node)))
    chosen: set[str] = set()
    for e in errors[:count]:
        chosen.update(e.region)
        chosen.update(shape.readers.get(e.tensor, []))
    log.info(
        "noisiest tensors: %s",
        ", ".join(f"{e.tensor} ({e.op_type}, -{e.added_db:.1f} dB)" for e in errors[:count]),
    )
    return tuple(sorted(n for n in chosen if n))


def name_nodes(model: Any) -> int:
    """Give every unnamed node a unique name (nodes are left out of quantization by name); how many."""
    taken = {n.name for n in model.graph.node if n.name}
    named = 0
    for i, node in enumerate(model.graph.node):
        if not node.name:
            candidate = f"{node.op_type}_{i}"
            while candidate in taken:
                candidate += "_"
            node.name = candidate
            taken.add(candidate)
            named += 1
    return named
