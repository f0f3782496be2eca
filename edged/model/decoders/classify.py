"""`classify`: the top-k classes of one output, with labels; softmax when the output is logits."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field

from edged.core.errors import ModelError
from edged.core.settings import Strict
from edged.model.detections import in_unit_range
from edged.model.postprocess import (
    CLASSES,
    POSTPROCESSORS,
    Labels,
    Postprocessor,
    labels_field,
    load_labels,
    output_field,
    pick_output,
    shown,
    with_reading,
)
from edged.model.preprocess import Geometry


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
    """Probabilities that sum to 1, give or take the rounding of C 8-bit values: a quantized model's softmax
    rounds each class to a step of 1/255 (uint8) or 1/127 (int8), so 1000 classes of 0.0001 each come out 0
    and the sum is short by a tenth. Taken for logits, they went through a second softmax, and a top class of
    0.9 was published as 0.0025."""
    slack = max(1e-3, scores.size / 254)
    return in_unit_range(scores) and abs(float(scores.sum()) - 1.0) <= slack


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
        Classify(cfg, labels, index), f"classify: output {shown(output_names, output_shapes, index)}, {count}"
    )


def _scores_shape(shape: list[Any]) -> bool:
    """One score per class: at most one axis past the batch that is not 1."""
    return len(shape) >= 1 and len([d for d in shape[1:] if not isinstance(d, int) or d != 1]) <= 1
