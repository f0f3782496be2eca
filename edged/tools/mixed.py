"""Mixed precision: which nodes `edged quantize` keeps in float when int8 everywhere loses the answers, and in
what order it tries them.

Two sources of candidates, in this order:

1. **The graph's structure**, the standard places int8 fails in a detector's head (recognised by the ops and
   their wiring, never by a model's name):
   - a Concat on the way to an output that joins tensors of different ranges: a probability (made by a
     Sigmoid or Softmax) with anything else, such as YOLO's box coordinates in input pixels (0..640) beside its
     class scores (0..1), where one int8 scale rounds every score to a few steps;
   - DFL (distribution focal loss): a Softmax over the bins that a Conv or MatMul turns into a distance;
   - the last Sigmoid / Softmax before an output (a DB text head's probability map, class scores), whose
     input is a logit of wide range and whose output is read to its last bits by a threshold.
   Each group holds the node and everything between it and the outputs (shape-only ops, the Concats of a
   head), so no Q/DQ pair is left after it with one scale for mixed ranges.
2. **Sensitivity**: the stretches where the error of the fastest int8 model comes in (sensitivity.py), the
   noisiest first, each with the nodes that read its output.

The search (quantize.py) keeps the structural groups in float one at a time, then the sensitivity groups in
batches that double (1, 2, 4, ...), judging and timing each model, and stops at the first that passes: more
float never makes a model faster. When that step added several groups, it bisects back over them (twice at
most): half of them may have been enough, and faster.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from edged.tools.sensitivity import TensorError

SHAPE_OPS = frozenset(
    {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Cast", "Slice", "Gather", "Split",
     "Expand", "Tile", "Pad"}
)  # fmt: skip
PROBABILITY_OPS = frozenset({"Sigmoid", "Softmax", "LogSoftmax", "HardSigmoid"})
HEAD_OPS = SHAPE_OPS | {"Concat"}  # what may lie between a head's node and the outputs
DISTANCE_OPS = frozenset({"Conv", "MatMul", "Gemm", "ReduceSum"})  # what turns DFL's bins into a distance
MAX_CONE = 48  # nodes between a head's node and the outputs, at most: a head, not the whole network
MAX_SHARE = 0.5  # of the graph's nodes kept in float at most: beyond, int8 has nothing left to gain


@dataclass(frozen=True)
class Group:
    """Nodes kept in float together, and why (for the report)."""

    why: str
    nodes: tuple[str, ...]


@dataclass
class _Wiring:
    makers: dict[str, Any]  # tensor -> the node that makes it
    readers: dict[str, list[Any]]  # tensor -> the nodes that read it
    outputs: set[str]  # the graph's outputs

    @classmethod
    def of(cls, graph: Any) -> _Wiring:
        makers: dict[str, Any] = {}
        readers: dict[str, list[Any]] = {}
        for node in graph.node:
            for name in node.input:
                readers.setdefault(name, []).append(node)
            for name in node.output:
                makers[name] = node
        return cls(makers, readers, {o.name for o in graph.output})

    def cone(self, node: Any) -> list[Any] | None:
        """The nodes from `node` to the outputs when only head ops lie between (None when anything else does,
        when they are too many, or when no output is reached)."""
        found: dict[str, Any] = {}
        todo, reaches = [node], False
        while todo:
            current = todo.pop()
            if current.name in found:
                continue
            found[current.name] = current
            if len(found) > MAX_CONE:
                return None
            for out in current.output:
                reaches = reaches or out in self.outputs
                for reader in self.readers.get(out, []):
                    if reader.op_type not in HEAD_OPS:
                        return None
                    todo.append(reader)
        return list(found.values()) if reaches else None

    def origin(self, tensor: str) -> str | None:
        """The op that made `tensor`, looking through shape-only ops (None for an input or a weight)."""
        seen: set[str] = set()
        while tensor in self.makers and tensor not in seen:
            seen.add(tensor)
            node = self.makers[tensor]
            if node.op_type not in SHAPE_OPS or not node.input:
                return str(node.op_type)
            tensor = node.input[0]
        return None

    def distance_reader(self, node: Any) -> list[Any]:
        """The shape-only path from a Softmax to the Conv/MatMul that reads its bins (DFL), or []."""
        path, tensor = [], node.output[0]
        for _ in range(8):
            readers = self.readers.get(tensor, [])
            if len(readers) != 1:
                return []
            reader = readers[0]
            path.append(reader)
            if reader.op_type in DISTANCE_OPS:
                return path
            if reader.op_type not in SHAPE_OPS:
                return []
            tensor = reader.output[0]
        return []


def structural_groups(graph: Any) -> list[Group]:
    """The head's standard trouble spots (module docstring), the worst first: Concats that mix ranges, DFL,
    then the last Sigmoid / Softmax before an output."""
    wiring = _Wiring.of(graph)
    concats, dfl, last = [], [], []
    for node in graph.node:
        if node.op_type == "Concat":
            kinds = {"probability" if wiring.origin(t) in PROBABILITY_OPS else "other" for t in node.input if t}
            cone = wiring.cone(node) if len(kinds) > 1 else None
            if cone is not None:
                concats.append(Group(f"the {node.name} Concat joins probabilities and other values on the way "
                                     "to an output (one int8 scale for both)", _names(cone)))  # fmt: skip
        elif node.op_type in PROBABILITY_OPS:
            path = wiring.distance_reader(node) if node.op_type == "Softmax" else []
            if path:
                dfl.append(Group(f"DFL: the {node.name} Softmax over the bins and the {path[-1].name} "
                                 f"{path[-1].op_type} that reads them", _names([node, *path])))  # fmt: skip
            elif (cone := wiring.cone(node)) is not None:
                last.append(Group(f"the last {node.op_type} before an output ({node.name})", _names(cone)))
    return [*concats, *dfl, *last]


def sensitivity_groups(graph: Any, errors: list[TensorError]) -> list[Group]:
    """One group per measured stretch, the noisiest first (sensitivity.py): its region and the readers of its
    output, so that no Q/DQ pair is left on either side of it. Stretches that lose nothing are left out."""
    wiring = _Wiring.of(graph)
    groups = []
    for e in errors:
        if e.added_db <= 0:
            continue
        nodes = {*e.region, *(n.name for n in wiring.readers.get(e.tensor, []))}
        groups.append(Group(f"{e.tensor} ({e.op_type}) loses {e.added_db:.1f} dB", tuple(sorted(nodes))))
    return groups


@dataclass(frozen=True)
class Plan:
    """The node sets the search tries, each a superset of the one before, and whether the share cap cut it short
    (for the refusal's "why nothing better exists")."""

    sets: list[tuple[str, ...]]
    capped: bool
    cap: int  # nodes in float at most
    batches: list[list[Group]] = field(default_factory=list)  # the groups each set added to the one before

    def narrower(self, step: int, groups: int) -> tuple[str, ...]:
        """The set before `step` with only the first `groups` groups of that step's batch: for a bisection
        back from a step that passed (its batch doubled the float nodes; maybe half of them were enough)."""
        before = set(self.sets[step - 1]) if step else set()
        return tuple(sorted(before.union(*(g.nodes for g in self.batches[step][:groups]))))


def steps(structural: list[Group], measured: list[Group], node_count: int) -> Plan:
    """The structural groups one at a time, then the measured ones in batches that double; never more than
    MAX_SHARE of the graph's nodes after the first step, and never a set that adds nothing."""
    cap = max(1, int(MAX_SHARE * node_count))
    chosen: set[str] = set()
    batches = [[g] for g in structural]
    size, start = 1, 0
    while start < len(measured):
        batches.append(measured[start : start + size])
        start, size = start + size, size * 2
    sets: list[tuple[str, ...]] = []
    added: list[list[Group]] = []
    for batch in batches:
        grown = chosen.union(*(g.nodes for g in batch))
        if grown == chosen:
            continue
        if len(grown) > cap and chosen:  # the first step goes whatever its size (a small model's stretch)
            return Plan(sets, capped=True, cap=cap, batches=added)
        chosen = grown
        sets.append(tuple(sorted(chosen)))
        added.append(batch)
    return Plan(sets, capped=False, cap=cap, batches=added)


def _names(nodes: list[Any]) -> tuple[str, ...]:
    return tuple(sorted(str(n.name) for n in nodes if n.name))
