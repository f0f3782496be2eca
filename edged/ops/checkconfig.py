"""`edged check-config`: every check `edged run` makes before it opens a device.

First the schema (every key, every cross-field rule: min/max pairs, TLS pairs, topics, unique names),
then the paths edged would write (the status socket must not be a file edged would remove; the state folder
must be a folder of edged's own, not one of the system's), then each pipeline's model as `run` would prepare
it: ONNX Runtime loads it, its input fits the preprocessing (or the sensor window), the postprocessing fits
its outputs (labels against the classes or the detection head, a forced head format against the head's
layout); on the CPU, without warm-up runs. Each problem is one line, `file:line key=value: message`, the
line of the key at fault.

A remote `config` command runs the same check in the daemon (`as_daemon=True`), where the daemon's own
rights also decide: the state folder and the socket's folder must be writable by it.
"""

from __future__ import annotations

import os
from pathlib import Path

from edged.config import Config, ConfigLocator, load_config
from edged.core.errors import ConfigError
from edged.ops.status import socket_path_problem
from edged.pipeline.model import check_pipeline_model

# folders of the system: edged's files (spool, keys' nonces, models) never go straight in one of them
_SYSTEM = "/ /bin /boot /dev /etc /home /lib /lib64 /media /mnt /opt /proc /root /run /sbin /srv /sys /usr"
_SYSTEM_SUB = "/usr/bin /usr/lib /usr/local /var /var/cache /var/lib /var/log /var/tmp"
SYSTEM_DIRS = frozenset(Path(p) for p in f"{_SYSTEM} {_SYSTEM_SUB} /tmp".split(" "))


def state_dir_problem(path: Path, *, as_daemon: bool) -> str | None:
    """Why `path` cannot be edged's state folder: not a folder, a folder of the system (a pushed `state_dir:
    /etc` would spread edged's files there), or (for the daemon itself) not writable."""
    try:  # Python 3.11's exists() raises on a name the system cannot look up (over 255 bytes, a loop, ...)
        if path.exists() and not path.is_dir():
            return "not a folder"
        if path.resolve() in SYSTEM_DIRS:
            return "a folder of the system; give edged a folder of its own (/var/lib/edged)"
        return _writable_problem(path) if as_daemon else None
    except (OSError, RuntimeError) as exc:  # RuntimeError: resolve() in a loop of links
        return f"cannot look it up: {getattr(exc, 'strerror', None) or exc}"


def _writable_problem(path: Path) -> str | None:
    existing = next((p for p in (path, *path.parents) if p.exists()), Path("/"))
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"edged cannot write {existing} (it runs as uid {os.geteuid()})"
    return None


def path_problems(config: Config, where: ConfigLocator, *, as_daemon: bool = False) -> list[str]:
    """The paths edged would write, checked before anything is written there."""
    problems = []
    found = state_dir_problem(config.state_dir, as_daemon=as_daemon)
    if found is not None:
        problems.append(where.problem(("state_dir",), found))
    found = socket_path_problem(config.status_socket)
    if found is None and as_daemon:
        found = _writable_problem(config.status_socket.parent)
    if found is not None:
        problems.append(where.problem(("status", "socket"), found))
    return problems


def check_config(path: Path, *, as_daemon: bool = False, readings: dict[str, str] | None = None) -> Config:
    """The validated config, or ConfigError listing every problem (schema first, then paths, then the
    models). `readings` gets, per pipeline, what its decoder reads (check-config prints it)."""
    config = load_config(path)
    where = ConfigLocator(path)
    problems = path_problems(config, where, as_daemon=as_daemon)
    for i, p in enumerate(config.pipelines):
        said: list[str] = []
        found = check_pipeline_model(p, config.state_dir, said)
        if readings is not None and said:
            readings[p.name] = said[0]
        if found is not None:
            key, why = found
            at = tuple(int(part) if part.isdigit() else part for part in key.split("."))
            problems.append(where.problem(("pipelines", i, *at), why))
    if problems:
        raise ConfigError(problems)
    return config
