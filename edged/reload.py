"""Reload (SIGHUP) and model swap, on a thread of their own so a long model build never blocks the daemon.

A reload re-reads the config file. An invalid file is rejected with the same messages as `check-config`
and the running config stays. Otherwise, per pipeline: a changed model, preprocessing or postprocessing
is swapped in (built and warmed up beside the old one, then switched between two frames), a changed
source is restarted; what cannot change live (MQTT, spool, status, device_id, new or removed pipelines,
threads) is named in the log and in the status as "needs a restart".

The model files are also watched: when one changes (and has stopped changing for one poll, so a copy in
progress is not loaded half-written), its pipeline swaps to it the same way. On any failure the old model
keeps running and the status says why.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edged.config import Config, PipelineConfig, load_config
from edged.errors import ConfigError, EdgedError
from edged.osthread import name_os_thread
from edged.pipeline import describe_model, prepare_model
from edged.publish import pipeline_outputs
from edged.systemd import notify

if TYPE_CHECKING:
    from edged.daemon import Daemon, PipelineRuntime

log = logging.getLogger(__name__)

MODEL_POLL_S = 5.0
SOURCE_STOP_S = 10.0  # a source being replaced gets this long to stop, then it is detached
RESTART_KEYS = ("device_id", "state_dir", "mqtt", "spool", "status")


def model_file_stat(path: Path) -> tuple[int, int, int] | None:
    """(mtime_ns, size, inode) of a model file, None when it is not there (being replaced)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


class Reloader(threading.Thread):
    """Applies reloads and model swaps one at a time."""

    def __init__(self, daemon: Daemon, config_path: Path | None, poll_s: float = MODEL_POLL_S) -> None:
        super().__init__(name="edged-reload", daemon=True)
        self.daemon_ = daemon
        self.config_path = config_path
        self.poll_s = poll_s
        self._wake = threading.Event()
        self._reload_asked = False
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self._status: dict[str, Any] = {"last": None, "result": None, "notes": []}

    def request_reload(self) -> None:
        """Re-read the config soon (safe from a signal handler)."""
        self._reload_asked = True
        self._wake.set()

    def stop(self, timeout: float = 60.0) -> None:
        """Finish the swap in progress (within `timeout`), then end."""
        self._halt.set()
        self._wake.set()
        if self.is_alive():
            self.join(timeout=timeout)

    def status(self) -> dict[str, Any]:
        """The `reload` entry of the status JSON."""
        with self._lock:
            return {**self._status, "notes": list(self._status["notes"])}

    def run(self) -> None:
        """Wait for SIGHUP or the next model-file poll."""
        name_os_thread()
        while not self._halt.is_set():
            self._wake.wait(self.poll_s)
            self._wake.clear()
            if self._halt.is_set():
                return
            try:
                if self._reload_asked:
                    self._reload_asked = False
                    self.reload()
                self.poll_models()
            except Exception as exc:  # this thread must outlive any one bad reload or model file
                log.exception("reload: unexpected error; the running config and models stay")
                self._record("failed", [f"unexpected error: {type(exc).__name__}: {exc}"])

    # -- reload ---------------------------------------------------------------------------------------

    def reload(self) -> bool:
        """Re-read the config file and apply what can change live. True when the new config was taken."""
        if self.config_path is None:
            log.warning("reload asked, but this daemon was not started from a config file")
            return False
        notify("RELOADING=1")
        try:
            new = load_config(self.config_path)
        except ConfigError as exc:
            for problem in exc.problems:
                log.error("reload rejected, the running config stays: %s", problem)  # noqa: TRY400
            self._record("rejected", exc.problems)
            notify("READY=1")
            return False
        except Exception as exc:  # whatever the file holds, RELOADING=1 is followed by READY=1
            log.exception("reload rejected, the running config stays")
            self._record("rejected", [f"{self.config_path}: {type(exc).__name__}: {exc}"])
            notify("READY=1")
            return False
        try:
            notes = self._apply(new)
        except Exception as exc:
            log.exception("reload failed part-way; what was applied stays, the rest keeps the running config")
            self._record("failed", [f"applying {self.config_path}: {type(exc).__name__}: {exc}"])
            notify("READY=1")
            return False
        for note in notes:
            log.warning("reload: %s", note)
        self._record("applied", notes)
        log.info("reload: %s applied", self.config_path)
        notify("READY=1")
        return True

    def _apply(self, new: Config) -> list[str]:
        d = self.daemon_
        old = d.config
        notes = [
            f"{key} changed: takes effect after a restart"
            for key in RESTART_KEYS
            if getattr(new, key) != getattr(old, key)
        ]
        by_name = {rt.cfg.name: rt for rt in d.pipelines}
        new_names = {p.name for p in new.pipelines}
        notes += [f"pipeline {n} added: starts after a restart" for n in new_names - set(by_name)]
        notes += [f"pipeline {n} removed: stops after a restart" for n in set(by_name) - new_names]
        applied: list[PipelineConfig] = []
        for p in new.pipelines:
            rt = by_name.get(p.name)
            if rt is None:
                continue
            applied.append(self._apply_pipeline(rt, p, notes))
        kept = [rt.cfg for rt in d.pipelines if rt.cfg.name not in new_names]
        logging.getLogger().setLevel(new.log_level.upper())
        d.config = old.model_copy(
            update={"pipelines": applied + kept, "log_level": new.log_level, "watchdog_stall_s": new.watchdog_stall_s}
        )
        return notes

    def _apply_pipeline(self, rt: PipelineRuntime, p: PipelineConfig, notes: list[str]) -> PipelineConfig:
        old = rt.cfg
        if (p.model.threads, p.model.concurrency) != (old.model.threads, old.model.concurrency):
            notes.append(f"pipeline {p.name}: threads/concurrency take effect after a restart")
        if (p.model, p.preprocess, p.postprocess) != (old.model, old.preprocess, old.postprocess) and not self.swap(
            rt, p
        ):
            p = p.model_copy(update={"model": old.model, "preprocess": old.preprocess, "postprocess": old.postprocess})
        if p.source != old.source:
            self._restart_source(rt, p)
        if (p.publish, p.snapshot) != (old.publish, old.snapshot):
            self._apply_outputs(rt, p)
            notes.append(f"pipeline {p.name}: publish/snapshot settings applied (the publish filter starts afresh)")
        rt.cfg = p
        return p

    def _apply_outputs(self, rt: PipelineRuntime, p: PipelineConfig) -> None:
        """New publish filter and snapshot settings for the pipeline's workers (used only inside a turn:
        the next frame takes them)."""
        publish, snapshots = pipeline_outputs(p, self.daemon_.config.state_dir)
        for worker in rt.workers:
            worker.publish, worker.snapshots = publish, snapshots

    def _restart_source(self, rt: PipelineRuntime, p: PipelineConfig) -> None:
        old = rt.source
        if old is not None:
            old.stop(close_slot=False)  # the inference workers stay; only the source changes
            old.join(SOURCE_STOP_S)
            if old.is_alive():  # stuck in a read: it must not feed the slot beside its replacement
                old.detach()
                log.warning(
                    "pipeline %s: the old source did not stop within %.0f s; detached from the pipeline",
                    p.name, SOURCE_STOP_S,
                )  # fmt: skip
        rt.cfg = p
        rt.source = self.daemon_.make_source(rt)
        rt.source.start()
        log.info("pipeline %s: source restarted on %s", p.name, p.source.uri)

    # -- model swap -----------------------------------------------------------------------------------

    def swap(self, rt: PipelineRuntime, p: PipelineConfig) -> bool:
        """Build and warm up `p`'s model beside the running one, then switch. False keeps the old one."""
        if rt.ref is None:
            return False
        stat = model_file_stat(p.model.path)
        try:
            model = prepare_model(p, self.daemon_.config.state_dir, rt.cores)
        except EdgedError as exc:
            rt.model_stat = stat  # do not retry this file until it changes again
            rt.stats.set_error(f"model swap failed, still running {rt.stats.model_name}: {exc}")
            log.error("pipeline %s: new model not used, the old one keeps running: %s", p.name, exc)  # noqa: TRY400
            return False
        if p.source.type == "sensor" and model.pre.spec != rt.ref.current.pre.spec:
            rt.model_stat = stat
            rt.stats.set_error("model swap refused: the new model needs another sensor window; restart edged")
            log.error("pipeline %s: the new model needs another sensor window; restart edged to use it", p.name)
            return False
        old = rt.ref.swap(model)
        rt.model_stat = stat
        describe_model(rt.stats, model)
        rt.stats.set_error(None)
        log.info(
            "pipeline %s: model swapped %s (%s) -> %s (%s)",
            p.name, old.loaded.name, old.loaded.sha256[:12], model.loaded.name, model.loaded.sha256[:12],
        )  # fmt: skip
        return True

    def poll_models(self) -> None:
        """Swap to a model file that changed and has settled since the last poll."""
        for rt in list(self.daemon_.pipelines):
            stat = model_file_stat(rt.cfg.model.path)
            if stat is None or stat == rt.model_stat:
                rt.seen_stat = stat
                continue
            if stat == rt.seen_stat:  # unchanged for a whole poll: the copy is complete
                log.info("pipeline %s: %s changed; swapping the model", rt.cfg.name, rt.cfg.model.path)
                self.swap(rt, rt.cfg)
            rt.seen_stat = stat

    def _record(self, result: str, notes: list[str]) -> None:
        with self._lock:
            self._status = {"last": round(time.time(), 3), "result": result, "notes": notes}
