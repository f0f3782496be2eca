"""The base of every config section and the value types they share. Each stage defines its own section
(`capture/camera.py` the camera's, `store/settings.py` the spool's, ...); `edged/config.py` puts them
together into the one schema. Defaults live only in these models."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from edged.core.units import parse_duration, parse_size

NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$"
NAME_MAX = 64  # NAME_PATTERN's longest device_id / pipeline name


class Strict(BaseModel):
    """Base for every config section: unknown keys are errors, values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


Size = Annotated[int, BeforeValidator(parse_size), Field(ge=0)]
Duration = Annotated[float, BeforeValidator(parse_duration), Field(gt=0)]


def check_order(section: Any, low: str, high: str) -> None:
    """A min/max pair in the right order (`high` >= `low`), or a ValueError naming both keys."""
    if getattr(section, high) < getattr(section, low):
        raise ValueError(f"{high} must be >= {low}")


def from_config_dir(value: Path, base: Path | str | None) -> Path:
    """A path as a config file means it: `~` expanded, and a relative one relative to the file's folder
    (`base`, the validation context's base_dir; None for a config built in code)."""
    value = value.expanduser()
    if not value.is_absolute() and base is not None:
        return Path(base) / value
    return value
