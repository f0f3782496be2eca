"""What `edged inspect` proposes for a model: the preprocess and postprocess sections that fit it, or plainly
"cannot tell", with what the user must decide. Nothing is guessed: each built-in decoder is asked, with the
same factory check-config uses, whether it can read the outputs; a proposal is made only when exactly one
decoder family fits (besides `raw`, which reads anything), and an output is named whenever several could be
read. The preprocessing is read from the input's shape (where the 3 colour channels are, which axes are
fixed) and the model's own `edged.preprocess` metadata; the colour order, scale and mean cannot be told
from a shape, so they are named as the user's to set.
"""

from __future__ import annotations

import json
from typing import Any

from edged.core.errors import EdgedError
from edged.model.postprocess import POSTPROCESSORS, make_postprocessor

CHANNELS = (1, 3, 4)
OUTPUT_KEY = "output"  # a decoder that reads one output names it with this key (its config model says so)


def propose_preprocess(shape: list[Any], metadata: dict[str, str]) -> tuple[dict[str, Any] | None, list[str]]:
    """(preprocess keys, what the user must decide) for an image input of `shape`."""
    if "edged.preprocess" in metadata:
        return None, []  # the model carries it: the pipeline needs no preprocess section
    if len(shape) != 4:
        return None, [f"the input {shape} is not an image [N, C, H, W] or [N, H, W, C]: a sensor window or tensors"]
    first, last = shape[1], shape[3]
    if last in CHANNELS and first not in CHANNELS:
        layout, h, w = "nhwc", shape[1], shape[2]
    elif first in CHANNELS and last not in CHANNELS:
        layout, h, w = "nchw", shape[2], shape[3]
    else:
        return None, [f"cannot tell where the colour channels are in {shape}: set preprocess.layout (nchw or nhwc)"]
    keys: dict[str, Any] = {"layout": layout}
    decide = ["preprocess.color, scale, mean and std: a shape does not say how the model was trained"]
    if isinstance(w, int) and isinstance(h, int):
        keys["size"] = [w, h]
    else:
        decide.append("preprocess.size: the model's height and width are dynamic; give the size to run it at")
    return keys, decide


def propose(inputs: list[dict[str, Any]], outputs: list[dict[str, Any]], metadata: dict[str, str]) -> dict[str, Any]:
    """The `proposal` entry of inspect's report: {"preprocess", "postprocess", "decide"} (a section is None when
    the model carries it, or when edged cannot tell; `decide` says what is the user's)."""
    image = inputs[0]["shape"] if inputs else []
    pre, decide = propose_preprocess(image, metadata)
    size = pre.get("size") if pre else None
    carried = metadata.get("edged.preprocess")
    if carried is not None:
        try:
            size = json.loads(carried).get("size")
        except (ValueError, AttributeError):
            size = None
    input_size = (int(size[0]), int(size[1])) if isinstance(size, list) and len(size) == 2 else None
    names = [o["name"] for o in outputs]
    shapes = [[d if isinstance(d, int) else None for d in o["shape"]] for o in outputs]
    post, more = propose_postprocess(names, shapes, metadata, input_size)
    if len(inputs) > 1:
        decide.append(f"model.inputs: the model has {len(inputs)} inputs; edged feeds the frame to the first")
    return {"preprocess": pre, "postprocess": post, "decide": decide + more}


def propose_postprocess(
    names: list[str], shapes: list[list[Any]], metadata: dict[str, str], input_size: tuple[int, int] | None
) -> tuple[dict[str, Any] | None, list[str]]:
    """(postprocess keys, what the user must decide): the one decoder family that reads these outputs, or None
    with why it cannot tell."""
    fits: dict[str, tuple[dict[str, Any], list[str]]] = {}
    for kind in sorted(set(POSTPROCESSORS.keys()) - {"raw"}):
        found = _fitting_keys(kind, names, shapes, metadata, input_size)
        if found is not None:
            fits[kind] = found
    if len(fits) == 1:
        keys, choices = next(iter(fits.values()))
        if len(choices) > 1:  # the family is clear, the output is not: the user names it
            return keys, [f"postprocess.output: {keys['type']} could read any of {', '.join(choices)}; name one"]
        return keys, []
    if not fits:
        why = "no built-in decoder reads these outputs"
        if input_size is None:
            why += " that could be checked: the input size is dynamic (try the pairing with check-config)"
        return None, [f"cannot tell: {why}; use `raw` or a decoder plugin (docs/models.md)"]
    return None, [f"cannot tell: {', '.join(sorted(fits))} could each read these outputs; pick the model's family"]


def _fitting_keys(
    kind: str, names: list[str], shapes: list[list[Any]], metadata: dict[str, str], input_size: tuple[int, int] | None
) -> tuple[dict[str, Any], list[str]] | None:
    """(the keys with which decoder `kind` reads the outputs, the outputs it could read when one must be named),
    or None when it reads none of them."""
    POSTPROCESSORS.load_builtins()
    config_model = POSTPROCESSORS.configs[kind]

    def reads(keys: dict[str, Any]) -> bool:
        try:
            make_postprocessor(config_model.model_validate(keys), names, shapes, metadata, input_size)
        except (EdgedError, ValueError):
            return False
        return True

    if reads({"type": kind}):
        return {"type": kind}, []
    if OUTPUT_KEY not in config_model.model_fields:  # it reads several outputs, or decides by itself
        return None
    readable = [name for name in names if reads({"type": kind, OUTPUT_KEY: name})]
    if not readable:
        return None
    return {"type": kind, **({OUTPUT_KEY: readable[0]} if len(readable) == 1 else {})}, readable
