"""One pipeline: its model (session, pre/postprocessing) and the inference thread feeding the spool."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edged import MESSAGE_VERSION
from edged.config import PipelineConfig
from edged.inference.postprocess import Postprocessor, make_postprocessor
from edged.inference.preprocess import Preprocessor, PreprocessSpec
from edged.inference.session import LoadedModel, load_model, warm_up
from edged.sources.base import Frame, FrameSlot
from edged.spool import Spool
from edged.stats import PipelineStats

log = logging.getLogger(__name__)

ResultHook = Callable[[dict[str, Any]], None]


@dataclass
class Model:
    """A loaded, checked, warmed-up model with the pre/postprocessing that fits it."""

    loaded: LoadedModel
    pre: Preprocessor
    post: Postprocessor


def prepare_model(cfg: PipelineConfig, state_dir: Path) -> Model:
    """Load the session, resolve preprocessing (config over metadata), check shapes, warm up."""
    loaded = load_model(cfg.model, state_dir)
    spec = PreprocessSpec.resolve(cfg.preprocess, loaded.metadata, loaded.input_shape, loaded.input_type)
    shapes = [list(o.shape) for o in loaded.session.get_outputs()]
    post = make_postprocessor(cfg.postprocess, loaded.output_names, shapes, loaded.metadata)
    warm_up(loaded, spec.tensor_shape, cfg.model.warmup_runs)
    return Model(loaded, Preprocessor(spec), post)


class InferenceWorker(threading.Thread):
    """Takes the latest frame, runs the model, builds the message, appends it to the spool."""

    def __init__(
        self,
        cfg: PipelineConfig,
        model: Model,
        *,
        slot: FrameSlot,
        spool: Spool,
        stats: PipelineStats,
        device_id: str,
        topic: str,
        on_result: ResultHook | None = None,
    ) -> None:
        super().__init__(name=f"edged-infer-{cfg.name}", daemon=True)
        self.cfg = cfg
        self.model = model
        self.slot = slot
        self.spool = spool
        self.stats = stats
        self.device_id = device_id
        self.topic = topic
        self.on_result = on_result
        self._model_info = {"name": model.loaded.name, "sha256": model.loaded.sha256}
        with stats.lock:
            stats.provider = model.loaded.provider
            stats.model_name = model.loaded.name
            stats.model_sha256 = model.loaded.sha256

    def run(self) -> None:
        """Until the source closes its slot: the frame in flight is always finished and stored."""
        while True:
            frame = self.slot.get(timeout=0.5)
            if frame is None:
                if self.slot.closed:
                    return
                continue
            try:
                self._process(frame)
            except Exception as exc:  # one pipeline's failure must not stop the others
                self.stats.set_state("failed", f"inference failed: {exc}")
                log.exception("pipeline %s: inference failed; this pipeline stops", self.cfg.name)
                return

    def _process(self, frame: Frame) -> None:
        t0 = time.perf_counter()
        tensor = self.model.pre(frame.image)
        t1 = time.perf_counter()
        outputs = self.model.loaded.run(tensor)
        t2 = time.perf_counter()
        result = self.model.post(outputs)
        t3 = time.perf_counter()
        pre_ms, infer_ms, post_ms = (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3
        seq = self.spool.next_seq(self.cfg.name)
        message = {
            "v": MESSAGE_VERSION,
            "device": self.device_id,
            "pipeline": self.cfg.name,
            "seq": seq,
            "ts": round(frame.ts, 3),
            "frame": frame.index,
            "model": self._model_info,
            "provider": self.model.loaded.provider,
            "latency_ms": {"pre": round(pre_ms, 3), "infer": round(infer_ms, 3), "post": round(post_ms, 3)},
            "result": result,
        }
        payload = json.dumps(message, separators=(",", ":")).encode("utf-8")
        self.spool.append(self.cfg.name, seq, frame.ts, self.topic, payload)
        self.stats.record_result(pre_ms, infer_ms, post_ms)
        if self.on_result is not None:
            self.on_result(message)
