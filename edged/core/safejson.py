"""JSON from outside, parsed at bounded cost: every message edged reads from the broker, a pushed config, a
status answer. The standard library's parser is fine for trusted text; for bytes anyone may send it has four
ways to hurt:

- deep nesting (`[[[[…`) raises RecursionError (not ValueError) in the parser or, later, in whatever walks
  the result: the depth is checked first, on the bytes, without recursion;
- `NaN`, `Infinity` and `1e999` parse to floats that pass `x > 0` checks and never age out: refused;
- an integer of thousands of digits costs quadratic time to convert (Python caps it at 4,300 digits with a
  ValueError, after the work): integers are limited to MAX_INT_DIGITS digits, more than 64 bits need;
- a NUL inside a string passes Python and SQLite but breaks PostgreSQL (jsonb refuses `\\u0000`) and C
  consumers, and so does a lone surrogate (`\\ud800`, not UTF-8): refused anywhere in the document, keys
  included.

Every refusal is an `InputError` (a ValueError, so existing `except ValueError` still holds) with a short
`reason` key that counters use and a message that says what was wrong.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

from edged.core.errors import InputError

MAX_DEPTH = 32  # no edged message nests deeper than 6; a pushed config about 8
MAX_INT_DIGITS = 20  # 2**64 has 20 digits
MAX_FLOAT_CHARS = 64  # a float longer than this is not a measurement
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_OPEN, _CLOSE = b"[{", b"]}"
_KEEP = bytes(range(256)).translate(None, _OPEN + _CLOSE)  # every byte but the brackets: deleted
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def nesting_depth(data: bytes) -> int:
    """The deepest nesting of arrays and objects in JSON text (brackets inside strings do not count).
    Linear and without recursion: the strings are cut out by one regular expression, the rest is a running
    sum over the brackets."""
    if data.count(b"[") + data.count(b"{") <= 1:
        return data.count(b"[") + data.count(b"{")
    brackets = _STRING.sub(b"", data).translate(None, _KEEP)
    return max(accumulate(_STEP[b] for b in brackets), default=0)


def _refuse_constant(name: str) -> Any:
    raise InputError("not_finite", f"{name} is not a number JSON allows here")


def _parse_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise InputError("out_of_range", f"an integer of {digits} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _parse_float(text: str) -> float:
    if len(text) > MAX_FLOAT_CHARS:
        raise InputError("out_of_range", f"a number of {len(text)} characters")
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise InputError("not_finite", f"{text[:24]} is beyond a 64-bit float")
    return value


def _check_text(text: str, what: str) -> None:
    if "\x00" in text:
        raise InputError("nul", f"{what} holds a NUL character")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (U+D800): no UTF-8 writer (PostgreSQL, a consumer) takes it
        raise InputError("not_utf8", f"{what} holds a lone surrogate") from None


def _check_strings(root: Any) -> None:
    """No NUL in any string or key (iterative: the depth is bounded already, but no recursion is needed)."""
    stack = [root]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            _check_text(item, "a string")
        elif isinstance(item, dict):
            for key, value in item.items():
                _check_text(key, "a key")
                stack.append(value)
        elif isinstance(item, list):
            stack.extend(item)


def loads(data: bytes | str, *, max_bytes: int, max_depth: int = MAX_DEPTH, what: str = "message") -> Any:
    """The parsed JSON, or InputError: larger than `max_bytes`, not UTF-8, nested deeper than `max_depth`, not
    JSON, a non-finite or oversized number, a NUL in a string."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if len(raw) > max_bytes:
        raise InputError("too_large", f"the {what} is {len(raw)} bytes; at most {max_bytes}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError("not_utf8", f"the {what} is not UTF-8 (byte {exc.start})") from None
    depth = nesting_depth(raw)
    if depth > max_depth:
        raise InputError("too_deep", f"the {what} nests {depth} deep; at most {max_depth}")
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_int=_parse_int, parse_float=_parse_float)
    except InputError:
        raise
    except (ValueError, RecursionError) as exc:  # RecursionError: unreachable after the depth check; kept
        raise InputError("not_json", f"the {what} is not JSON: {str(exc)[:120]}") from None
    _check_strings(value)
    return value


def loads_object(
    data: bytes | str, *, max_bytes: int, max_depth: int = MAX_DEPTH, what: str = "message"
) -> dict[str, Any]:
    """As `loads`, and the top level must be a JSON object."""
    value = loads(data, max_bytes=max_bytes, max_depth=max_depth, what=what)
    if not isinstance(value, dict):
        raise InputError("not_object", f"the {what} is not a JSON object")
    return value
