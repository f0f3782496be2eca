"""Reading secrets (MQTT password, TLS key) without leaking them: files readable by others are refused."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from edged.core.errors import SecretError


def check_private(path: Path, what: str) -> None:
    """Refuse a secret file that others (not owner, not group) may read or write."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError as exc:
        raise SecretError(f"cannot read {what} {path}: {exc.strerror}") from exc
    if mode & 0o007:
        raise SecretError(
            f"{what} {path} is readable by others (mode {mode:04o}); edged refuses to use it: "
            f"chmod 600 {path} (or 640 with group edged)"
        )


def read_secret(path: Path, what: str) -> str:
    """The first line of a private file (a trailing newline is not part of the secret)."""
    check_private(path, what)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SecretError(f"cannot read {what} {path}: {exc.strerror}") from exc
    return text.splitlines()[0] if text else ""


def read_credential(name: str, what: str) -> str:
    """A systemd credential (LoadCredential=NAME:...) from $CREDENTIALS_DIRECTORY."""
    directory = os.environ.get("CREDENTIALS_DIRECTORY")
    if not directory:
        raise SecretError(
            f"{what}: credential {name!r} asked for, but $CREDENTIALS_DIRECTORY is not set "
            "(add LoadCredential= to the unit, or use password_file)"
        )
    return read_secret(Path(directory) / name, what)
