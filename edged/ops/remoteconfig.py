"""The remote `config` command: merge, validate exactly like `check-config`, then write the file atomically.

A partial config is merged into the file's current YAML: mappings key by key, `pipelines` entry by entry
matched by `name` (a new name is added), any other list replaced whole. `replace: true` takes the given
config as the whole file. The result is written beside the file and loaded with the same loader
`check-config` uses; only when it is valid does it replace the file (the old one kept as `<file>.prev`).
Nothing changes on the device when it is not. Comments in the file are not kept (YAML is rewritten).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from edged.config import load_config
from edged.core.durable import commit, write_atomic
from edged.core.errors import CommandError, ConfigError


def merge(base: Any, patch: Any) -> Any:
    """`patch` merged into `base` (see the module docstring)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            if key == "pipelines" and isinstance(value, list) and isinstance(base.get(key), list):
                out[key] = _merge_named(base[key], value)
            else:
                out[key] = merge(base.get(key), value) if key in base else value
        return out
    return patch


def _merge_named(base: list[Any], patch: list[Any]) -> list[Any]:
    out = list(base)
    index = {item.get("name"): i for i, item in enumerate(out) if isinstance(item, dict)}
    for item in patch:
        name = item.get("name") if isinstance(item, dict) else None
        if name in index:
            out[index[name]] = merge(out[index[name]], item)
        else:
            out.append(item)
    return out


def apply_remote_config(path: Path, patch: dict[str, Any], *, replace: bool) -> None:
    """Validate and write; CommandError `invalid_config` (with every problem) or `failed`."""
    try:
        current = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise CommandError("failed", f"cannot read {path}: {exc}") from exc
    new = patch if replace else merge(current, patch)
    text = yaml.safe_dump(new, sort_keys=False)
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
            load_config(tmp)  # the check-config path: same schema, same messages
        except ConfigError as exc:
            problems = [p.replace(str(tmp), "<remote config>") for p in exc.problems]
            raise CommandError("invalid_config", "; ".join(problems)) from None
        mode = path.stat().st_mode & 0o777
        tmp.chmod(mode)
        # both durably (fsync, rename, folder fsync): after a power cut the file is the old config or the
        # new one, whole, and `.prev` is the one before it, never a torn mix a restart would refuse
        write_atomic(path.with_name(path.name + ".prev"), path.read_bytes(), mode=mode)
        commit(tmp, path)
    except OSError as exc:
        raise CommandError("failed", f"cannot write {path}: {exc.strerror or exc}") from exc
    finally:
        tmp.unlink(missing_ok=True)
