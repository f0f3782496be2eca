"""TensorRT engine and timing cache: one directory per (model sha256, TensorRT version, precision flags).

TensorRT builds an engine from the ONNX graph (minutes on a Jetson) and ONNX Runtime keeps it in
`trt_engine_cache_path`. ORT checks little when it finds an engine there, so edged never lets it find a
wrong one: each combination of model file, TensorRT version and precision gets its own directory,

    <state_dir>/trt-cache/<sha256[:16]>-trt<version>-<fp16|int8|fp32...>/

with a manifest (`edged-engine.json`) naming the full key, written atomically (`durable.write_atomic`)
only once the engine files are fsync'd (`seal`, after warm-up built them): ONNX Runtime writes its engines
without fsync, so an engine in a folder with no sealed manifest may be torn by a power cut and is removed
before use, never handed to TensorRT. A changed model, a TensorRT upgrade (JetPack
update) or other precision flags give another directory, so a stale engine is never loaded; the old
directories are removed by `cleanup` once the current ones are in place. A directory whose manifest does
not match its name (a sha prefix collision, a hand-copied folder) is emptied before use.
"""

from __future__ import annotations

import ctypes
import functools
import json
import logging
import os
import re
import shutil
from pathlib import Path

from edged.core.durable import fsync_dir, make_dirs, read_json, write_atomic
from edged.model.settings import ModelConfig

log = logging.getLogger(__name__)

MANIFEST = "edged-engine.json"
KEY_PATTERN = re.compile(r"^[0-9a-f]{16}-trt[^/]+$")
LIBNVINFER = ("libnvinfer.so.10", "libnvinfer.so.8", "libnvinfer.so")
TRT10 = 10000  # getInferLibVersion(): major*10000+minor*100+patch from TensorRT 10 on, major*1000+... before


@functools.cache
def tensorrt_version() -> str:
    """The TensorRT library version ("8.6.2"), from the Python module or libnvinfer; "unknown" without it."""
    try:
        import tensorrt  # type: ignore[import-not-found]  # noqa: PLC0415  (only on Jetson / GPU hosts)
    except ImportError:
        pass
    else:
        return str(tensorrt.__version__)
    for name in LIBNVINFER:
        try:
            lib = ctypes.CDLL(name)
            value = int(lib.getInferLibVersion())
        except (OSError, AttributeError):
            continue
        if value >= TRT10:
            return f"{value // 10000}.{value // 100 % 100}.{value % 100}"
        return f"{value // 1000}.{value // 100 % 10}.{value % 100}"
    return "unknown"


def precision_tag(cfg: ModelConfig) -> str:
    """`fp16-int8`, `fp16`, `int8` or `fp32` (TensorRT builds different engines for each)."""
    flags = [name for name, on in (("fp16", cfg.trt_fp16), ("int8", cfg.trt_int8)) if on]
    return "-".join(flags) or "fp32"


def cache_key(sha256: str, trt_version: str, cfg: ModelConfig) -> str:
    """The directory name: `<sha256[:16]>-trt<version>-<precision>`."""
    return f"{sha256[:16]}-trt{trt_version}-{precision_tag(cfg)}"


def cache_root(cfg: ModelConfig, state_dir: Path) -> Path:
    """Where the per-key directories live: `model.trt_engine_cache_dir` or `<state_dir>/trt-cache`."""
    return cfg.trt_engine_cache_dir or state_dir / "trt-cache"


def engine_dir(cfg: ModelConfig, state_dir: Path, sha256: str) -> Path:
    """This model's engine + timing cache directory for the TensorRT installed here."""
    return cache_root(cfg, state_dir) / cache_key(sha256, tensorrt_version(), cfg)


def _manifest(cfg: ModelConfig, sha256: str) -> dict[str, object]:
    return {
        "sha256": sha256,
        "tensorrt": tensorrt_version(),
        "fp16": cfg.trt_fp16,
        "int8": cfg.trt_int8,
        "model": cfg.path.name,
    }


def prepare_dir(cfg: ModelConfig, state_dir: Path, sha256: str) -> Path:
    """Create the directory (or empty one whose manifest is not this key's, sealed) and return it."""
    path = engine_dir(cfg, state_dir, sha256)
    want = _manifest(cfg, sha256)
    if path.is_dir():
        have = read_json(path / MANIFEST, "TensorRT cache")
        if have != {**want, "sealed": True} and any(path.iterdir()):
            why = "was not sealed (a power cut while it was built?)" if have == want else f"belongs to {have}"
            log.warning("TensorRT cache %s %s; rebuilding", path, why)
            shutil.rmtree(path)
    make_dirs(path)
    write_atomic(path / MANIFEST, json.dumps(want, sort_keys=True).encode("utf-8"), mode=0o640)
    return path


def seal(path: Path) -> None:
    """The engines ONNX Runtime built in `path` are complete: fsync them, then mark the manifest sealed."""
    manifest = read_json(path / MANIFEST, "TensorRT cache")
    if not isinstance(manifest, dict) or manifest.get("sealed"):
        return
    for item in path.iterdir():
        if item.is_file() and item.name != MANIFEST:
            fd = os.open(item, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    fsync_dir(path)
    sealed = {**manifest, "sealed": True}
    write_atomic(path / MANIFEST, json.dumps(sealed, sort_keys=True).encode("utf-8"), mode=0o640)


def has_engine(path: Path) -> bool:
    """Whether ONNX Runtime already wrote an engine there (`*.engine`)."""
    return path.is_dir() and any(path.glob("*.engine"))


def cleanup(root: Path, keep: set[str]) -> list[Path]:
    """Remove engine directories under `root` whose key is not in `keep`, and unkeyed engines left in `root`
    by older versions (they can never be loaded again). Returns what was removed."""
    removed: list[Path] = []
    if not root.is_dir():
        return removed
    for child in sorted(root.iterdir()):
        stale_dir = child.is_dir() and KEY_PATTERN.match(child.name) and child.name not in keep
        legacy = child.is_file() and child.suffix in (".engine", ".profile", ".timing")
        if not (stale_dir or legacy):
            continue
        log.info("TensorRT cache: removing stale %s", child)
        if child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
        removed.append(child)
    return removed
