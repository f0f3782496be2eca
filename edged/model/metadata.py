"""Reading JSON values from a model's `metadata_props` (edged.preprocess, edged.window, edged.labels)."""

from __future__ import annotations

import json
from typing import Any

from edged.core.errors import ModelError


def metadata_json(raw: str, key: str, kind: type[dict[str, Any]] | type[list[Any]]) -> Any:
    """Parse the metadata value `raw` of `key`; ModelError when it is not JSON or not a `kind`."""
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ModelError(f"model metadata {key!r} is not valid JSON: {exc}") from exc
    if not isinstance(value, kind):
        what = "a JSON object" if kind is dict else "a JSON list"
        raise ModelError(f"model metadata {key!r} must be {what}")
    return value
