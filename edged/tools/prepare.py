"""`edged prepare`: build the TensorRT engines a config needs, ahead of `edged run`."""

from __future__ import annotations

import logging

import onnxruntime as ort

from edged.config import Config
from edged.model import engines, trtcache
from edged.model.session import TENSORRT
from edged.pipeline.model import load_pipeline_model

log = logging.getLogger(__name__)


def prepare(config: Config) -> int:
    """`edged prepare`: build (and warm up) every TensorRT engine the config needs.

    0 when every engine is ready (or nothing needs TensorRT here); 1 when a session that should run on
    TensorRT fell back to another provider (no engine was built for it).
    """
    available = ort.get_available_providers()
    built = failed = 0
    for p in config.pipelines:
        if not engines.uses_tensorrt(p.model):
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
    engines.cleanup([p.model for p in config.pipelines], config.state_dir)
    log.info("prepare: %d TensorRT engine(s) ready, %d failed", built, failed)
    return 1 if failed else 0
