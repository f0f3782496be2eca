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

from edged.config import Config, PipelineConfig
from edged.inference import trtcache
from edged.inference.session import TENSORRT, file_sha256, select_providers
from edged.osthread import name_os_thread
from edged.pipeline import Model, prepare_model

log = logging.getLogger(__name__)

HEARTBEAT_S = 15.0
Notice = Callable[[str], object]


def uses_tensorrt(cfg: PipelineConfig) -> bool:
    """Whether the pipeline's session will ask for TensorRT with the providers this runtime offers."""
    return TENSORRT in select_providers(cfg.model.providers, ort.get_available_providers())


def pending_build(cfg: PipelineConfig, state_dir: Path) -> Path | None:
    """The cache directory TensorRT will build into, or None (not on TensorRT, or already built)."""
    if not uses_tensorrt(cfg):
        return None
    path = trtcache.engine_dir(cfg.model, state_dir, file_sha256(cfg.model.path))
    return None if trtcache.has_engine(path) else path


@contextmanager
def build_progress(pipeline: str, path: Path, tick: Notice | None = None) -> Iterator[None]:
    """Log the start, a line every HEARTBEAT_S while it lasts (calling `tick`), and the time it took."""
    started = time.monotonic()
    done = threading.Event()
    log.info("pipeline %s: building TensorRT engine into %s (minutes on a Jetson)", pipeline, path)

    def heartbeat() -> None:
        name_os_thread()
        while not done.wait(HEARTBEAT_S):
            log.info("pipeline %s: still building TensorRT engine (%.0f s)", pipeline, time.monotonic() - started)
            if tick is not None:
                tick(f"EXTEND_TIMEOUT_USEC={int(HEARTBEAT_S * 4 * 1e6)}")

    thread = threading.Thread(target=heartbeat, name=f"edged-engine-{pipeline}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(5.0)
    log.info("pipeline %s: TensorRT engine ready after %.1f s", pipeline, time.monotonic() - started)


def load_pipeline_model(
    cfg: PipelineConfig,
    state_dir: Path,
    *,
    cores: int | None = None,
    on_building: Notice | None = None,
    notify: Notice | None = None,
) -> Model:
    """`prepare_model`, announcing a TensorRT build first (`on_building` gets the status line)."""
    path = pending_build(cfg, state_dir)
    if path is None:
        return prepare_model(cfg, state_dir, cores)
    if on_building is not None:
        on_building(f"building TensorRT engine for pipeline {cfg.name}")
    with build_progress(cfg.name, path, notify):
        return prepare_model(cfg, state_dir, cores)


def cleanup(config: Config) -> list[Path]:
    """Remove engine directories that no pipeline of this config uses any more (stale keys)."""
    keep: dict[Path, set[str]] = {}
    for p in config.pipelines:
        root = trtcache.cache_root(p.model, config.state_dir)
        key = trtcache.cache_key(file_sha256(p.model.path), trtcache.tensorrt_version(), p.model)
        keep.setdefault(root, set()).add(key)
    removed: list[Path] = []
    for root, keys in keep.items():
        removed += trtcache.cleanup(root, keys)
    return removed


def prepare(config: Config) -> int:
    """`edged prepare`: build (and warm up) every TensorRT engine the config needs.

    0 when every engine is ready (or nothing needs TensorRT here); 1 when a session that should run on
    TensorRT fell back to another provider (no engine was built for it).
    """
    available = ort.get_available_providers()
    built = failed = 0
    for p in config.pipelines:
        if not uses_tensorrt(p):
            log.info("pipeline %s: no TensorRT here (providers: %s); nothing to build", p.name, ", ".join(available))
            continue
        model = load_pipeline_model(p, config.state_dir)
        if model.loaded.provider != TENSORRT:
            log.error(
                "pipeline %s: the session runs on %s, not TensorRT; no engine built", p.name, model.loaded.provider
            )
            failed += 1
            continue
        built += 1
        log.info("pipeline %s: engine ready (TensorRT %s)", p.name, trtcache.tensorrt_version())
    cleanup(config)
    log.info("prepare: %d TensorRT engine(s) ready, %d failed", built, failed)
    return 1 if failed else 0
