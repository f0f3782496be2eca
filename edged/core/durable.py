"""Files that survive a power cut: written atomically, or read back as absent when a cut tore them.

Every file edged writes is one of two kinds (the list is in docs and in `store/__init__.py`'s audit):
- its content matters after a cut: written with `write_atomic` (a temporary file beside it, fsync, rename,
  fsync of the folder), so a reader finds the old content or the new one, never a mix; or
- its loss is harmless (a cache rebuilt, a picture, a metrics file rewritten every few seconds): written
  plainly, and the code says why at the write.

A rename alone is not enough: until the folder is fsync'd, a power cut can undo the rename, and until the
file is fsync'd, the rename can survive with an empty file behind it (ext4's delayed allocation).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def fsync_dir(path: Path) -> None:
    """Make a folder's entries (creates, renames, deletes in it) durable. Filesystems that cannot fsync a
    folder (some FUSE and network ones answer EINVAL) are left as they are."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def make_dirs(path: Path, mode: int = 0o750) -> None:
    """`mkdir -p` whose new folders survive a power cut (each parent fsync'd after its child is made)."""
    missing: list[Path] = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):
            folder.mkdir(mode=mode)
        fsync_dir(folder.parent)


def commit(tmp: Path, path: Path) -> None:
    """Rename a written (closed) temporary file over `path` durably: fsync it, rename, fsync the folder."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    tmp.replace(path)
    fsync_dir(path.parent)


def write_atomic(path: Path, data: bytes, *, mode: int = 0o600) -> None:
    """Replace `path` with `data` so that after a power cut it holds the old content or the new, whole.
    Raises OSError (nothing changed then, and no temporary file is left)."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        tmp.chmod(mode)
        tmp.replace(path)
        fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def read_json(path: Path, what: str) -> Any | None:
    """A JSON file written by `write_atomic`; None when it is absent, empty or torn (a cut on a filesystem
    that does not order its writes, or a copy by hand), with a warning naming the file: the caller treats
    None as "nothing remembered", never as a crash."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("%s: cannot read %s (%s); starting without it", what, path, exc.strerror or exc)
        return None
    if not text.strip():
        log.warning("%s: %s is empty (a power cut while it was written?); starting without it", what, path)
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        log.warning("%s: %s is not valid JSON (%s; torn by a power cut?); starting without it", what, path, exc)
        return None
