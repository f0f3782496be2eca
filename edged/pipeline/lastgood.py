"""Which model a pipeline may run at start: its last good model, and the models on trial (`<state_dir>/models/`).

A model *ran cleanly* once its pipeline ran it for `model.proven_after_s` (60 s) with at least
GOOD_AFTER_RESULTS results and
no failure (a rollout's model: once its watch kept it). Then a copy is kept (`models/<sha256>.onnx`, where a
rollout puts its models anyway, so those cost no copy) and recorded as the
pipeline's last good model (`models/last-good.json`), so a pipeline whose configured model cannot be used
falls back to it even after the operator's file is gone.

A model that has not run cleanly yet is *on trial*: before the daemon loads it in-process its tries are counted
(`models/tries.json`, written before the load), and cleared when it runs cleanly or the daemon stops cleanly, or
when the run did not end in a native crash (ops/crashlog.py: a power cut or a SIGKILL in a model's first minute
is no evidence against it). So a model that crashes the whole process (a native crash inside ONNX Runtime:
SIGSEGV, an abort) is found at the next start, the one systemd makes:

- tried 0 times: loaded in-process as usual (no cost for a model that works);
- tried once, the process died meanwhile: loaded first in a child process (tools/probe.py: the same loader,
  warm-up runs included); a child that dies (a signal) or fails sets the model aside;
- tried twice without running cleanly: set aside without asking (it may crash on real frames only).

A pipeline whose model is set aside, or cannot be loaded at all, runs its last good model (status says so, and
why); with none, it is set aside itself and the rest of the daemon (the other pipelines, the spool, the uplink,
remote control) runs on. Never a restart loop that silences the device: at most two starts with one model.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from edged.core.durable import commit, read_json, write_atomic

log = logging.getLogger(__name__)

GOOD_AFTER_RESULTS = 10  # a model runs `model.proven_after_s` with at least this many results, without a failure
TRIES_BEFORE_PROBE = 1  # died with the daemon this many times before running cleanly: probed in a child first
TRIES_SET_ASIDE = 2  # ... this many: set aside

Decision = Literal["load", "probe", "set_aside"]


@dataclass(frozen=True)
class LastGood:
    """A pipeline's last good model."""

    path: Path
    sha256: str
    since: float  # epoch s: when it was found to run cleanly
    custom_ops: tuple[Path, ...] = ()  # the custom operator libraries it ran with


class ModelGuard:
    """The last good models and the tries of the models on trial, for one state dir (thread-safe)."""

    def __init__(self, state_dir: Path, *, crashed: bool = True) -> None:
        """`crashed`: the last run ended in a native crash (ops/crashlog.py); when not (a clean stop, a power cut,
        a SIGKILL), the tries of the models it loaded are no evidence against them and are forgotten (a model
        it set aside keeps its tries: it did not run)."""
        self.models = state_dir / "models"
        self._good_file = self.models / "last-good.json"
        self._tries_file = self.models / "tries.json"
        self._lock = threading.Lock()
        good = read_json(self._good_file, "last good models")
        raw = read_json(self._tries_file, "model tries")
        saved: dict[str, Any] = raw if isinstance(raw, dict) else {}
        run, tries = saved.get("run"), saved.get("pipelines")
        last = run if isinstance(run, int) else 0
        self.run = last + 1  # this start's number: a try records the run that made it
        tries = tries if isinstance(tries, dict) else {}
        self._good: dict[str, dict[str, Any]] = good if isinstance(good, dict) else {}
        self._tries: dict[str, dict[str, Any]] = {
            p: t for p, t in tries.items() if isinstance(t, dict) and (crashed or t.get("run") != last)
        }
        self._save_tries()

    def last_good(self, pipeline: str) -> LastGood | None:
        """The pipeline's last good model, when one is recorded and its kept file is there."""
        with self._lock:
            entry = self._good.get(pipeline)
        if not isinstance(entry, dict):
            return None
        path, sha = Path(str(entry.get("path", ""))), str(entry.get("sha256", ""))
        if not path.is_file() or len(sha) != 64:
            return None
        ops = entry.get("custom_ops")
        libraries = tuple(Path(str(p)) for p in ops) if isinstance(ops, list) else ()
        return LastGood(path, sha, float(entry.get("since") or 0.0), libraries)

    def is_good(self, pipeline: str, sha256: str) -> bool:
        """Whether this is the pipeline's last good model."""
        good = self.last_good(pipeline)
        return good is not None and good.sha256 == sha256

    def decide(self, pipeline: str, sha256: str) -> tuple[Decision, int]:
        """How to start `pipeline` on the model `sha256`, and how often it was tried before."""
        if self.is_good(pipeline, sha256):
            return "load", 0
        with self._lock:
            entry = self._tries.get(pipeline) or {}
        tries = int(entry.get("tries", 0)) if entry.get("sha256") == sha256 else 0
        if tries >= TRIES_SET_ASIDE:
            return "set_aside", tries
        return ("probe" if tries >= TRIES_BEFORE_PROBE else "load"), tries

    def trying(self, pipeline: str, sha256: str) -> None:
        """The daemon loads a model that has not run cleanly yet: one try more, on disk before the load."""
        if self.is_good(pipeline, sha256):
            return
        with self._lock:
            entry = self._tries.get(pipeline) or {}
            tries = int(entry.get("tries", 0)) if entry.get("sha256") == sha256 else 0
            self._tries[pipeline] = {"sha256": sha256, "tries": tries + 1, "run": self.run, "at": round(time.time(), 3)}
            self._save_tries()

    def proved(self, pipeline: str, model: Path, sha256: str, custom_ops: list[Path] | None = None) -> None:
        """The pipeline ran `model` (with `custom_ops`) cleanly: keep it as its last good model, and its tries
        are over."""
        if self.is_good(pipeline, sha256):
            return
        kept = self.models / f"{sha256}.onnx"
        try:
            self.models.mkdir(mode=0o750, parents=True, exist_ok=True)
            if not kept.is_file():
                _keep_copy(model, kept)
        except OSError as exc:
            log.warning("pipeline %s: cannot keep its model as the last good one: %s", pipeline, exc)
            return
        with self._lock:
            self._good[pipeline] = {"path": str(kept), "sha256": sha256, "since": round(time.time(), 3),
                                    "custom_ops": [str(p) for p in custom_ops or []]}  # fmt: skip
            self._tries.pop(pipeline, None)
            self._save(self._good_file, self._good)
            self._save_tries()
        log.info("pipeline %s: model %s ran cleanly; kept as its last good model", pipeline, sha256[:12])

    def stopped_cleanly(self, ran: set[str]) -> None:
        """A clean stop: the models on trial in pipelines that ran them (`ran`) did not crash the process; their
        tries are forgotten (a model set aside keeps its own: a clean restart must not load it again)."""
        with self._lock:
            if any(p in self._tries for p in ran):
                self._tries = {p: t for p, t in self._tries.items() if p not in ran}
                self._save_tries()

    def kept(self) -> set[Path]:
        """The files kept as last good models (a rollout's tidying leaves them)."""
        with self._lock:
            return {Path(str(e.get("path"))) for e in self._good.values() if isinstance(e, dict)}

    def _save_tries(self) -> None:
        self._save(self._tries_file, {"run": self.run, "pipelines": self._tries})

    def _save(self, path: Path, data: dict[str, Any]) -> None:
        try:
            self.models.mkdir(mode=0o750, parents=True, exist_ok=True)
            write_atomic(path, json.dumps(data, sort_keys=True).encode())
        except OSError as exc:
            log.warning("cannot write %s: %s", path, exc.strerror or exc)


def _keep_copy(model: Path, kept: Path) -> None:
    """A copy (not a link: an operator who copies a new model over the old file would change it too), durably."""
    tmp = kept.with_name(f".{kept.name}.tmp")
    tmp.unlink(missing_ok=True)
    shutil.copyfile(model, tmp)
    with contextlib.suppress(OSError):
        tmp.chmod(0o640)
    commit(tmp, kept)
