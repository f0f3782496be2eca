"""TensorRT engines: build ahead of time (`edged prepare`), report a build in progress, clean up old ones.

A pipeline whose session will run on TensorRT and whose keyed cache directory (`trtcache`) holds no
engine yet is "building": the ONNX Runtime session construction and the warm-up run make TensorRT build
the engine, which takes minutes on a Jetson. While it does, the pipeline's status state is
`building_engine`, sd_notify STATUS= says so, systemd's start timeout is extended every
`HEARTBEAT_S`, and the log shows progress. `edged run` only sends READY=1 after every engine is built.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import onnxruntime as ort

from edged.core.threads import Supervised
from edged.model import trtcache
from edged.model.session import TENSORRT, file_sha256, select_providers
from edged.model.settings import ModelConfig

log = logging.getLogger(__name__)

HEARTBEAT_S = 15.0
Notice = Callable[[str], object]


def uses_tensorrt(cfg: ModelConfig) -> bool:
    """Whether the model's session will ask for TensorRT with the providers this runtime offers."""
    return TENSORRT in select_providers(cfg.providers, ort.get_available_providers())


def pending_build(cfg: ModelConfig, state_dir: Path) -> Path | None:
    """The cache directory TensorRT will build into, or None (not on TensorRT, or already built)."""
    if not uses_tensorrt(cfg):
        return None
    path = trtcache.engine_dir(cfg, state_dir, file_sha256(cfg.path))
    return None if trtcache.has_engine(path) else path


@contextmanager
def build_progress(pipeline: str, path: Path, tick: Notice | None = None) -> Iterator[None]:
    """Log the start, a line every HEARTBEAT_S while it lasts (calling `tick`), and the time it took."""
    started = time.monotonic()
    done = threading.Event()
    log.info("pipeline %s: building TensorRT engine into %s (minutes on a Jetson)", pipeline, path)

    def heartbeat() -> None:
        while not done.wait(HEARTBEAT_S):
            log.info("pipeline %s: still building TensorRT engine (%.0f s)", pipeline, time.monotonic() - started)
            if tick is not None:
                tick(f"EXTEND_TIMEOUT_USEC={int(HEARTBEAT_S * 4 * 1e6)}")

    thread = Supervised(f"edged-engine-{pipeline}", target=heartbeat)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(5.0)
    log.info("pipeline %s: TensorRT engine ready after %.1f s", pipeline, time.monotonic() - started)


def cleanup(models: list[ModelConfig], state_dir: Path) -> list[Path]:
    """Remove engine directories that none of these models (a config's) uses any more (stale keys)."""
    keep: dict[Path, set[str]] = {}
    for model in models:
        root = trtcache.cache_root(model, state_dir)
        key = trtcache.cache_key(file_sha256(model.path), trtcache.tensorrt_version(), model)
        keep.setdefault(root, set()).add(key)
    removed: list[Path] = []
    for root, keys in keep.items():
        removed += trtcache.cleanup(root, keys)
    return removed
