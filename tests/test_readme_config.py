"""The README's configuration table states the schema's real defaults (issue "The tree is the dataflow":
`spool.batch_max`/`batch_ms` were documented as 32/200 while they were 128/1000). Every row whose default
is a literal (in backticks) is checked against the pydantic schema; rows that describe a default in words
(`host name`, `unset`, `from the model`, `<state_dir>/...`) are skipped. Generating the table from the
schema is still to do; this test keeps the hand-written one true meanwhile."""

from __future__ import annotations

import contextlib
import re
import types
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO
from pydantic import BaseModel

from edged.config import Config
from edged.core.units import parse_duration, parse_size

ROW = re.compile(r"^\| (`[^|]*`) \| ([^|]*) \|")


def readme_rows() -> list[tuple[list[str], list[str]]]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("## Configuration reference", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        m = ROW.match(line)
        if m is None or "(`type:" in m.group(1):
            continue
        keys = re.findall(r"`([^`]+)`", m.group(1))
        defaults = re.findall(r"`([^`]*)`", m.group(2).replace(" (auto)", ""))
        full: list[str] = []
        for key in keys:  # `pipelines[].model.threads`, `.inter_op_threads`: the second is relative
            full.append(full[-1].rsplit(".", 1)[0] + key if key.startswith(".") and full else key)
        if defaults and len(defaults) in (1, len(full)):
            rows.append((full, defaults * len(full) if len(defaults) == 1 else defaults))
    return rows


def model_types(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation can hold (through Optional, list, unions, Annotated)."""
    origin = typing.get_origin(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if origin is typing.Annotated:
        return model_types(typing.get_args(annotation)[0])
    if origin in (list, typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in model_types(arg)]
    return []


def schema_default(key: str) -> Any:
    models: list[type[BaseModel]] = [Config]
    parts = key.replace("[]", "").split(".")
    for i, part in enumerate(parts):
        owner = next((m for m in models if part in m.model_fields), None)
        if owner is None:
            raise KeyError(key)
        field = owner.model_fields[part]
        if i == len(parts) - 1:
            return field.get_default(call_default_factory=True)
        models = model_types(field.annotation)
    raise KeyError(key)


def number(text: str, kind: type) -> Any:
    """`60`, `0.5`, `256MiB`, `7d`, `0660` (a file mode, octal) as an int or float."""
    if kind is int and text.startswith("0") and len(text) > 1:
        return int(text, 8)
    parsed: list[float] = []
    for parse in (float, parse_size, parse_duration):
        with contextlib.suppress(ValueError, TypeError):
            parsed.append(float(parse(text)))
    return kind(parsed[0]) if parsed else text


def matches(text: str, default: Any) -> bool:
    """The README's spelling of a default equals the schema's value."""
    text = text.strip().strip('"')
    if isinstance(default, bool):
        return {"true": True, "false": False}.get(text) is default
    if isinstance(default, int | float):
        return bool(number(text, type(default)) == default)
    if isinstance(default, list):
        return [t.strip() for t in text.strip("[]").split(",") if t.strip()] == default
    if isinstance(default, BaseModel | dict):  # `{type: classify}`: the keys it names, with their values
        given = yaml.safe_load(text) or {}
        actual = default.model_dump() if isinstance(default, BaseModel) else default
        return isinstance(given, dict) and all(actual.get(k) == v for k, v in given.items())
    return (Path(text) if isinstance(default, Path) else text) == default


# a default described rather than given (`<state_dir>/status.sock`, `edged-<device_id>`) is not compared
CASES = [(k, d) for keys, defaults in readme_rows() for k, d in zip(keys, defaults, strict=True) if "<" not in d]


def test_the_readme_table_was_read() -> None:
    assert len(CASES) >= 40
    assert ("spool.batch_max", "128") in CASES


@pytest.mark.parametrize(("key", "readme"), CASES, ids=[k for k, _ in CASES])
def test_a_documented_default_is_the_schema_s(key: str, readme: str) -> None:
    default = schema_default(key)
    if default is None:
        assert readme in ("", "unset"), f"{key}: README says {readme!r}, the schema has no default"
        return
    assert matches(readme, default), f"{key}: README says {readme!r}, the schema {default!r}"
