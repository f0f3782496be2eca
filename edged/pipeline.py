"""One pipeline: its model (session, pre/postprocessing) and the inference thread feeding the spool."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from edged import MESSAGE_VERSION
from edged.config import PipelineConfig
from edged.errors import EdgedError
from edged.inference.postprocess import Postprocessor, make_postprocessor
from edged.inference.preprocess import Preprocessor, PreprocessSpec
from edged.inference.session import LoadedModel, load_model, warm_up
from edged.inference.window import WindowSpec, WindowTransform
from edged.osthread import INFERENCE_NICE, name_os_thread, yield_cpu_to_delivery
from edged.publish import PublishFilter, Snapshots
from edged.sources.base import Frame, FrameSlot
from edged.spool import Spool
from edged.stats import PipelineStats

log = logging.getLogger(__name__)

ResultHook = Callable[[dict[str, Any]], None]


@dataclass
class Model:
    """A loaded, checked, warmed-up model with the pre/postprocessing that fits it."""

    loaded: LoadedModel
    pre: Preprocessor | WindowTransform  # image preprocessing, or a sensor source's window -> tensor
    post: Postprocessor


class ModelRef:
    """The pipeline's current model, swapped atomically between two frames (a reference assignment).

    It is also the source's transform: the source thread preprocesses with the current model and
    records which preprocessing it used in `last_token`.
    """

    def __init__(self, model: Model) -> None:
        self.current = model
        self.last_token: object = None

    def __call__(self, image: npt.NDArray[np.uint8]) -> npt.NDArray[Any]:
        """Preprocess with the current model (called by the source thread only)."""
        pre = self.current.pre
        tensor = pre(image)
        self.last_token = pre.spec
        return tensor

    def swap(self, model: Model) -> Model:
        """Make `model` current; returns the previous one."""
        old, self.current = self.current, model
        return old


def prepare_model(cfg: PipelineConfig, state_dir: Path, cores: int | None = None) -> Model:
    """Load the session, resolve pre/postprocessing (config over metadata), check shapes, warm up.

    A sensor pipeline gets a WindowTransform (edged/inference/window.py) instead of image preprocessing:
    its window (channels x samples) is checked against the model input the same way.
    `cores`: the CPU cores this pipeline may use (the daemon shares them between CPU pipelines).
    """
    loaded = load_model(cfg.model, state_dir, cores=cores)
    pre: Preprocessor | WindowTransform
    input_size: tuple[int, int] | None = None
    if cfg.source.type == "sensor":
        window = WindowSpec.resolve(
            cfg.source.window_settings(), loaded.metadata, loaded.input_shape, loaded.input_type
        )
        pre, tensor_shape = WindowTransform(window), window.tensor_shape
    else:
        spec = PreprocessSpec.resolve(cfg.preprocess, loaded.metadata, loaded.input_shape, loaded.input_type)
        pre, tensor_shape, input_size = Preprocessor(spec), spec.tensor_shape, spec.size
    shapes = [list(o.shape) for o in loaded.session.get_outputs()]
    post = make_postprocessor(cfg.postprocess, loaded.output_names, shapes, loaded.metadata, input_size)
    warm_up(loaded, tensor_shape, cfg.model.warmup_runs)
    return Model(loaded, pre, post)


def check_pipeline_model(cfg: PipelineConfig, state_dir: Path) -> str | None:
    """What `prepare_model` would refuse for this pipeline, or None: the same checks on the CPU provider,
    one core, no warm-up (for `check-config`: no GPU engine is built, no device opened)."""
    model = cfg.model.model_copy(
        update={"providers": ["CPUExecutionProvider"], "require_provider": False, "warmup_runs": 0}
    )
    try:
        prepare_model(cfg.model_copy(update={"model": model}), state_dir, cores=1)
    except EdgedError as exc:
        return str(exc)
    return None


class Turnstile:
    """Keeps results in capture order when several workers run frames at once.

    A worker takes a frame and a ticket together; after its model run it waits for its ticket's turn
    before it numbers (`seq`) and stores the result. A worker that fails still passes its turn on.
    """

    def __init__(self, slot: FrameSlot) -> None:
        self.slot = slot
        self._take = threading.Lock()
        self._turn = threading.Condition()
        self._next_ticket = 0
        self._serving = 0

    def take(self, timeout: float | None) -> tuple[Frame, int] | None:
        """The next frame and its ticket, or None on timeout / when the source is done (`timeout` None:
        asleep until one of the two)."""
        with self._take:
            frame = self.slot.get(timeout)
            if frame is None:
                return None
            ticket = self._next_ticket
            self._next_ticket += 1
            return frame, ticket

    @contextmanager
    def turn(self, ticket: int) -> Iterator[None]:
        """Wait until every earlier ticket was served, run the body, then let the next one in."""
        with self._turn:
            while self._serving != ticket:
                self._turn.wait()
        try:
            yield
        finally:
            with self._turn:
                self._serving += 1
                self._turn.notify_all()


def describe_model(stats: PipelineStats, model: Model) -> None:
    """Show the model (name, sha256, provider) in the pipeline's status."""
    with stats.lock:
        stats.provider = model.loaded.provider
        stats.model_name = model.loaded.name
        stats.model_sha256 = model.loaded.sha256
        stats.model_int8 = model.loaded.int8


class InferenceWorker(threading.Thread):
    """Takes the latest frame, runs the model, builds the message, appends it to the spool.

    A pipeline runs `model.concurrency` of these on one session; a Turnstile keeps their results in
    capture order, so `seq` follows the frames. The `publish` filter and the snapshots are shared by the
    workers of a pipeline and only used inside a turn.
    """

    def __init__(
        self,
        cfg: PipelineConfig,
        ref: ModelRef,
        *,
        turnstile: Turnstile,
        spool: Spool,
        stats: PipelineStats,
        device_id: str,
        topic: str,
        on_result: ResultHook | None = None,
        index: int = 0,
        publish: PublishFilter | None = None,
        snapshots: Snapshots | None = None,
        on_exit: Callable[[], None] | None = None,
    ) -> None:
        suffix = f"-{index}" if index else ""
        super().__init__(name=f"edged-infer-{cfg.name}{suffix}", daemon=True)
        self.cfg = cfg
        self.ref = ref
        self.turnstile = turnstile
        self.spool = spool
        self.stats = stats
        self.device_id = device_id
        self.topic = topic
        self.on_result = on_result
        self.publish = publish or PublishFilter(cfg.publish)
        self.snapshots = snapshots
        self.finished = False
        self.on_exit = on_exit  # told when this thread ends, however it ends (the daemon sleeps until then)
        describe_model(stats, ref.current)

    def run(self) -> None:
        """Until the source closes its slot: the frame in flight is always finished and stored."""
        name_os_thread()
        yield_cpu_to_delivery(INFERENCE_NICE)
        try:
            self._loop()
        finally:
            self.finished = True  # before on_exit: whoever it wakes must see this thread as done
            if self.on_exit is not None:
                self.on_exit()

    def _loop(self) -> None:
        while True:
            taken = self.turnstile.take(timeout=None)  # idle means asleep: the slot wakes us, also on close
            if taken is None:
                if self.turnstile.slot.closed:
                    return
                continue
            frame, ticket = taken
            try:
                outcome = self._infer(frame)
            except Exception as exc:  # noqa: BLE001  (one pipeline's failure must not stop the others; _fail logs it)
                with self.turnstile.turn(ticket):
                    self._fail("inference failed", exc)
                return
            with self.turnstile.turn(ticket):
                try:
                    self._store(frame, *outcome)
                except Exception as exc:  # noqa: BLE001  (a raising result hook, a broken spool: _fail logs it)
                    self._fail("storing the result failed", exc)
                    return

    def _fail(self, what: str, exc: Exception) -> None:
        """Mark the pipeline failed (status shows why), log the cause once, stop its other workers too."""
        self.stats.set_state("failed", f"{what}: {exc}")
        log.error(
            "pipeline %s: %s; this pipeline stops",
            self.cfg.name,
            what,
            exc_info=exc,
            extra={"PIPELINE": self.cfg.name, "PROVIDER": self.ref.current.loaded.provider, "SEQ": ""},
        )
        self.turnstile.slot.close()  # the other workers of this pipeline stop too

    def _infer(self, frame: Frame) -> tuple[Model, dict[str, Any], float, float, float]:
        model = self.ref.current  # one model for the whole frame, even if a swap happens meanwhile
        tensor, pre_ms = frame.tensor, frame.pre_ms
        if tensor is None or (frame.pre_token is not None and frame.pre_token != model.pre.spec):
            t0 = time.perf_counter()
            tensor = model.pre(frame.image)
            pre_ms = (time.perf_counter() - t0) * 1e3
        t1 = time.perf_counter()
        outputs = model.loaded.run(tensor)
        t2 = time.perf_counter()
        height, width = frame.image.shape[:2]
        geometry = model.pre.geometry(width, height) if isinstance(model.pre, Preprocessor) else None
        result = model.post(outputs, geometry)
        t3 = time.perf_counter()
        return model, result, pre_ms, (t2 - t1) * 1e3, (t3 - t2) * 1e3

    def _store(  # noqa: PLR0917  (the outcome of _infer, spread)
        self, frame: Frame, model: Model, result: dict[str, Any], pre_ms: float, infer_ms: float, post_ms: float
    ) -> None:
        self.stats.record_result(pre_ms, infer_ms, post_ms)
        publish, changed = self.publish.decide(result)
        if not publish:
            self.stats.count_suppressed()  # counted, then dropped: no spool row, no seq (see edged/publish.py)
            return
        seq = self.spool.next_seq(self.cfg.name)
        message = {
            "v": MESSAGE_VERSION,
            "device": self.device_id,
            "pipeline": self.cfg.name,
            "seq": seq,
            "ts": round(frame.ts, 3),
            "frame": frame.index,
            "model": {"name": model.loaded.name, "sha256": model.loaded.sha256},
            "provider": model.loaded.provider,
            "latency_ms": {"pre": round(pre_ms, 3), "infer": round(infer_ms, 3), "post": round(post_ms, 3)},
            "result": result,
        }
        if self.snapshots is not None and self.snapshots.wanted(result, changed=changed):
            path = self.snapshots.write(frame.image, result, seq)
            if path is not None:
                message["snapshot"] = path  # relative to state_dir; the picture itself stays on the device
        payload = json.dumps(message, separators=(",", ":")).encode("utf-8")
        self.spool.append(self.cfg.name, seq, frame.ts, self.topic, payload)
        if log.isEnabledFor(logging.DEBUG):  # one line per result: journal fields make them searchable
            fields = {"PIPELINE": self.cfg.name, "SEQ": seq, "PROVIDER": model.loaded.provider}
            log.debug("pipeline %s seq %d: %s", self.cfg.name, seq, json.dumps(result)[:200], extra=fields)
        if self.on_result is not None:
            self.on_result(message)
