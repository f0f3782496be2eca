"""The remote `config` command: merge, validate exactly like `check-config`, then write the file atomically.

A partial config is merged into the file's current YAML: mappings key by key, `pipelines` entry by entry
matched by `name` (a new name is added), any other list replaced whole. `replace: true` takes the given
config as the whole file. The result is written beside the file and loaded with the same loader
`check-config` uses; only when it is valid does it replace the file (the old one kept as `<file>.prev`).
Nothing changes on the device when it is not.

The merge edits the operator's file in place through ruamel.yaml's round-trip loader: comments, key order,
flow or block style and quoting stay as they were, and only the keys the command sets change. With
`replace: true` the file is the given config (in block style): nothing of the old file is kept but `.prev`.
"""

from __future__ import annotations

import io
import itertools
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError
from ruamel.yaml.util import load_yaml_guess_indent

from edged.core.durable import commit, write_atomic
from edged.core.errors import CommandError, ConfigError


def merge(base: Any, patch: Any) -> Any:
    """`patch` merged into `base` (see the module docstring); mappings are changed in place, so that a
    round-trip mapping keeps its comments and layout."""
    if isinstance(base, dict) and isinstance(patch, dict):
        for key, value in patch.items():
            if key == "pipelines" and isinstance(value, list) and isinstance(base.get(key), list):
                _merge_named(base[key], value)
            else:
                base[key] = merge(base[key], value) if key in base else value
        return base
    return patch


def _merge_named(base: list[Any], patch: list[Any]) -> None:
    index = {item.get("name"): i for i, item in enumerate(base) if isinstance(item, dict)}
    for item in patch:
        name = item.get("name") if isinstance(item, dict) else None
        if name in index:
            base[index[name]] = merge(base[index[name]], item)
        else:
            base.append(item)


def _load(text: str) -> tuple[Any, YAML]:
    """The file's YAML (round-trip: comments, order and style survive a load and dump) and a dumper with
    the file's own indentation (guessed from its text: `  - name` lists stay indented)."""
    _, indent, dash = load_yaml_guess_indent(text)
    rt = YAML()
    rt.preserve_quotes = True  # a load of its own: the guess's loader drops the quotes
    rt.width = 4096  # never re-wrap the operator's long lines
    # ruamel's guess is the indentation of a sequence's items (`  - name` and its keys: 4), which it would also
    # give every mapping; the mappings' own comes from the text (2 in every shipped config)
    rt.indent(mapping=mapping_indent(text) or indent or 2, sequence=indent or 2, offset=dash or 0)
    return rt.load(text), rt


def mapping_indent(text: str) -> int | None:
    """How far a block mapping's keys sit under their parent key: the first `key:` line (nothing after the
    colon) whose next content line is a key, not a `- ` item; None when the file has no such nesting."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    for line, nxt in itertools.pairwise(lines):
        head = line.split(" #", 1)[0].rstrip()
        if not head.endswith(":") or nxt.lstrip().startswith("-"):
            continue
        here, there = len(line) - len(line.lstrip()), len(nxt) - len(nxt.lstrip())
        if there > here and ":" in nxt:
            return there - here
    return None


def merged_text(text: str, patch: dict[str, Any], *, replace: bool = False) -> str:
    """The config file's text with `patch` merged in (or replacing it), in the file's own style."""
    current, rt = _load(text)
    new = patch if replace else merge(current or {}, patch)
    buffer = io.StringIO()
    rt.dump(new, buffer)
    return buffer.getvalue()


ConfigCheck = Callable[[Path], object]  # loads a config file as check-config does; ConfigError when it is not valid


def restore_config(path: Path, previous: bytes) -> None:
    """Put the file back as it was before a remote config that did not reload (atomically, durably)."""
    try:
        write_atomic(path, previous, mode=path.stat().st_mode & 0o777)
    except OSError as exc:
        raise CommandError("failed", f"cannot put {path} back: {exc.strerror or exc}") from exc


def apply_remote_config(path: Path, patch: dict[str, Any], *, replace: bool, check: ConfigCheck) -> bytes:
    """Validate with `check` (the daemon hands in the check-config path: schema, paths, models) and write;
    the file's previous bytes (to restore it if the reload fails). CommandError `invalid_config` (with every
    problem) or `failed`."""
    try:
        before = path.read_bytes()
        text = merged_text(before.decode("utf-8"), patch, replace=replace)
    except (OSError, YAMLError, UnicodeDecodeError) as exc:
        raise CommandError("failed", f"cannot read {path}: {exc}") from exc
    try:
        fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".remote")
    except OSError as exc:
        raise CommandError(
            "failed",
            f"cannot write beside {path}: {exc} (under systemd, the control drop-in makes /etc/edged writable)",
        ) from exc
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        try:
            check(tmp)  # the check-config path: same schema, same messages
        except ConfigError as exc:
            problems = [p.replace(str(tmp), "<remote config>") for p in exc.problems]
            raise CommandError("invalid_config", "; ".join(problems)) from None
        mode = path.stat().st_mode & 0o777
        tmp.chmod(mode)
        # both durably (fsync, rename, folder fsync): after a power cut the file is the old config or the
        # new one, whole, and `.prev` is the one before it, never a torn mix a restart would refuse
        write_atomic(path.with_name(path.name + ".prev"), before, mode=mode)
        commit(tmp, path)
    except OSError as exc:
        raise CommandError("failed", f"cannot write {path}: {exc.strerror or exc}") from exc
    finally:
        tmp.unlink(missing_ok=True)
    return before
