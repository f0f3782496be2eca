"""The model stage's config sections: `model` (the ONNX file and how ONNX Runtime runs it) and
`preprocess` (how a frame becomes the model input). Postprocessing sections live with their
postprocessors (postprocess.py, detect.py)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from edged.core.settings import Duration, Strict, from_config_dir, is_file, look_up
from edged.model.feeds import ModelInput

DEFAULT_PROVIDERS = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]


class ModelConfig(Strict):
    """The ONNX model and how ONNX Runtime runs it."""

    path: Path = Field(description="The .onnx file (relative paths are relative to the config file).")
    providers: list[str] = Field(
        default_factory=lambda: list(DEFAULT_PROVIDERS),
        min_length=1,
        description="Execution providers in order of preference; intersected with what the runtime offers.",
    )
    require_provider: bool = Field(
        False, description="Fail at startup instead of warning when the first provider is not used."
    )
    threads: int = Field(
        0, ge=0, description="intra_op threads per model run; 0 = auto (see concurrency and docs/models.md)."
    )
    concurrency: int = Field(
        0,
        ge=0,
        le=16,
        description="Frames run through the model at once, by threads sharing the one session; 0 = auto: "
        "on the CPU provider one run per core (max 4) with one thread each, on a GPU provider 1.",
    )
    inter_op_threads: int = Field(0, ge=0, description="inter_op threads; 0 lets ONNX Runtime decide.")
    warmup_runs: int = Field(2, ge=0, description="Runs on a blank input before the pipeline is ready.")
    cuda_device_id: int = Field(0, ge=0, description="GPU index for CUDA and TensorRT.")
    trt_engine_cache_dir: Path | None = Field(None, description="TensorRT engine cache; default <state_dir>/trt-cache.")
    trt_fp16: bool = Field(True, description="Let TensorRT use fp16 kernels.")
    trt_int8: bool = Field(True, description="Let TensorRT use int8 kernels (QDQ models).")
    sha256: str | None = Field(
        None, pattern=r"^[0-9a-fA-F]{64}$", description="Pin: refuse a model file with another sha256."
    )
    inputs: dict[str, ModelInput] = Field(
        default_factory=dict,
        description="The model's other inputs by name, beside the frame: {value: N} a constant, {state_from: OUTPUT} "
        "a recurrent state carried from that output (see edged/model/feeds.py).",
    )
    provider_options: dict[str, dict[str, str | int | float | bool]] = Field(
        default_factory=dict, description="Extra options per provider, passed through as given."
    )
    proven_after_s: Duration = Field(
        60.0,
        description="A model that ran this long (and gave at least 10 results, without a failure) becomes the "
        "pipeline's last good model, kept under <state_dir>/models/ for a start whose model cannot run.",
    )
    custom_ops: list[Path] = Field(
        default_factory=list,
        description="Libraries of custom operators ONNX Runtime loads for this model (for example "
        "onnxruntime-extensions' library); relative paths are relative to the config file. Native code: a model "
        "that crashes in it is set aside at the next start (docs/models.md).",
    )

    @field_validator("path")
    @classmethod
    def _model_exists(cls, value: Path, info: ValidationInfo) -> Path:
        path = from_config_dir(value, (info.context or {}).get("base_dir"))
        found = look_up(path, "the model file")
        if found is None:
            raise ValueError(f"model file not found: {path}; {_missing_model_hint(path)}")
        if not is_file(found):
            raise ValueError(f"model path is not a file: {path}")
        return path

    @field_validator("custom_ops")
    @classmethod
    def _libraries_exist(cls, value: list[Path], info: ValidationInfo) -> list[Path]:
        out = []
        for lib in value:
            path = from_config_dir(lib, (info.context or {}).get("base_dir"))
            if not is_file(look_up(path, "the custom operator library")):
                raise ValueError(f"custom operator library not found: {path}")
            out.append(path)
        return out

    @field_validator("providers")
    @classmethod
    def _known_providers(cls, value: list[str]) -> list[str]:
        known = _known_provider_names()
        for name in value:
            if name not in known:
                close = [k for k in known if k.lower().startswith(name.lower()[:4])]
                hint = f" (did you mean {close[0]}?)" if close else ""
                raise ValueError(f"unknown execution provider {name!r}{hint}; known: {', '.join(sorted(known))}")
        return value


class PreprocessConfig(Strict):
    """How a frame becomes the model's input tensor. Omitted keys come from the model's metadata."""

    size: tuple[int, int] | None = Field(None, description="[width, height] of the model input.")
    resize: Literal["stretch", "letterbox"] | None = Field(None, description="How to fit the frame.")
    interpolation: Literal["nearest", "linear", "area", "cubic"] | None = Field(
        None, description="Resampling used to resize (default linear, OpenCV's default)."
    )
    color: Literal["rgb", "bgr", "gray"] | None = Field(None, description="Channel order fed to the model.")
    layout: Literal["nchw", "nhwc"] | None = Field(None, description="Tensor layout.")
    dtype: Literal["float32", "float16", "uint8", "int8"] | None = Field(None, description="Tensor dtype.")
    scale: float | None = Field(None, description="Multiply pixel values (0..255) by this first.")
    mean: list[float] | None = Field(None, description="Subtract per channel after scaling.")
    std: list[float] | None = Field(None, description="Divide per channel after subtracting the mean.")
    pad_value: int | None = Field(None, ge=0, le=255, description="Letterbox border colour (grey level).")
    anchor: Literal["center", "top_left"] | None = Field(
        None,
        description="Where a letterboxed frame sits in the input: center (default; YOLOv5/v8 style) or top_left "
        "(padding right and below, as some models' own code pads).",
    )


def _known_provider_names() -> set[str]:
    import onnxruntime as ort  # noqa: PLC0415  (heavy; only when a config is validated)

    return set(ort.get_all_providers())


def _missing_model_hint(path: Path) -> str:
    """What to do about a missing model file. The example configs name edged's sample models where the
    installer puts them (/var/lib/edged/models); checked from a checkout, they are not there yet."""
    bundled = Path(str(files("edged") / "assets" / path.name))
    if path.suffix == ".onnx" and is_file(look_up(bundled, "the model file")):
        return f"it is one of edged's sample models, which deploy/install.sh copies there; or set model.path: {bundled}"
    return "check model.path"
