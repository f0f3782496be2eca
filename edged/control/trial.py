"""A rollout's trial on disk (`<state_dir>/rollout-trial.json`): which model is on trial on which pipeline,
since when, and the model before it, written before the swap and removed once the watch kept the model or
rolled it back.

A daemon that dies during the watch (a native crash in ONNX Runtime, an OOM kill, a power cut) leaves the file
behind. The next start (systemd's) finds it before the config is read for the pipelines: the pipeline's
`model.path` goes back to the previous model in the config file (atomically, `.prev` kept, as the rollback of a
running daemon does), the trial is written down in `<state_dir>/rollouts/history.jsonl` with why, and the
daemon reports it once it is connected: the `model_rolled_back` event, the answer to the rollout's command (its
id, so `edged fleet rollout` that still waits gets it) and `control.rollouts.rolled_back`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from edged.control.remoteconfig import apply_remote_config
from edged.core.durable import read_json, write_atomic
from edged.core.errors import CommandError

log = logging.getLogger(__name__)

TRIAL_FILE = "rollout-trial.json"
HISTORY_FILE = "rollouts/history.jsonl"
HISTORY_KEPT = 200  # lines of the history kept (the oldest go)


@dataclass(frozen=True)
class Trial:
    """One model on trial."""

    pipeline: str
    sha256: str
    candidate: str  # the new model's file
    previous: str  # the pipeline's `model.path` as the config file spelled it before the swap
    previous_sha256: str | None
    command_id: str
    response_topic: str | None
    started: float  # epoch s
    watch_s: float

    @classmethod
    def read(cls, state_dir: Path) -> Trial | None:
        """The trial left on disk, or None (none, or a file that is not one: then it is harmless)."""
        data = read_json(state_dir / TRIAL_FILE, "rollout trial")
        if not isinstance(data, dict):
            return None
        try:
            return cls(**{k: data[k] for k in cls.__dataclass_fields__})
        except (KeyError, TypeError):
            log.warning("rollout: %s is not a trial; ignored", state_dir / TRIAL_FILE)
            return None


def begin(state_dir: Path, trial: Trial) -> None:
    """Written before the swap (durably): a crash from now on is rolled back at the next start."""
    write_atomic(state_dir / TRIAL_FILE, json.dumps(asdict(trial)).encode())


def end(state_dir: Path, trial: Trial, outcome: str, why: str | None = None) -> None:
    """The watch decided (`kept`, `rolled_back`): the trial is over, and written down."""
    record(state_dir, trial, outcome, why)
    (state_dir / TRIAL_FILE).unlink(missing_ok=True)


def on_trial(state_dir: Path) -> str | None:
    """The pipeline a rollout has on trial now, or None."""
    trial = Trial.read(state_dir)
    return trial.pipeline if trial is not None else None


def record(state_dir: Path, trial: Trial, outcome: str, why: str | None) -> None:
    """One line of the rollouts' history (bounded; its loss is harmless: the events said it too)."""
    path = state_dir / HISTORY_FILE
    line = json.dumps({**asdict(trial), "outcome": outcome, "why": why, "at": round(time.time(), 3)})
    try:
        path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
        write_atomic(path, ("\n".join([*lines[-(HISTORY_KEPT - 1) :], line]) + "\n").encode())
    except OSError as exc:
        log.warning("rollout: cannot write %s: %s", path, exc.strerror or exc)


@dataclass(frozen=True)
class Recovered:
    """A trial that a crash interrupted, rolled back at this start."""

    trial: Trial
    why: str

    def answer(self) -> dict[str, Any]:
        """The answer to the rollout's command that the crash left unanswered."""
        return {"ok": False, "reason": "rolled_back", "detail": f"rolled back: {self.why}",
                "pipeline": self.trial.pipeline, "sha256": self.trial.sha256}  # fmt: skip


def recover(state_dir: Path, config: Path, check: Callable[[Path], object]) -> Recovered | None:
    """At start: a trial left on disk is rolled back in the config file (checked with `check`), written down,
    and returned for the daemon to report; None when there was none."""
    trial = Trial.read(state_dir)
    if trial is None:
        return None
    ago = max(0.0, time.time() - trial.started)
    why = (f"edged stopped {ago:.0f} s into the watch of {trial.sha256[:12]} on {trial.pipeline} without a clean "
           "stop (a crash, a kill, a power cut): the model that was on trial is not trusted")  # fmt: skip
    patch = {"pipelines": [{"name": trial.pipeline, "model": {"path": trial.previous}}]}
    try:
        apply_remote_config(config, patch, replace=False, check=check)
        why += f"; {trial.pipeline} runs {trial.previous} again"
    except CommandError as exc:
        why += f"; and the config could not be set back ({exc}): it still names the new model"
    log.error("rollout: %s", why)
    end(state_dir, trial, "rolled_back", why)
    return Recovered(trial, why)
