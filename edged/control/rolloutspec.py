"""What a `model` rollout command says, and what its model check is given (edged/tools/candidate.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SHA256_PATTERN = r"^[0-9a-f]{64}$"


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Gates(_Frozen):
    """The `edged validate` gates a rollout may set (None: validate's default for that gate)."""

    min_top1: float | None = Field(None, ge=0, le=1)
    min_cosine: float | None = Field(None, ge=-1, le=1)
    min_detection_match: float | None = Field(None, ge=0, le=1)
    min_mask_iou: float | None = Field(None, ge=0, le=1)
    max_pixel_error: float | None = Field(None, ge=0)
    max_keypoint_error: float | None = Field(None, ge=0)


class ModelArgs(_Frozen):
    """The `model` command's arguments."""

    pipeline: str | None = Field(None, description="The pipeline whose model changes (default: the first).")
    sha256: str = Field(pattern=SHA256_PATTERN, description="The new model's sha256 (hex).")
    signature: str = Field(min_length=1, max_length=200, description="Ed25519 over the sha256 (edged fleet).")
    via: Literal["url", "mqtt"] = Field("url", description="url: download `url`; mqtt: retained chunks.")
    url: str | None = Field(None, max_length=2048, description="http(s):// URL of the model file.")
    frames: int = Field(30, ge=1, le=500, description="Recent frames recorded to compare the models on.")
    frames_timeout_s: float = Field(60.0, gt=0, le=600)
    gates: Gates = Gates()
    max_slowdown: float = Field(1.5, gt=0, le=100, description="New p50 latency at most this times the current.")
    watch_s: float = Field(120.0, ge=0, le=3600, description="How long the swapped model is watched.")
    min_fps_ratio: float = Field(0.8, ge=0, le=100, description="Roll back when the best rate seen in the watch "
                                 "is below this share of the rate before the swap.")  # fmt: skip
    download_timeout_s: float = Field(300.0, gt=0, le=3600)
    check_timeout_s: float = Field(300.0, gt=0, le=3600)


class CandidateSpec(_Frozen):
    """The model check's input (a JSON file the child process reads)."""

    current: Path
    candidate: Path
    frames: Path
    gates: Gates = Gates()
    preprocess: dict[str, object] | None = None  # the pipeline's preprocess overrides, as in its config
    provider: str = "CPUExecutionProvider"
    max_slowdown: float = Field(1.5, gt=0)
    speed_runs: int = Field(60, ge=5, le=10_000)
