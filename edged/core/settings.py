"""The base of every config section and the value types they share. Each stage defines its own section
(`capture/camera.py` the camera's, `store/settings.py` the spool's, ...); `edged/config.py` puts them
together into the one schema. Defaults live only in these models."""

from __future__ import annotations

import os
import stat
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


def look_up(path: Path, what: str) -> os.stat_result | None:
    """`path`'s stat (links followed), None when nothing is there. A name the system cannot look up at all (a
    part over 255 bytes, a loop of links, a folder on the way it may not enter) is a ValueError, the config
    key's problem ("cannot look up `what`: ..."): Python 3.11's `Path.exists` raises those, and a validator
    that let them through gave check-config a traceback."""
    try:
        return path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise ValueError(f"cannot look up {what}: {exc.strerror}") from None


def is_file(found: os.stat_result | None) -> bool:
    """Whether `look_up` found a regular file."""
    return found is not None and stat.S_ISREG(found.st_mode)


def from_config_dir(value: Path, base: Path | str | None) -> Path:
    """A path as a config file means it: `~` expanded, and a relative one relative to the file's folder
    (`base`, the validation context's base_dir; None for a config built in code)."""
    value = value.expanduser()
    if not value.is_absolute() and base is not None:
        return Path(base) / value
    return value
