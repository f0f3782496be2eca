"""Second models on the detections' crops (DeepStream's secondary inference): classify each detected
vehicle, read a plate, check a face.

Each `secondary` entry picks detections (`on` labels, `min_score`, the best `max_per_frame`), cuts their
boxes out of the source frame, prepares each crop with its own preprocessing (config over the model's
metadata, checked against its input like a pipeline's model) and runs them in one batch when the model's
batch dimension is dynamic, else one by one. Its postprocessor's result is attached to the detection
under `"secondary": {name: ...}`. It runs after masks (a masked detection is not classified) and its time
is the `secondary` stage of the pipeline's latency split.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import Field

from edged.core.errors import EdgedError
from edged.core.settings import NAME_PATTERN, Strict
from edged.model.decoders.classify import ClassifyConfig
from edged.model.decoders.detect import crop_box
from edged.model.decoderunion import PostprocessConfig
from edged.model.postprocess import Postprocessor, make_postprocessor
from edged.model.preprocess import Preprocessor, PreprocessSpec
from edged.model.session import LoadedModel, load_model, warm_up
from edged.model.settings import ModelConfig, PreprocessConfig


class SecondaryConfig(Strict):
    """A model run on the crops of selected detections."""

    name: str = Field(pattern=NAME_PATTERN, description="Key of its result under the detection's `secondary`.")
    model: ModelConfig
    preprocess: PreprocessConfig = Field(default_factory=PreprocessConfig)
    postprocess: PostprocessConfig = Field(default_factory=lambda: ClassifyConfig(type="classify"))
    on: list[str] = Field(default_factory=list, description="Labels whose detections it runs on (empty: all).")
    min_score: float = Field(0.0, ge=0, le=1, description="Detections scoring less are not run.")
    max_per_frame: int = Field(8, ge=1, le=256, description="At most this many detections a frame, best first.")


@dataclass
class SecondaryModel:
    """A loaded second model with its preparation; `run` attaches its results to a frame's detections."""

    cfg: SecondaryConfig
    loaded: LoadedModel
    pre: Preprocessor
    post: Postprocessor
    batched: bool  # the model's batch dimension is dynamic: one run for all crops

    def chosen(self, detections: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """The detections this model runs on, best first."""
        cfg = self.cfg
        picked = [
            d for d in detections if (not cfg.on or str(d["label"]) in cfg.on) and float(d["score"]) >= cfg.min_score
        ]
        return sorted(picked, key=lambda d: -float(d["score"]))[: cfg.max_per_frame]

    def run(self, image: npt.NDArray[Any], detections: Sequence[dict[str, Any]]) -> None:
        """Run on the chosen detections' crops of `image` and attach the results."""
        chosen = self.chosen(detections)
        if not chosen:
            return
        height, width = image.shape[:2]
        tensors = []
        for det in chosen:
            x1, y1, x2, y2 = crop_box([float(v) for v in det["box"][:4]], width, height)
            tensors.append(self.pre(np.ascontiguousarray(image[y1:y2, x1:x2])))
        if self.batched and len(tensors) > 1:
            outputs = self.loaded.run(np.concatenate(tensors))
            per_crop = [[o[i : i + 1] for o in outputs] for i in range(len(tensors))]
        else:
            per_crop = [self.loaded.run(t) for t in tensors]
        for det, out in zip(chosen, per_crop, strict=True):
            det.setdefault("secondary", {})[self.cfg.name] = self.post(out, None)


def run_secondaries(models: Sequence[SecondaryModel], image: npt.NDArray[Any], result: dict[str, Any]) -> float:
    """Every second model on the frame's detections; the milliseconds it took."""
    detections = result.get("detections")
    if not models or not isinstance(detections, list) or not detections:
        return 0.0
    t0 = time.perf_counter()
    for model in models:
        model.run(image, detections)
    return (time.perf_counter() - t0) * 1e3


def load_secondary(cfg: SecondaryConfig, state_dir: Path, cores: int | None = None) -> SecondaryModel:
    """Load, resolve its preprocessing (config over metadata), check both fit the model, warm up."""
    loaded = load_model(cfg.model, state_dir, cores=cores)
    spec = PreprocessSpec.resolve(cfg.preprocess, loaded.metadata, loaded.input_shape, loaded.input_type)
    shapes = [list(o.shape) for o in loaded.session.get_outputs()]
    post = make_postprocessor(cfg.postprocess, loaded.output_names, shapes, loaded.metadata, spec.size)
    batch = loaded.input_shape[0] if loaded.input_shape else 1
    warm_up(loaded, spec.tensor_shape, cfg.model.warmup_runs)
    return SecondaryModel(cfg, loaded, Preprocessor(spec), post, batched=not (isinstance(batch, int) and batch > 0))


def secondary_problem(cfg: SecondaryConfig, state_dir: Path) -> tuple[str, str] | None:
    """What loading this second model would refuse, as (the key at fault, why), or None (for check-config)."""
    model = cfg.model.model_copy(
        update={"providers": ["CPUExecutionProvider"], "require_provider": False, "warmup_runs": 0}
    )
    try:
        loaded = load_model(model, state_dir, cores=1)
    except EdgedError as exc:
        return "model.path", str(exc)
    try:
        spec = PreprocessSpec.resolve(cfg.preprocess, loaded.metadata, loaded.input_shape, loaded.input_type)
    except EdgedError as exc:
        return "preprocess", str(exc)
    try:
        shapes = [list(o.shape) for o in loaded.session.get_outputs()]
        make_postprocessor(cfg.postprocess, loaded.output_names, shapes, loaded.metadata, spec.size)
    except EdgedError as exc:
        return "postprocess", str(exc)
    return None
