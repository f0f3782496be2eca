"""The hostile messages found so far, kept as a corpus that every boundary must survive (commands, ingest
messages, pushed configs, status answers). Each one broke a part of edged once (see issue "Hostile bytes at
every boundary"); the property-based tests (tests/test_fuzz_boundaries.py) add generated ones beside them."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

# a fixed budget, the same examples every run: the suite stays deterministic and its time bounded
FUZZ = settings(
    max_examples=150, derandomize=True, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)

# JSON values of any shape, keys and strings included, up to a few levels deep
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=25,
)


def result(device: str, pipeline: str, seq: object, ts: object = 1764680000.0, **more: object) -> bytes:
    return json.dumps({"v": 1, "device": device, "pipeline": pipeline, "seq": seq, "ts": ts, **more}).encode()


CORPUS: dict[str, bytes] = {
    "60 kB of [": b"[" * 60_000,
    "60 kB of {": b'{"a":' * 12_000,
    "nested 40 deep": b"[" * 40 + b"]" * 40,
    "ts of 400 digits": b'{"v":1,"device":"d","pipeline":"p","seq":1,"ts":' + b"9" * 400 + b"}",
    "seq of 30 digits": b'{"v":1,"device":"d","pipeline":"p","seq":' + b"1" * 30 + b',"ts":1}',
    "seq 2^63": result("d", "p", 2**63),
    "int of 5000 digits": b'{"seq":' + b"7" * 5000 + b"}",
    "NaN": b'{"v":1,"device":"d","pipeline":"p","seq":1,"ts":NaN}',
    "Infinity": b'{"ts":Infinity}',
    "1e999": b'{"v":1,"device":"d","pipeline":"p","seq":1,"ts":1e999}',
    "NUL in a name": result("d\u0000", "p", 1),
    "NUL in a value": result("d", "p", 1, result={"label": "a\u0000b"}),
    "NUL in a key": b'{"a\\u0000":1}',
    "not UTF-8": b'{"device":"\xff\xfe"}',
    "lone surrogate": b'{"device":"\\ud800"}',
    "empty": b"",
    "whitespace": b"   \n",
    "a bare string": b'"status"',
    "null": b"null",
    "an array of junk": b"[1, 2, 3]",
    "brackets in strings": b'{"a":"' + b"[" * 5000 + b'"}',
    "escaped quote games": b'{"a":"\\"[[[[\\\\"}',
    "truncated": b'{"v":1,"device":"d","pipel',
    "bool seq": b'{"v":1,"device":"d","pipeline":"p","seq":true,"ts":1}',
    "negative ts": result("d", "p", 1, -5.0),
    "float seq": result("d", "p", 1.5),
    "200 kB string": json.dumps({"device": "d" * 200_000}).encode(),
}
