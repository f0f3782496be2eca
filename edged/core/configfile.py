"""Reading a config file with bounds: the file is input, and input can be hostile or broken.

A config file is small (a few KB). Before anything is built from it, this module refuses, each with a
`file:line` message and never a traceback:
- a file over MAX_BYTES (read no further than that: memory stays bounded);
- bytes that are not UTF-8 (the line of the first bad byte);
- nesting deeper than MAX_DEPTH (checked on PyYAML's event stream, which is not recursive: a 100,000-deep
  document cannot overflow the stack);
- more than MAX_NODES nodes once aliases are expanded (a "billion laughs" alias bomb is refused after
  MAX_NODES steps, not after gigabytes), and more than MAX_ALIASES alias uses;
- a key given twice in one mapping (YAML says keys are unique; PyYAML keeps the last one silently);
- an integer with more than MAX_INT_DIGITS digits (no setting needs one; Python refuses to parse 4,300+).
Aliases within the limits stay allowed (a shared `source:` block between pipelines is a fair use).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from edged.core.errors import ConfigError

MAX_BYTES = 1 << 20
MAX_DEPTH = 64
MAX_NODES = 20_000
MAX_ALIASES = 100
MAX_INT_DIGITS = 20
INT_TAG = "tag:yaml.org,2002:int"
BOOL_TAG = "tag:yaml.org,2002:bool"
STR_TAG = "tag:yaml.org,2002:str"


def read_text(path: Path) -> str:
    """The file as text, or ConfigError (unreadable, too large, not UTF-8)."""
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read config: {exc.strerror}"]) from exc
    if len(data) > MAX_BYTES:
        raise ConfigError([f"{path}:1 config: the file is larger than {MAX_BYTES // 1024} KiB; is it the right file?"])
    return decode(data, str(path))


def decode(data: bytes, source: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ConfigError(
            [f"{source}:{line} config: not UTF-8 (byte 0x{data[exc.start]:02x} at column {column}); save it as UTF-8"]
        ) from exc


def load(text: str, source: str) -> tuple[Any, yaml.Node | None]:
    """(data, root node) of one YAML document, within the bounds above; ConfigError otherwise."""
    if len(text) > MAX_BYTES:
        raise ConfigError([f"{source}:1 config: larger than {MAX_BYTES // 1024} KiB"])
    try:
        _check_events(text, source)
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return None, None
            _check_nodes(node, source)
            data = loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError([f"{source}:{line} yaml: {problem}"]) from exc
    return data, node


def _check_events(text: str, source: str) -> None:
    depth = aliases = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise ConfigError([f"{source}:{_line(event)} yaml: nested deeper than {MAX_DEPTH} levels"])
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
        elif isinstance(event, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_ALIASES:
                raise ConfigError([f"{source}:{_line(event)} yaml: more than {MAX_ALIASES} aliases (*name)"])


def _check_nodes(root: yaml.Node, source: str) -> None:
    """Walk the node graph as construction would expand it: bounded in steps, whatever aliases do;
    mapping keys that YAML 1.1 would read as booleans (on, off, yes, no) are kept as the words."""
    stack = [root]
    seen = 0
    while stack:
        node = stack.pop()
        seen += 1
        if seen > MAX_NODES:
            raise ConfigError(
                [f"{source}:{_line(node)} yaml: more than {MAX_NODES} values once aliases are expanded (alias bomb?)"]
            )
        if isinstance(node, yaml.MappingNode):
            keys: dict[str, int] = {}
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    if key.value in keys:
                        again = f"key given twice in one mapping (first on line {keys[key.value]})"
                        raise ConfigError([f"{source}:{_line(key)} {key.value}: {again}"])
                    keys[key.value] = _line(key)
                    if key.tag == BOOL_TAG and key.style is None:  # YAML 1.1 reads `on:` as True; no key of
                        key.tag = STR_TAG  # edged's is a boolean: a plain word as a key stays that word
                stack += (key, value)
        elif isinstance(node, yaml.SequenceNode):
            stack += node.value
        elif node.tag == INT_TAG and sum(c.isdigit() for c in node.value) > MAX_INT_DIGITS:
            raise ConfigError([f"{source}:{_line(node)} yaml: an integer of more than {MAX_INT_DIGITS} digits"])


def _line(item: yaml.Node | yaml.Event) -> int:
    mark = item.start_mark
    return mark.line + 1 if mark is not None else 1


DEFAULT_CONFIG_PATH = Path("/etc/edged/edged.yaml")


def default_config_path() -> Path:
    """`$EDGED_CONFIG` or /etc/edged/edged.yaml."""
    env = os.environ.get("EDGED_CONFIG")
    return Path(env) if env else DEFAULT_CONFIG_PATH
