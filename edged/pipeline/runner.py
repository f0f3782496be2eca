"""The runner of one pipeline: it owns the pipeline's runtime (source, model, inference workers, publish
filter, snapshots) from start to stop. The daemon starts and stops runners; reload talks only to them:
`apply(new_config)` applies every change it can live and names the rest as needing a restart,
`swap_model(config)` builds a model beside the running one and switches between two frames,
`stop(deadline)` ends the pipeline within the daemon's one stop deadline.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edged.capture.base import FrameSlot, Source, make_source
from edged.capture.motion import MotionGate
from edged.capture.rtsp import redact_uri
from edged.capture.sensor import SensorSourceConfig
from edged.core.clock import ClockWatch
from edged.core.errors import EdgedError
from edged.core.stats import PipelineStats
from edged.pipeline.model import Model, ModelRef, Notice, describe_model, load_pipeline_model
from edged.pipeline.resultfilter import make_filter
from edged.pipeline.scene import Scene
from edged.pipeline.settings import PipelineConfig, declared_frame
from edged.pipeline.snapshots import Snapshots
from edged.pipeline.worker import InferenceWorker, Outlet, ResultHook, ResultSink, Turnstile

log = logging.getLogger(__name__)

SOURCE_STOP_S = 10.0  # a source being replaced gets this long to stop, then it is detached
SOURCE_JOIN_S = 5.0  # on stop: a source stuck in a read is abandoned after this (or at the deadline)
FileStat = tuple[int, int, int]


def model_file_stat(path: Path) -> FileStat | None:
    """(mtime_ns, size, inode) of a model file, None when it is not there (being replaced)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


def snapshots_for(state_dir: Path, cfg: PipelineConfig) -> Snapshots | None:
    """The pipeline's snapshot writer, when `snapshot.enabled`."""
    return Snapshots(cfg.snapshot, state_dir, cfg.name) if cfg.snapshot.enabled else None


def source_for(runner: PipelineRunner, cfg: PipelineConfig) -> Source:
    """A runner's source (with its motion gate when `motion.enabled`), preparing the model input with the
    current model (its Preparer is the ModelRef); its death fails the pipeline."""
    extra = dict(runner.source_kwargs)
    if cfg.motion.enabled:  # camera sources only (checked with the config)
        masks = [*cfg.motion.mask, *cfg.masks]  # the pipeline's masks hide motion too
        extra["motion"] = MotionGate(cfg.motion, masks, declared_frame(cfg.frame_size, cfg.source))
    source = make_source(cfg.source, slot=runner.slot, stats=runner.stats, name=f"edged-source-{cfg.name}",
                         prepare=runner.ref, **extra)  # fmt: skip
    source.on_death = runner.source_died
    return source


class PipelineRunner:
    """One pipeline's runtime. `start(model)`, then `apply` / `swap_model` / `poll_model` from the reload
    thread, then `stop_source()` and `finish(deadline)` (or `stop(deadline)`)."""

    def __init__(
        self,
        cfg: PipelineConfig,
        *,
        state_dir: Path,
        device_id: str,
        topic: str,
        events_topic: str = "",
        on_result: ResultHook | None = None,
        on_worker_exit: Callable[[], object] | None = None,
        source_kwargs: dict[str, Any] | None = None,
        notify: Notice | None = None,
        clock: ClockWatch | None = None,
    ) -> None:
        self.cfg = cfg
        self.notify = notify  # systemd's STATUS= while a TensorRT engine builds (the daemon hands it in)
        self.state_dir = state_dir
        self.device_id = device_id
        self.topic = topic
        self.events_topic = events_topic
        self.on_result = on_result
        self.on_worker_exit = on_worker_exit  # the daemon sleeps until a worker ends
        self.source_kwargs = source_kwargs or {}  # extra arguments for the source (tests: a fake capture)
        self.stats = PipelineStats(cfg.name, redact_uri(str(cfg.source.uri)))
        self.slot = FrameSlot(clock.stamp if clock is not None else None)  # frames stamped while time is untrusted
        self.source: Source | None = None
        self.workers: list[InferenceWorker] = []
        self.ref: ModelRef | None = None
        self.outlet: Outlet | None = None
        self.cores: int | None = None  # this pipeline's share of the CPU cores
        self.model_stat: FileStat | None = None  # the model file in use
        self.seen_stat: FileStat | None = None  # what the last poll saw (a swap waits for it to settle)
        self.fallback: str | None = None  # "runs its last good model (...): why" (lastgood.py), a status reason
        self.aside: str | None = None  # set aside at start: no model it could run (lastgood.py)

    @property
    def name(self) -> str:
        """The pipeline's name."""
        return self.cfg.name

    # -- the model: one way to load it, at start and for every swap -------------------------------------

    def load(self, cfg: PipelineConfig | None = None) -> Model:
        """Build and warm up the model of `cfg` (the running config when None) on this pipeline's cores,
        showing a TensorRT engine build in the status while it lasts. ModelError/ProviderError name the
        pipeline."""
        cfg = cfg or self.cfg
        before = self.stats.state

        def building(line: str) -> None:
            self.stats.set_state("building_engine")
            if self.notify is not None:
                self.notify("STATUS=" + line)

        try:
            model = load_pipeline_model(cfg, self.state_dir, cores=self.cores, on_building=building,
                                        notify=self.notify)  # fmt: skip
        finally:
            if self.stats.state == "building_engine":
                self.stats.set_state(before)
                if self.notify is not None:
                    self.notify(f"STATUS=TensorRT engine for pipeline {cfg.name} built")
        return model

    # -- start ------------------------------------------------------------------------------------------

    def start(self, model: Model, sink: ResultSink) -> None:
        """Start the workers on `model` (loaded by the daemon, which shares the cores) and the source."""
        self.ref = ModelRef(model)
        self.model_stat = model_file_stat(self.cfg.model.path)
        describe_model(self.stats, model)
        self.outlet = Outlet(
            sink, self.device_id, self.topic, make_filter(self.cfg.publish), snapshots_for(self.state_dir, self.cfg)
        )
        self.outlet.on_result = self.on_result
        self.outlet.scene, self.outlet.events_topic = make_scene(self.cfg), self.events_topic
        if self.outlet.scene is not None and self.outlet.scene.tracker is not None:
            self.stats.tracks = 0
        turnstile = Turnstile(self.slot)
        self.workers = [
            InferenceWorker(self.cfg.name, self.ref, turnstile=turnstile, outlet=self.outlet, stats=self.stats, index=i)
            for i in range(model.loaded.concurrency)
        ]
        for worker in self.workers:
            worker.on_exit = self.on_worker_exit
            worker.start()
        self.source = source_for(self, self.cfg)
        self.source.start()
        self.stats.touch()  # loading and warming up was progress (a TensorRT build can take minutes)

    def source_died(self, why: str) -> None:
        self.stats.set_state("failed", f"source thread died: {why}")
        self.slot.close()  # the workers finish what was captured, then end

    # -- state ------------------------------------------------------------------------------------------

    def running(self) -> bool:
        """True while any inference worker of the pipeline is alive."""
        return any(w.is_alive() and not w.finished for w in self.workers)

    def deaths(self) -> list[str]:
        """`thread ... died: cause` for each of this pipeline's threads whose body raised."""
        threads: list[Any] = [*self.workers, self.source]
        return [why for t in threads if t is not None and (why := t.died()) is not None]

    # -- reload -----------------------------------------------------------------------------------------

    def apply(self, new: PipelineConfig) -> list[str]:
        """Apply a reloaded config of this pipeline: a changed model, pre- or postprocessing is swapped in,
        a changed source restarted, changed publish/snapshot settings taken by the next frame. Returns one
        note per change that was applied or that needs a restart; nothing changes silently."""
        old = self.cfg
        notes: list[str] = []
        if (new.model.threads, new.model.concurrency) != (old.model.threads, old.model.concurrency):
            notes.append(f"pipeline {new.name}: threads/concurrency take effect after a restart")
            new = new.model_copy(update={"model": new.model.model_copy(
                update={"threads": old.model.threads, "concurrency": old.model.concurrency})})  # fmt: skip
        if (new.model, new.preprocess, new.postprocess, new.secondary) != (
            old.model, old.preprocess, old.postprocess, old.secondary
        ):  # fmt: skip
            if self.swap_model(new):
                notes.append(f"pipeline {new.name}: model, preprocess, postprocess and secondary models applied")
            else:
                notes.append(
                    f"pipeline {new.name}: the new model was refused; the running one stays ({self.stats.error})"
                )
                new = new.model_copy(update={
                    "model": old.model, "preprocess": old.preprocess, "postprocess": old.postprocess,
                    "secondary": old.secondary,
                })  # fmt: skip
        if (new.source, new.motion, new.frame_size, new.masks) != (old.source, old.motion, old.frame_size, old.masks):
            self._restart_source(new)
            notes.append(f"pipeline {new.name}: source restarted on {redact_uri(str(new.source.uri))}")
        if (new.publish, new.snapshot) != (old.publish, old.snapshot):
            self._apply_outputs(new)
            notes.append(f"pipeline {new.name}: publish/snapshot settings applied (the publish filter starts afresh)")
        if scene_keys(new) != scene_keys(old):
            if self.outlet is not None:
                self.outlet.scene = make_scene(new)
            notes.append(f"pipeline {new.name}: masks, zones and tracking applied (tracks start afresh)")
        self.cfg = new
        return notes

    def _apply_outputs(self, cfg: PipelineConfig) -> None:
        """New publish filter and snapshots for the workers (used only inside a turn: the next frame takes them)."""
        if self.outlet is not None:
            self.outlet.publish, self.outlet.snapshots = make_filter(cfg.publish), snapshots_for(self.state_dir, cfg)

    def _restart_source(self, cfg: PipelineConfig) -> None:
        old = self.source
        if old is not None:
            old.stop(close_slot=False)  # the inference workers stay; only the source changes
            old.join(SOURCE_STOP_S)
            if old.is_alive():  # stuck in a read: it must not feed the slot beside its replacement
                old.detach()
                log.warning(
                    "pipeline %s: the old source did not stop within %.0f s; detached from the pipeline",
                    cfg.name, SOURCE_STOP_S,
                )  # fmt: skip
        with self.stats.lock:
            self.stats.source_uri = redact_uri(str(cfg.source.uri))
        self.source = source_for(self, cfg)
        self.source.start()
        log.info("pipeline %s: source restarted on %s", cfg.name, redact_uri(str(cfg.source.uri)))

    def swap_model(self, cfg: PipelineConfig) -> bool:
        """Build and warm up `cfg`'s model beside the running one, then switch. False keeps the old one
        (the status says why)."""
        if self.ref is None:
            return False
        stat = model_file_stat(cfg.model.path)
        try:
            model = self.load(cfg)
        except EdgedError as exc:
            self.model_stat = stat  # do not retry this file until it changes again
            self.stats.set_state(error=f"model swap failed, still running {self.stats.model_name}: {exc}")
            log.error("pipeline %s: new model not used, the old one keeps running: %s", cfg.name, exc)  # noqa: TRY400
            return False
        if isinstance(cfg.source, SensorSourceConfig) and model.pre.spec != self.ref.current.pre.spec:
            self.model_stat = stat
            self.stats.set_state(error="model swap refused: the new model needs another sensor window; restart edged")
            log.error("pipeline %s: the new model needs another sensor window; restart edged to use it", cfg.name)
            return False
        old = self.ref.swap(model)
        self.model_stat = stat
        describe_model(self.stats, model)
        self.stats.set_state(error="")
        log.info(
            "pipeline %s: model swapped %s (%s) -> %s (%s)",
            cfg.name, old.loaded.name, old.loaded.sha256[:12], model.loaded.name, model.loaded.sha256[:12],
        )  # fmt: skip
        return True

    def poll_model(self) -> None:
        """Swap to the model file when it changed and has not changed since the last poll (a copy in
        progress is not loaded half-written)."""
        stat = model_file_stat(self.cfg.model.path)
        if stat is not None and stat != self.model_stat and stat == self.seen_stat:
            log.info("pipeline %s: %s changed; swapping the model", self.cfg.name, self.cfg.model.path)
            self.swap_model(self.cfg)
        self.seen_stat = stat

    # -- stop -------------------------------------------------------------------------------------------

    def stop_source(self) -> None:
        """Ask the source to finish (the daemon asks every pipeline's source first, then waits)."""
        if self.source is not None:
            self.source.stop()

    def finish(self, deadline: float) -> None:
        """Wait for the source (abandoning one stuck in a read, with a log line), close the slot, let the
        workers finish the frames in flight; all before `deadline` (time.monotonic())."""
        if self.source is not None:
            waited = _left(deadline, SOURCE_JOIN_S)
            self.source.join(waited)
            if self.source.is_alive():
                log.warning(
                    "pipeline %s: source %s did not stop within %.1f s; abandoned (its thread ends with edged)",
                    self.cfg.name, redact_uri(str(self.cfg.source.uri)), waited,
                )  # fmt: skip
        self.slot.close()  # the workers finish what is in the slot, then end
        for worker in self.workers:
            worker.join(_left(deadline))

    def stop(self, deadline: float) -> None:
        """`stop_source()` then `finish(deadline)`."""
        self.stop_source()
        self.finish(deadline)


def scene_keys(cfg: PipelineConfig) -> tuple[object, ...]:
    """The config keys the pipeline's scene is made from."""
    return cfg.masks, cfg.zones, cfg.reference_point, cfg.tracking, cfg.frame_size


def make_scene(cfg: PipelineConfig) -> Scene | None:
    """The pipeline's masks, zones and tracker; None when it has none of them."""
    if not (cfg.masks or cfg.zones or cfg.tracking.enabled):
        return None
    return Scene(
        masks=cfg.masks,
        zones=cfg.zones,
        tracking=cfg.tracking,
        reference=cfg.reference_point,
        declared=declared_frame(cfg.frame_size, cfg.source),
    )


def _left(deadline: float, cap: float | None = None) -> float:
    left = max(0.0, deadline - time.monotonic())
    return left if cap is None else min(cap, left)
