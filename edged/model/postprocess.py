"""Model outputs -> the `result` object of a message: `classify` (top-k with labels), `raw` or `detect`."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy.typing as npt
from pydantic import Field

from edged.core.errors import ModelError
from edged.core.registry import Registry, package_modules
from edged.model.metadata import metadata_json
from edged.model.preprocess import Geometry

LABELS_KEY = "edged.labels"

# What a decoder's results are, declared by its config model as `PRODUCES` (a ClassVar) and asked by every
# consumer (tracking, zones, masks and secondary models in the pipeline's config check, Home Assistant's
# entities, quantize's and validate's judge) instead of its type key:
CLASSES = "classes"  # `top`: ranked labels with scores
DETECTIONS = "detections"  # `detections`: boxes in the detect format (keypoints or polygons may ride along)
SEGMENTS = "segments"  # `segments`: a class map's regions; the decoder has a `class_map(outputs)` method
RAW = "raw"  # anything else (the default, for a plugin that does not say)
KINDS = (CLASSES, DETECTIONS, SEGMENTS, RAW)


def produces(config: Any) -> str:
    """What results a decoder with this config (an instance or its class) gives (one of KINDS). A plugin
    written before `PRODUCES` that says `DETECTIONS = True` gives detections; one that says nothing, raw."""
    said = getattr(config, "PRODUCES", None)
    if said in KINDS:
        return str(said)
    return DETECTIONS if getattr(config, "DETECTIONS", False) is True else RAW


def producing(kind: str) -> list[str]:
    """The registered type keys whose decoders give `kind` (for messages that say which types would do)."""
    return [key for key in POSTPROCESSORS.ordered_keys() if produces(POSTPROCESSORS.configs[key]) == kind]


Labels = list[str] | Path | None


def output_field() -> Any:
    """The `output` key of a decoder that reads one output (classify, segment)."""
    return Field(
        None,
        description="The name of the output to read; default: the only output that fits (a model with several "
        "that fit is refused until this names one: edged does not guess which).",
    )


def pick_output(
    decoder: str, wanted: str | None, names: list[str], shapes: list[list[Any]], fits: Callable[[list[Any]], bool]
) -> int:
    """The index of the output a decoder reads: the one `wanted` names, else the only one that `fits`. ModelError
    naming the outputs (and the key that decides) when none fits or several do."""
    described = ", ".join(f"{n} {s}" for n, s in zip(names, shapes, strict=True))
    if wanted is not None:
        if wanted not in names:
            raise ModelError(f"postprocess.output {wanted!r} is not an output of the model ({described})")
        return names.index(wanted)
    fitting = [i for i, shape in enumerate(shapes) if fits(shape)]
    if len(fitting) == 1:
        return fitting[0]
    if len(fitting) > 1:
        which = ", ".join(names[i] for i in fitting)
        raise ModelError(
            f"{decoder} could read {len(fitting)} of the model's outputs ({which}); edged does not guess: name the "
            f"one with postprocess.output (the outputs: {described})"
        )
    return 0  # none fits: the decoder's own check says why, about the first


P = TypeVar("P")
READING = "reading"  # the attribute where a decoder says what it reads (check-config prints it)


def with_reading(post: P, reading: str) -> P:
    """`post`, saying what it reads: which outputs, which layout, which encoding (check-config shows it)."""
    setattr(post, READING, reading)
    return post


def reading_of(post: Postprocessor, kind: str) -> str:
    """What a decoder says it reads, or that it does not say (a plugin that predates `reading`)."""
    said = getattr(post, READING, None)
    return said if isinstance(said, str) else f"{kind} (a plugin decoder: it does not say what it reads)"


def shown(names: list[str], shapes: list[list[Any]], index: int) -> str:
    return f"{names[index]} {['?' if not isinstance(d, int) else d for d in shapes[index]]}"


def labels_field() -> Any:
    """The `labels` key of a postprocess section (classify, detect)."""
    return Field(
        None,
        description="The labels in class order: inline ([person, car]) or a UTF-8 text file with one label per line "
        "(blank lines skipped); default: the model's metadata (edged.labels, else Ultralytics' names or "
        "PaddlePaddle's character).",
    )


class DecoderSettings(Protocol):
    """What every decoder's config model has: mypy's view of a `postprocess` key (decoderunion.py); at run time
    the key is the union of every registered config model."""

    @property
    def type(self) -> str:
        """The decoder's type key."""
        ...


class Postprocessor(Protocol):
    """Outputs of one run (+ where the frame landed in the input, for box mapping) -> the `result` object."""

    def __call__(self, outputs: list[npt.NDArray[Any]], geometry: Geometry | None = None) -> dict[str, Any]:
        """Build the result."""
        ...


class PostprocessorFactory(Protocol):
    """Builds a postprocessor for a model and checks it fits the model's outputs (ModelError if not)."""

    def __call__(
        self,
        cfg: Any,
        output_names: list[str],
        output_shapes: list[list[Any]],
        metadata: dict[str, str],
        input_size: tuple[int, int] | None,
    ) -> Postprocessor:
        """The postprocessor."""
        ...


# type key -> (config model, factory); each decoder is one module of edged/model/decoders/, which registers
# itself there (every module of that package is imported when the registry is read); third-party decoders
# come in through the `edged.postprocessors` entry point the same way (docs/models.md: "Your own decoder")
POSTPROCESSORS: Registry[PostprocessorFactory] = Registry(
    "postprocessor", "type", package_modules("edged.model.decoders"), plugins="edged.postprocessors"
)


def load_labels(path: list[str] | Path | None, metadata: dict[str, str]) -> list[str] | None:
    """Labels given inline, or from a text file (one per line), else from the model's metadata, else None."""
    if isinstance(path, list):
        return [str(x) for x in path]
    if path is not None:
        try:
            return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        except OSError as exc:
            raise ModelError(f"cannot read labels file {path}: {exc.strerror}") from exc
    raw = metadata.get(LABELS_KEY)
    if raw:
        return [str(x) for x in metadata_json(raw, LABELS_KEY, list)]
    return exporter_labels(metadata)


def exporter_labels(metadata: dict[str, str]) -> list[str] | None:
    """Labels as other exporters store them: Ultralytics' `names` (a Python dict literal {0: 'person', ...})
    and PaddlePaddle's `character` (one label per line); None when neither is there or readable."""
    names = metadata.get("names")
    if names:
        try:
            parsed = ast.literal_eval(names)
        except (ValueError, SyntaxError):
            parsed = None
        if isinstance(parsed, dict) and all(isinstance(k, int) for k in parsed):
            return [str(parsed[k]) for k in sorted(parsed)]
        if isinstance(parsed, list):
            return [str(x) for x in parsed]
    character = metadata.get("character")
    if character:
        return [line.strip() for line in character.splitlines() if line.strip()]
    return None


def make_postprocessor(
    cfg: Any,
    output_names: list[str],
    output_shapes: list[list[Any]],
    metadata: dict[str, str],
    input_size: tuple[int, int] | None = None,
) -> Postprocessor:
    """Build the configured postprocessor (by its `type`) and check it fits the model's outputs."""
    return POSTPROCESSORS.factory(cfg.type)(cfg, output_names, output_shapes, metadata, input_size)
