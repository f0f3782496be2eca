"""Model outputs -> the `result` object of a message: `classify` (top-k with labels), `raw` or `detect`."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol, TypeVar

import numpy as np
import numpy.typing as npt
from pydantic import Field

from edged.core.errors import ModelError
from edged.core.registry import Registry
from edged.core.settings import Strict
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


def _shown(names: list[str], shapes: list[list[Any]], index: int) -> str:
    return f"{names[index]} {['?' if not isinstance(d, int) else d for d in shapes[index]]}"


def labels_field() -> Any:
    """The `labels` key of a postprocess section (classify, detect)."""
    return Field(
        None,
        description="The labels in class order: inline ([person, car]) or a UTF-8 text file with one label per line "
        "(blank lines skipped); default: the model's metadata (edged.labels, else Ultralytics' names or "
        "PaddlePaddle's character).",
    )


class ClassifyConfig(Strict):
    """Classification: softmax if the model gives logits, top-k with labels."""

    PRODUCES: ClassVar[str] = CLASSES

    type: Literal["classify"] = Field(description="Postprocessor type key.")
    top_k: int = Field(3, ge=1, le=1000, description="How many classes to report.")
    labels: Labels = labels_field()
    output: str | None = output_field()
    softmax: Literal["auto", "always", "never"] = Field(
        "auto", description="auto: apply softmax unless the outputs already sum to 1."
    )


class RawConfig(Strict):
    """Raw outputs: shape, dtype and summary per output; values included up to a cap."""

    PRODUCES: ClassVar[str] = RAW

    type: Literal["raw"] = Field(description="Postprocessor type key.")
    max_values: int = Field(64, ge=0, description="Include at most this many values per output.")


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


# type key -> (config model, factory); each postprocessor registers itself in its own module; third-party
# decoders come in through the `edged.postprocessors` entry point (docs/models.md: "Your own decoder")
POSTPROCESSORS: Registry[PostprocessorFactory] = Registry(
    "postprocessor",
    "type",
    (
        "edged.model.postprocess",
        "edged.model.detect",
        "edged.model.centernet",
        "edged.model.gfl",
        "edged.model.text",
        "edged.model.segment",
        "edged.model.detr",
    ),
    plugins="edged.postprocessors",
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


class Classify:
    """Top-k classes of its output; softmax when the output is logits."""

    def __init__(self, cfg: ClassifyConfig, labels: list[str] | None, index: int = 0) -> None:
        self.top_k = cfg.top_k
        self.softmax = cfg.softmax
        self.labels = labels
        self.index = index  # the output it reads

    def __call__(self, outputs: list[npt.NDArray[Any]], geometry: Geometry | None = None) -> dict[str, Any]:  # noqa: ARG002
        """Return {"top": [{"index", "label", "score"}, ...]} best first; with labels, a class beyond them is
        not published (a bare number is no label): ModelError when the model has more classes than labels."""
        scores = np.asarray(outputs[self.index], dtype=np.float32).reshape(-1)
        if self.labels is not None and scores.size != len(self.labels):
            raise ModelError(f"the model gave {scores.size} class scores for {len(self.labels)} labels")
        if self.softmax == "always" or (self.softmax == "auto" and not _is_distribution(scores)):
            exp = np.exp(scores - scores.max())
            scores = exp / exp.sum()
        k = min(self.top_k, scores.size)
        idx = np.argpartition(-scores, k - 1)[:k]
        idx = idx[np.argsort(-scores[idx])]
        return {"top": [self._entry(int(i), float(scores[i])) for i in idx]}

    def _entry(self, index: int, score: float) -> dict[str, Any]:
        label = self.labels[index] if self.labels and index < len(self.labels) else str(index)
        return {"index": index, "label": label, "score": round(score, 5)}


def _is_distribution(scores: npt.NDArray[np.float32]) -> bool:
    return bool(scores.min() >= 0.0 and scores.max() <= 1.0 and abs(float(scores.sum()) - 1.0) < 1e-3)


class Raw:
    """Every output: name, shape, dtype, min/max/mean, and its first `max_values` values."""

    def __init__(self, cfg: RawConfig, names: list[str]) -> None:
        self.max_values = cfg.max_values
        self.names = names

    def __call__(self, outputs: list[npt.NDArray[Any]], geometry: Geometry | None = None) -> dict[str, Any]:  # noqa: ARG002
        """Return {"outputs": [...]} with values capped so a message stays small."""
        items = []
        for name, out in zip(self.names, outputs, strict=True):
            arr = np.asarray(out)
            flat = arr.reshape(-1)
            numeric = flat.astype(np.float64) if flat.size and np.issubdtype(flat.dtype, np.number) else None
            items.append(
                {
                    "name": name,
                    "shape": list(arr.shape),
                    "dtype": str(arr.dtype),
                    "min": float(numeric.min()) if numeric is not None else None,
                    "max": float(numeric.max()) if numeric is not None else None,
                    "mean": float(numeric.mean()) if numeric is not None else None,
                    "values": flat[: self.max_values].tolist(),
                    "truncated": bool(flat.size > self.max_values),
                }
            )
        return {"outputs": items}


@POSTPROCESSORS.register("classify", ClassifyConfig)
def make_classify(
    cfg: ClassifyConfig,
    output_names: list[str],
    output_shapes: list[list[Any]],
    metadata: dict[str, str],
    input_size: tuple[int, int] | None,  # noqa: ARG001
) -> Postprocessor:
    """`classify`: top-k of one output (`output`, or the only one that fits); the labels must match its classes."""
    labels = load_labels(cfg.labels, metadata)
    index = pick_output("classify", cfg.output, output_names, output_shapes, _scores_shape)
    shape = output_shapes[index]
    if not _scores_shape(shape):
        raise ModelError(
            f"classify needs one score per class ([1, classes]); the model's output {output_names[index]} is "
            f"{shape}, a map or a detection head: use the postprocess type of its family (detect, centernet, "
            "gfl, text) or raw"
        )
    classes = shape[-1] if shape and isinstance(shape[-1], int) else None
    if labels is not None and classes is not None and len(labels) != classes:
        raise ModelError(
            f"{len(labels)} labels for a model with {classes} classes; fix postprocess.labels or the model"
        )
    count = f"{len(labels)} labels" if labels else f"{classes or '?'} classes, no labels"
    return with_reading(
        Classify(cfg, labels, index), f"classify: output {_shown(output_names, output_shapes, index)}, {count}"
    )


def _scores_shape(shape: list[Any]) -> bool:
    """One score per class: at most one axis past the batch that is not 1."""
    return len(shape) >= 1 and len([d for d in shape[1:] if not isinstance(d, int) or d != 1]) <= 1


@POSTPROCESSORS.register("raw", RawConfig)
def make_raw(
    cfg: RawConfig,
    output_names: list[str],
    output_shapes: list[list[Any]],  # noqa: ARG001  (every factory takes the same arguments)
    metadata: dict[str, str],  # noqa: ARG001
    input_size: tuple[int, int] | None,  # noqa: ARG001
) -> Postprocessor:
    """`raw`: every output summarised."""
    return with_reading(Raw(cfg, output_names), f"raw: every output ({', '.join(output_names)}), summarised")


def make_postprocessor(
    cfg: Any,
    output_names: list[str],
    output_shapes: list[list[Any]],
    metadata: dict[str, str],
    input_size: tuple[int, int] | None = None,
) -> Postprocessor:
    """Build the configured postprocessor (by its `type`) and check it fits the model's outputs."""
    return POSTPROCESSORS.factory(cfg.type)(cfg, output_names, output_shapes, metadata, input_size)
