"""A pipeline's model: the session with the pre/postprocessing that fits it (config over metadata),
checked and warmed up; the reference the workers and the source read, swapped between two frames."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from edged.capture.sensor import SensorSourceConfig
from edged.core.errors import EdgedError, ModelError, ProviderError
from edged.core.stats import PipelineStats
from edged.model import engines
from edged.model.feeds import InputsError
from edged.model.outputcheck import OutputShapes
from edged.model.postprocess import Postprocessor, make_postprocessor, reading_of
from edged.model.preprocess import Preprocessor, PreprocessSpec
from edged.model.session import LoadedModel, load_model, load_problem, warm_up
from edged.model.window import WindowSpec, WindowTransform
from edged.pipeline.secondary import SecondaryModel, load_secondary, secondary_problem
from edged.pipeline.settings import PipelineConfig

log = logging.getLogger(__name__)

Notice = engines.Notice


@dataclass
class Model:
    """A loaded, checked, warmed-up model with the pre/postprocessing that fits it."""

    loaded: LoadedModel
    pre: Preprocessor | WindowTransform  # image preprocessing, or a sensor source's window -> tensor
    post: Postprocessor
    secondary: list[SecondaryModel] = field(default_factory=list)  # models on the detections' crops
    shapes: OutputShapes | None = None  # each frame's outputs are checked against these before `post` reads them


class ModelRef:
    """The pipeline's current model, swapped atomically between two frames (a reference assignment).

    It is also the source's Preparer (edged/capture/base.py): the source thread prepares the model
    input with the current model and gets back which preparation it used.
    """

    def __init__(self, model: Model) -> None:
        self.current = model

    @property
    def spec(self) -> Any:
        """The current model's preparation recipe."""
        return self.current.pre.spec

    def __call__(self, data: npt.NDArray[Any]) -> tuple[npt.NDArray[Any], object]:
        """(model input, the recipe used), with the current model."""
        pre = self.current.pre
        return pre(data), pre.spec

    def swap(self, model: Model) -> Model:
        """Make `model` current; returns the previous one."""
        old, self.current = self.current, model
        return old


def prepare_model(cfg: PipelineConfig, state_dir: Path, cores: int | None = None) -> Model:
    """Load the session, resolve pre/postprocessing (config over metadata), check shapes, warm up.

    A sensor pipeline gets a WindowTransform (edged/model/window.py) instead of image preprocessing:
    its window (channels x samples) is checked against the model input the same way.
    `cores`: the CPU cores this pipeline may use (the daemon shares them between CPU pipelines).
    """
    loaded = load_model(cfg.model, state_dir, cores=cores)
    pre, tensor_shape, input_size = _preparation(cfg, loaded)
    post = _postprocessor(cfg, loaded, input_size)
    warm_up(loaded, tensor_shape, cfg.model.warmup_runs)
    found = dry_run(cfg, loaded, pre, post)  # as check-config does: a decoder that cannot read fails now
    if found is not None:
        raise ModelError(f"{found[0]}: {found[1]}")  # its caller names the pipeline
    if loaded.feeds is not None:
        loaded.feeds.reset()
    declared = OutputShapes(loaded.output_names, [list(o.shape) for o in loaded.session.get_outputs()])
    return Model(loaded, pre, post, [load_secondary(s, state_dir, cores) for s in cfg.secondary], declared)


def _preparation(
    cfg: PipelineConfig, loaded: LoadedModel
) -> tuple[Preprocessor | WindowTransform, tuple[int, ...], tuple[int, int] | None]:
    """(the preparation, the tensor shape it makes, the image input size or None for a sensor)."""
    if isinstance(cfg.source, SensorSourceConfig):
        window = WindowSpec.resolve(
            cfg.source.window_settings(), loaded.metadata, loaded.input_shape, loaded.input_type
        )
        return WindowTransform(window), window.tensor_shape, None
    spec = PreprocessSpec.resolve(cfg.preprocess, loaded.metadata, loaded.input_shape, loaded.input_type)
    return Preprocessor(spec), spec.tensor_shape, spec.size


def _postprocessor(cfg: PipelineConfig, loaded: LoadedModel, input_size: tuple[int, int] | None) -> Postprocessor:
    shapes = [list(o.shape) for o in loaded.session.get_outputs()]
    return make_postprocessor(cfg.postprocess, loaded.output_names, shapes, loaded.metadata, input_size)


def check_pipeline_model(
    cfg: PipelineConfig, state_dir: Path, readings: list[str] | None = None
) -> tuple[str, str] | None:
    """What `prepare_model` would refuse for this pipeline as (the config key at fault, why), or None:
    the same checks on the CPU provider, one core, no warm-up (for `check-config`: no GPU engine is
    built, no device opened). The key is `model.path`, `preprocess` (`source` for a sensor's window) or
    `postprocess` (labels against the head, a forced head format that does not fit). `readings` gets what the
    decoder says it reads (which outputs, which layout, which encoding), for check-config to show."""
    model = cfg.model.model_copy(
        update={"providers": ["CPUExecutionProvider"], "require_provider": False, "warmup_runs": 0}
    )
    try:
        loaded = load_model(model, state_dir, cores=1)
    except InputsError as exc:
        return "model.inputs", str(exc)
    except EdgedError as exc:
        unloadable = load_problem(model.path)
        return "model.path", f"ONNX Runtime cannot load it: {unloadable}" if unloadable else str(exc)
    found = _check_loaded(cfg, loaded, readings)
    if found is not None:
        return found
    for i, second in enumerate(cfg.secondary):
        found = secondary_problem(second, state_dir)
        if found is not None:
            return f"secondary.{i}.{found[0]}", found[1]
    return None


def _check_loaded(cfg: PipelineConfig, loaded: LoadedModel, readings: list[str] | None) -> tuple[str, str] | None:
    try:
        pre, _, input_size = _preparation(cfg, loaded)
    except EdgedError as exc:
        return ("source" if isinstance(cfg.source, SensorSourceConfig) else "preprocess"), str(exc)
    try:
        post = _postprocessor(cfg, loaded, input_size)
    except EdgedError as exc:
        return "postprocess", str(exc)
    found = dry_run(cfg, loaded, pre, post)
    if readings is not None:  # after the synthetic frame: a layout the first real shape decided is shown
        readings.append(reading_of(post, cfg.postprocess.type))
    return found


def dry_run(
    cfg: PipelineConfig, loaded: LoadedModel, pre: Preprocessor | WindowTransform, post: Postprocessor
) -> tuple[str, str] | None:
    """Run a synthetic frame (or sensor window) through preprocess -> model -> postprocess, as the first
    real one will go: (the config key at fault, why) when a step fails, with the shapes it saw."""
    rng = np.random.default_rng(0)  # noise, not a blank: decoders see scores and sizes of every kind
    geometry = None
    if isinstance(pre, WindowTransform):
        tensor = pre(rng.standard_normal((pre.spec.window, len(pre.spec.channels))).astype(np.float32))
    else:
        w, h = cfg.frame_size or pre.spec.size
        tensor = pre(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        geometry = pre.geometry(w, h)
    try:
        outputs = loaded.run(tensor)
    except Exception as exc:  # noqa: BLE001  (ONNX Runtime's own error types: any of them means run fails)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        key = "source" if isinstance(pre, WindowTransform) else "preprocess"
        return key, f"ONNX Runtime cannot run the model on the input edged makes, {list(tensor.shape)}: {first}"
    try:
        with np.errstate(all="ignore"):  # noise may overflow an exp: a real frame's business, not a misfit
            post(outputs, geometry) if geometry is not None else post(outputs)
    except Exception as exc:  # noqa: BLE001  (a decoder that does not fit fails in numpy as often as in edged)
        shapes = ", ".join(f"{n} {list(np.shape(o))}" for n, o in zip(loaded.output_names, outputs, strict=True))
        return "postprocess", (
            f"postprocess {cfg.postprocess.type} cannot read this model's outputs ({shapes}): {exc}; "
            "pick the postprocess type of the model's family (see docs/models.md's decoders), or raw"
        )
    return None


def load_pipeline_model(
    cfg: PipelineConfig,
    state_dir: Path,
    *,
    cores: int | None = None,
    on_building: Notice | None = None,
    notify: Notice | None = None,
) -> Model:
    """`prepare_model`, announcing a TensorRT build first (`on_building` gets the status line). A model or
    provider error names the pipeline (a config may have several): the one path of `run`, reload and
    `prepare`."""
    try:
        path = engines.pending_build(cfg.model, state_dir)
        if path is None:
            return prepare_model(cfg, state_dir, cores)
        if on_building is not None:
            on_building(f"building TensorRT engine for pipeline {cfg.name}")
        with engines.build_progress(cfg.name, path, notify):
            return prepare_model(cfg, state_dir, cores)
    except (ModelError, ProviderError) as exc:
        raise type(exc)(f"pipeline {cfg.name}: {exc}") from exc


def describe_model(stats: PipelineStats, model: Model) -> None:
    """Show the model (name, sha256, provider) in the pipeline's status."""
    with stats.lock:
        stats.provider = model.loaded.provider
        stats.model_name = model.loaded.name
        stats.model_sha256 = model.loaded.sha256
        stats.model_int8 = model.loaded.int8
