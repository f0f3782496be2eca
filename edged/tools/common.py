"""What the tools share: the optional onnx import, models opened the pipeline's way, preprocessing, output."""

from __future__ import annotations

import json
import logging
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from edged.config import load_config
from edged.core.errors import EdgedError, ModelError, ToolError
from edged.model.preprocess import Preprocessor, PreprocessSpec
from edged.model.session import CPU, LoadedModel, load_model
from edged.model.settings import ModelConfig, PreprocessConfig
from edged.pipeline.settings import PipelineConfig

if TYPE_CHECKING:
    from rich.console import Console

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'edged[tools]'"
# Providers that run a model on this machine (ONNX Runtime also lists e.g. AzureExecutionProvider, a remote call)
COMPUTE_PROVIDERS = (
    "TensorrtExecutionProvider",
    "CUDAExecutionProvider",
    "OpenVINOExecutionProvider",
    "CoreMLExecutionProvider",
    "ROCMExecutionProvider",
    "CPUExecutionProvider",
)


def require_onnx() -> ModuleType:
    """The `onnx` package, or a ToolError saying how to install it (it is an extra, not a runtime dependency)."""
    try:
        import onnx  # noqa: PLC0415
    except ImportError as exc:
        raise ToolError(f"this tool needs the onnx package, which is not installed: {INSTALL_HINT}") from exc
    return onnx


def stdout_console() -> Console:
    """Console for reports (stdout); plain text when piped. Its width is $COLUMNS when set, else the
    terminal's, else 80 (rich's rule): the tables are laid out to fit 80 columns."""
    from rich.console import Console  # noqa: PLC0415

    return Console(highlight=False, soft_wrap=False)


def stderr_console() -> Console:
    """Console for progress bars: stderr, so stdout stays clean for `--json`."""
    from rich.console import Console  # noqa: PLC0415

    return Console(stderr=True, highlight=False)


def print_json(report: dict[str, Any]) -> None:
    """The report as indented JSON on stdout."""
    sys.stdout.write(json.dumps(report, indent=2, default=str) + "\n")


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"  # pragma: no cover


def check_model_file(path: Path) -> Path:
    """The path if it is a readable file, else a ToolError naming it."""
    if not path.is_file():
        raise ToolError(f"model file not found: {path}")
    return path


def preprocess_overrides(
    config: Path | None, pipeline: str | None, preprocess_json: str | None
) -> PreprocessConfig | None:
    """Preprocessing given on the command line: a pipeline's section of a config file, then `--preprocess` JSON.

    Keys given here override the model's `edged.preprocess` metadata, as in the daemon.
    """
    values: dict[str, Any] = {}
    if config is not None:
        cfg = load_config(config)
        chosen = _pick_pipeline(cfg.pipelines, pipeline, config)
        values.update(chosen.preprocess.model_dump(exclude_none=True))
    if preprocess_json:
        try:
            extra = json.loads(preprocess_json)
        except json.JSONDecodeError as exc:
            raise ToolError(f"--preprocess is not valid JSON ({exc}); e.g. '{{\"size\": [224, 224]}}'") from exc
        if not isinstance(extra, dict):
            raise ToolError('--preprocess must be a JSON object, e.g. \'{"size": [224, 224], "color": "bgr"}\'')
        values.update(extra)
    if not values:
        return None
    try:
        return PreprocessConfig.model_validate(values)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ToolError(f"invalid preprocessing: {problems}") from exc


def pipeline_postprocess(config: Path | None, pipeline: str | None) -> Any:
    """The postprocess section of `--config FILE [--pipeline NAME]`, or None without a config: what the
    daemon will decode the model's outputs with, so quantize and validate judge by that decode."""
    if config is None:
        return None
    return _pick_pipeline(load_config(config).pipelines, pipeline, config).postprocess


def _pick_pipeline(pipelines: list[PipelineConfig], name: str | None, config: Path) -> PipelineConfig:
    if name is None:
        if len(pipelines) > 1:
            names = ", ".join(p.name for p in pipelines)
            raise ToolError(f"{config} has several pipelines ({names}); choose one with --pipeline")
        return pipelines[0]
    for p in pipelines:
        if p.name == name:
            return p
    raise ToolError(f"no pipeline {name!r} in {config}")


def resolve_preprocessor(
    overrides: PreprocessConfig | None,
    metadata: dict[str, str],
    input_shape: list[Any],
    input_type: str,
    data: Path | None = None,
) -> Preprocessor:
    """The pipeline's own preprocessing for a model: the one shape rule of every tool. The input size comes
    from the flags or `--config/--pipeline`, else the model's metadata, else its input shape, else (a
    model with dynamic axes) the size of the frames in `data`; `--shape`, where a tool takes it, pins it."""
    try:
        return Preprocessor(PreprocessSpec.resolve(overrides, metadata, input_shape, input_type))
    except EdgedError:
        size = _frame_size(data)
        if size is None or (overrides is not None and overrides.size is not None):
            raise
    log.info("input size %dx%d from the frames in %s (the model's input axes are dynamic)", *size, data)
    sized = (overrides or PreprocessConfig()).model_copy(update={"size": size})
    return Preprocessor(PreprocessSpec.resolve(sized, metadata, input_shape, input_type))


def _frame_size(data: Path | None) -> tuple[int, int] | None:
    """(width, height) of the first frame of a frame source; None without one (or for ready tensors)."""
    from edged.tools.frames import holds_tensors, iter_frames  # noqa: PLC0415

    if data is None or not data.exists() or holds_tensors(data):
        return None
    first = next(iter_frames(data, 1), None)
    return None if first is None else (int(first.shape[1]), int(first.shape[0]))


@contextmanager
def open_model(path: Path, provider: str = CPU, threads: int = 0) -> Iterator[LoadedModel]:
    """A session made exactly as the daemon makes one (provider options, graph optimisation), on `provider`.

    Raises ToolError when the session would not really run on `provider`. TensorRT engine caches go to a
    temporary folder that is removed afterwards.
    """
    check_model_file(path)
    with tempfile.TemporaryDirectory(prefix="edged-tool-") as state:
        try:
            cfg = ModelConfig.model_validate(
                {"path": str(path), "providers": [provider], "threads": threads, "concurrency": 1, "warmup_runs": 0}
            )
        except ValidationError as exc:
            raise ToolError(f"cannot use {path} on {provider}: {exc.errors()[0]['msg']}") from exc
        level = logging.getLogger("edged.model.session").level
        logging.getLogger("edged.model.session").setLevel(logging.WARNING)  # no start-up chatter per session
        try:
            model = load_model(cfg.model_copy(update={"require_provider": True}), Path(state))
        except ModelError:
            raise
        except EdgedError as exc:
            raise ToolError(str(exc)) from exc
        finally:
            logging.getLogger("edged.model.session").setLevel(level)
        yield model


def available_providers() -> list[str]:
    """Providers of the installed ONNX Runtime that run models here, best first."""
    import onnxruntime as ort  # noqa: PLC0415

    have = set(ort.get_available_providers())
    return [p for p in COMPUTE_PROVIDERS if p in have]
