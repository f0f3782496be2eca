"""Human units in the config: sizes ("256MB", "64MiB", 1048576) and durations ("7d", "12h", 30)."""

from __future__ import annotations

import re

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$", re.IGNORECASE)
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_size(value: object) -> object:
    """Bytes from an int or a string like "256MB" (decimal) or "64MiB" (binary); other types unchanged."""
    if not isinstance(value, str):
        return value
    match = _SIZE.match(value)
    if match is None:
        raise ValueError(f"not a size: {value!r}; write e.g. 268435456, 256MB or 256MiB")
    number, unit = float(match.group(1)), (match.group(2) or "").lower()
    binary = "i" in unit
    letter = unit.rstrip("b").rstrip("i")
    scale = 1024 ** "kmgt".index(letter) * 1024 if binary and letter else _SIZE_UNITS[letter]
    return int(number * scale)


def parse_duration(value: object) -> object:
    """Seconds from a number or a string like "7d", "12h", "30m", "45s", "500ms"; other types unchanged."""
    if not isinstance(value, str):
        return value
    match = _DURATION.match(value)
    if match is None:
        raise ValueError(f"not a duration: {value!r}; write e.g. 604800, 7d, 12h, 30m or 45s")
    return float(match.group(1)) * _DURATION_UNITS[(match.group(2) or "s").lower()]
