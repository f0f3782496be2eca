"""Reload (SIGHUP) and model swap, on a thread of their own so a long model build never blocks the daemon.

A reload re-reads the config file. An invalid file is rejected with the same messages as `check-config`
and the running config stays. Otherwise each pipeline's runner applies its part (edged/pipeline/runner.py:
a changed model, preprocessing or postprocessing is swapped in, built and warmed up beside the old one and
switched between two frames; a changed source is restarted; publish and snapshot settings are taken by
the next frame); what cannot change live (MQTT, spool, clock, status, device_id, new or removed pipelines,
threads) is named in the log and in the status as needing a restart. Every change gets a note.

The model files are also watched: when one changes (and has stopped changing for one poll, so a copy in
progress is not loaded half-written), its pipeline swaps to it the same way. On any failure the old model
keeps running and the status says why.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from edged.config import Config, load_config
from edged.core.errors import ConfigError
from edged.core.threads import Restart, Supervised
from edged.ops.systemd import notify
from edged.pipeline.runner import PipelineRunner

log = logging.getLogger(__name__)

MODEL_POLL_S = 5.0
RESTART_KEYS = ("device_id", "state_dir", "mqtt", "spool", "clock", "status", "control", "metrics", "homeassistant")


class Reloader(Supervised):
    """Applies reloads and model swaps one at a time, through the pipeline runners."""

    def __init__(
        self, config: Config, pipelines: list[PipelineRunner], config_path: Path | None, poll_s: float = MODEL_POLL_S
    ) -> None:
        super().__init__("edged-reload", restart=Restart())  # its state is the object's: safe to run again
        # the running config: the one owner of it (the daemon reads it here); a reload replaces it whole
        self.config = config
        self.pipelines = pipelines  # the runners a reload hands each pipeline's new config to
        self.config_path = config_path
        self.poll_s = poll_s
        self._wake = threading.Event()
        self._reload_asked = False
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self._status: dict[str, Any] = {"last": None, "result": None, "notes": []}
        self._done = threading.Condition(self._lock)
        self._reloads = 0  # reloads finished (a remote command waits for the one it asked for)
        self._running = 0

    def request_reload(self) -> None:
        """Re-read the config soon (safe from a signal handler)."""
        self._reload_asked = True
        self._wake.set()

    def reload_and_wait(self, timeout: float) -> dict[str, Any]:
        """Ask for a reload and wait until the reload thread has done it; its `status()` (result None on
        timeout: it is still running, e.g. a TensorRT build)."""
        with self._lock:
            target = self._reloads + 1 + self._running  # one already under way read the file before the ask
        self.request_reload()
        with self._done:
            if not self._done.wait_for(lambda: self._reloads >= target, timeout):
                return {"last": None, "result": None, "notes": [f"still reloading after {timeout:.0f} s"]}
        return self.status()

    def stop(self, timeout: float = 60.0) -> None:
        """Finish the swap in progress (within `timeout`), then end."""
        self.end_restarts()
        self._halt.set()
        self._wake.set()
        if self.is_alive():
            self.join(timeout=timeout)

    def status(self) -> dict[str, Any]:
        """The `reload` entry of the status JSON."""
        with self._lock:
            return {**self._status, "notes": list(self._status["notes"])}

    def body(self) -> None:
        """Wait for SIGHUP or the next model-file poll."""
        while not self._halt.is_set():
            self._wake.wait(self.poll_s)
            self._wake.clear()
            if self._halt.is_set():
                return
            try:
                if self._reload_asked:
                    self._counted_reload()
                self.poll_models()
            except Exception as exc:  # this thread must outlive any one bad reload or model file
                log.exception("reload: unexpected error; the running config and models stay")
                self._record("failed", [f"unexpected error: {type(exc).__name__}: {exc}"])

    # -- reload ---------------------------------------------------------------------------------------

    def _counted_reload(self) -> None:
        with self._lock:
            self._reload_asked = False
            self._running = 1
        try:
            self.reload()
        finally:
            with self._done:
                self._running = 0
                self._reloads += 1
                self._done.notify_all()

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
            log.log(logging.WARNING if "restart" in note or "refused" in note else logging.INFO, "reload: %s", note)
        self._record("applied", notes)
        log.info("reload: %s applied", self.config_path)
        notify("READY=1")
        return True

    def _apply(self, new: Config) -> list[str]:
        """Hand each pipeline's new config to its runner; name what needs a restart."""
        old = self.config
        notes = [
            f"{key} changed: takes effect after a restart"
            for key in RESTART_KEYS
            if getattr(new, key) != getattr(old, key)
        ]
        runners = {runner.name: runner for runner in self.pipelines}
        new_names = {p.name for p in new.pipelines}
        notes += [f"pipeline {n} added: starts after a restart" for n in sorted(new_names - set(runners))]
        notes += [f"pipeline {n} removed: stops after a restart" for n in sorted(set(runners) - new_names)]
        for p in new.pipelines:
            if p.name in runners:
                notes += runners[p.name].apply(p)
        if new.log_level != old.log_level:
            logging.getLogger().setLevel(new.log_level.upper())
            notes.append(f"log_level {new.log_level} applied")
        if new.watchdog_stall_s != old.watchdog_stall_s:
            notes.append(f"watchdog_stall_s {new.watchdog_stall_s:g} applied")
        self.config = old.model_copy(
            update={
                "pipelines": [runner.cfg for runner in self.pipelines],
                "log_level": new.log_level,
                "watchdog_stall_s": new.watchdog_stall_s,
            }
        )
        return notes

    def poll_models(self) -> None:
        """Swap to a model file that changed and has settled since the last poll."""
        for runner in list(self.pipelines):
            runner.poll_model()

    def _record(self, result: str, notes: list[str]) -> None:
        with self._lock:
            self._status = {"last": round(time.time(), 3), "result": result, "notes": notes}
