"""Which of a detector's outputs is which: the head of a YOLO-style model, or the boxes, scores, classes and
count of a model that decodes its own boxes (`detect` format `boxes`).

Named by `postprocess.outputs`, else found by name (`*box*`, `*score*`/`*conf*`, `*class*`/`*label*`,
`*num*`), else by shape: the one output shaped [.., N, 4] is the boxes, the one left beside it the scores (and a
second one left the classes, in export order). Every guess must be the only one that fits; otherwise the model
is refused and the key that decides is named. Boxes must be a list of boxes ([N, 4], [1, N, 4]): a per-cell
map ([1, h, w, 4], [1, 4, h, w]) is a box regression before its decode, refused with what to do instead.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from edged.core.errors import ModelError
from edged.core.settings import Strict

ROLES = ("count", "boxes", "scores", "classes")  # the order names are matched in ("num_boxes" is a count)
NAME_HINTS = {"count": ("num",), "boxes": ("box",), "scores": ("score", "conf"), "classes": ("class", "label")}
UNDECODED_HINT = (
    "export the model with its box decoding (and NMS), use its family's decoder (docs/models.md), or write a "
    "plugin decoder"
)


class DetectOutputs(Strict):
    """Which output is which, by name (when the automatic match cannot tell)."""

    head: str | None = Field(None, description="yolov5 / yolov8 / yolox: the head output's name.")
    boxes: str | None = Field(None, description="boxes: the boxes output's name ([1, N, 4] or [1, N, 6]).")
    scores: str | None = Field(None, description="boxes: the scores output's name ([1, N] or per class [1, N, C]).")
    classes: str | None = Field(None, description="boxes: the class index output's name ([1, N]).")
    count: str | None = Field(None, description="boxes: the output counting the valid boxes (num_dets).")


def described(names: list[str], shapes: list[list[Any]]) -> str:
    """`name [shape], ...` for messages."""
    return ", ".join(f"{n} {s}" for n, s in zip(names, shapes, strict=True))


def head_output(outputs: DetectOutputs, names: list[str], shapes: list[list[Any]]) -> int:
    """The index of a YOLO-style head: `outputs.head`, else the only output. ModelError when several."""
    if outputs.head is not None:
        if outputs.head not in names:
            raise ModelError(f"postprocess.outputs.head {outputs.head!r} is not an output ({described(names, shapes)})")
        return names.index(outputs.head)
    if len(names) > 1:
        raise ModelError(
            f"detect: a yolo head is one output; this model has {len(names)} ({described(names, shapes)}): name "
            "it with postprocess.outputs.head, or set postprocess.format: boxes if the model decodes its boxes"
        )
    return 0


def box_roles(outputs: DetectOutputs, names: list[str], shapes: list[list[Any]]) -> dict[str, int]:
    """Role (boxes, scores, classes, count) -> output index for a multi-output `boxes` model; ModelError when the
    outputs are not decoded boxes or when a role cannot be told apart."""
    roles = _named_roles(outputs, names, shapes)
    if "boxes" not in roles:
        roles["boxes"] = _boxes_by_shape(roles, names, shapes)
    _check_list_of_boxes(names[roles["boxes"]], shapes[roles["boxes"]])
    rest = [i for i in range(len(names)) if i not in roles.values()]
    for role in ("scores", "classes"):
        if role not in roles and rest:
            roles[role] = rest.pop(0)  # export order: scores, then classes
    if "scores" not in roles:
        raise ModelError(
            f"detect boxes: no scores beside the boxes ({described(names, shapes)}): name them with "
            "postprocess.outputs.scores"
        )
    if rest:
        extra = ", ".join(names[i] for i in rest)
        raise ModelError(
            f"detect boxes: cannot tell what the outputs {extra} are ({described(names, shapes)}): name the "
            "boxes, scores and classes with postprocess.outputs"
        )
    for role in ("scores", "classes"):
        i = roles.get(role, -1)
        if i >= 0 and len(shapes[i]) > 3:
            raise ModelError(
                f"detect boxes: the {role} output {names[i]} is {shapes[i]}, a per-cell map, not one entry per box: "
                f"{UNDECODED_HINT}"
            )
    return roles


def _named_roles(outputs: DetectOutputs, names: list[str], shapes: list[list[Any]]) -> dict[str, int]:
    """The roles `outputs` names, then those an output's name tells (each output one role at most)."""
    roles: dict[str, int] = {}
    for role in ROLES:
        given: str | None = getattr(outputs, role)
        if given is not None:
            if given not in names:
                raise ModelError(f"postprocess.outputs.{role} {given!r} is not an output ({described(names, shapes)})")
            roles[role] = names.index(given)
    for i, name in enumerate(names):
        low = name.lower()
        found = next((r for r in ROLES if r not in roles and any(h in low for h in NAME_HINTS[r])), None)
        if found is not None and i not in roles.values():
            roles[found] = i
    return roles


def _boxes_by_shape(roles: dict[str, int], names: list[str], shapes: list[list[Any]]) -> int:
    """The one output left whose last axis is 4."""
    fours = [i for i, s in enumerate(shapes) if i not in roles.values() and s and s[-1] == 4]
    if len(fours) > 1:
        raise ModelError(
            f"detect: {len(fours)} outputs could be the boxes ({described(names, shapes)}): name it with "
            "postprocess.outputs.boxes"
        )
    if not fours:
        raise ModelError(
            f"detect boxes: no output is a list of boxes [1, N, 4] ({described(names, shapes)}): name it with "
            "postprocess.outputs.boxes, or set postprocess.format for a YOLO head"
        )
    return fours[0]


def _check_list_of_boxes(name: str, shape: list[Any]) -> None:
    """[N, 4] or [1, N, 4] (a batch of one); a map of boxes per grid cell is a regression before its decode."""
    if len(shape) > 3 or (shape and isinstance(shape[-1], int) and shape[-1] != 4):
        raise ModelError(
            f"detect boxes: the output {name} is {shape}, not a list of boxes [1, N, 4] (a per-cell box regression "
            f"before its decode, or an anchor/prior output): {UNDECODED_HINT}"
        )
