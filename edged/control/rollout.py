"""The `model` command: a new model for one pipeline, swapped in only when it proves itself here.

    signature ─▶ fetch + sha256 ─▶ record recent frames ─▶ check (child process) ─▶ swap ─▶ watch ─▶ kept
         │              │                                      │                    │        │
      refused        refused                               rejected            rolled back  rolled back

- the sha256 must carry an Ed25519 signature by a key in `control.public_keys` (the command's own
  signature covers the URL; this one covers the model, wherever it came from);
- the file must have that sha256 (`edged/control/modelfetch.py`);
- the check (`edged/tools/candidate.py`, a child process: a malformed model crashes it, not the daemon)
  runs the current and the new model on frames this pipeline saw just now, with `edged validate`'s gates,
  and compares their speed;
- the swap is a config change (the pipeline's `model.path`) applied by a reload, as an operator's edit is;
- the watch: for `watch_s`, the pipeline must not fail, and the best rate it reaches must be at least
  `min_fps_ratio` of the rate before the swap (not on a motion-gated pipeline, whose rate follows the
  scene); else the previous model goes back the same way.

Every step is an event on `edged/{device_id}/events` (model_fetching, model_fetched, model_validating,
model_rejected, model_swapped, model_rolled_back, model_kept), each with the command's id.
"""

from __future__ import annotations

import json
import logging
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import yaml

from edged.control import trial
from edged.control.modelfetch import fetch_url, model_path
from edged.control.remoteconfig import apply_remote_config
from edged.control.rolloutspec import CandidateSpec, ModelArgs
from edged.control.trial import Trial
from edged.core.errors import CommandError
from edged.core.signing import load_public_key, verify_file_digest
from edged.pipeline.frametap import FrameTap, save_frames
from edged.pipeline.settings import PipelineConfig

log = logging.getLogger(__name__)

RELOAD_WAIT_S = 120.0
WATCH_STEP_S = 1.0
KEEP_MODELS = 2  # fetched models kept: the running one and the one before (a rollback needs no download)
GPU_CHECK_PROVIDER = {"TensorrtExecutionProvider": "CUDAExecutionProvider"}  # no engine build for a check

Event = Callable[..., None]
FetchChunks = Callable[[str, int, float], Path]  # (sha256, max_bytes, timeout) -> the verified file


class RolloutTarget(Protocol):
    """What a rollout needs of the daemon."""

    def snapshot(self) -> dict[str, Any]:
        """The status JSON."""
        ...

    def reload_and_wait(self, timeout: float) -> dict[str, Any]:
        """Reload the config file; the reload status."""
        ...

    def config_file(self) -> Path | None:
        """The config file the daemon runs from."""
        ...

    def model_proved(self, pipeline: str, path: Path, sha256: str) -> None:
        """The watch kept the model: it is the pipeline's last good model now (pipeline/lastgood.py)."""
        ...

    def kept_models(self) -> set[Path]:
        """Model files kept as some pipeline's last good one."""
        ...

    def frame_tap(self, pipeline: str | None) -> tuple[str, FrameTap]:
        """A pipeline's name and frame tap."""
        ...

    def pipeline_config(self, name: str) -> PipelineConfig:
        """The running config of a pipeline."""
        ...

    def check_config(self, path: Path) -> object:
        """Load a config file as check-config does (ConfigError when it is not valid)."""
        ...

    def candidate_command(self) -> list[str]:
        """The command that judges a candidate model in a child process (SPEC.json is appended)."""
        ...


class Rollout:
    """One `model` command, run on the edged-control thread."""

    def __init__(self, args: ModelArgs, *, target: RolloutTarget, public_keys: list[str], state_dir: Path,
                 max_bytes: int, event: Event, fetch_chunks: FetchChunks, stopping: threading.Event,
                 ca_file: Path | None = None, command: tuple[str, str | None] = ("", None)) -> None:  # fmt: skip
        """`command`: the rollout's command id and response topic (a crash's rollback answers it later)."""
        self.args = args
        self.state_dir = state_dir
        self.command = command
        self.target = target
        self.keys = [load_public_key(k) for k in public_keys]
        self.models = state_dir / "models"
        self.work = state_dir / "rollouts"
        self.max_bytes = max_bytes
        self.fetch_chunks = fetch_chunks
        self.stopping = stopping
        self.ca_file = ca_file
        self._event = event
        self.pipeline = ""

    def step(self, name: str, **fields: Any) -> None:
        """An event of this rollout."""
        log.info("rollout %s on %s: %s %s", self.args.sha256[:12], self.pipeline or "?", name, fields or "")
        self._event(name, pipeline=self.pipeline, sha256=self.args.sha256, **fields)

    def run(self) -> tuple[bool, dict[str, Any]]:
        """Every step; True with the outcome, or CommandError with the reason and, where a check ran, its report."""
        a = self.args
        if not verify_file_digest(a.sha256, a.signature, self.keys):
            raise CommandError("bad_model_signature", "no trusted key signed this model's sha256")
        self.pipeline, tap = self.target.frame_tap(a.pipeline)
        config = self.target.config_file()
        if config is None:
            raise CommandError("failed", "this daemon was not started from a config file")
        before = self._pipeline_status()
        current = self.target.pipeline_config(self.pipeline).model.path
        if before.get("model", {}).get("sha256") == a.sha256:
            return True, {"pipeline": self.pipeline, "result": "unchanged", "sha256": a.sha256}
        candidate = self._fetch()
        report = self._check(current, candidate, tap)
        raw_path = _raw_model_path(config, self.pipeline)
        on_trial = Trial(self.pipeline, a.sha256, str(candidate), raw_path, before.get("model", {}).get("sha256"),
                         self.command[0], self.command[1], time.time(), a.watch_s)  # fmt: skip
        trial.begin(self.state_dir, on_trial)  # before the swap: a crash from here on is rolled back at start
        try:
            regression = self._swap_and_watch(config, str(candidate), before)
        except CommandError as exc:  # the swap's reload failed, and was undone
            trial.end(self.state_dir, on_trial, exc.reason, str(exc))
            raise
        if regression is not None:
            self._swap(config, raw_path, None)
            self.step("model_rolled_back", reason=regression)
            trial.end(self.state_dir, on_trial, "rolled_back", regression)
            raise CommandError("rolled_back", f"rolled back: {regression}", {"check": report})
        self.step("model_kept")
        trial.end(self.state_dir, on_trial, "kept")
        self.target.model_proved(self.pipeline, candidate, a.sha256)
        self._tidy(candidate, current)
        return True, {"pipeline": self.pipeline, "result": "kept", "sha256": a.sha256, "previous": str(current),
                      "check": report}  # fmt: skip

    # -- the steps ---------------------------------------------------------------------------------------

    def _pipeline_status(self) -> dict[str, Any]:
        for p in self.target.snapshot().get("pipelines", []):
            if p.get("name") == self.pipeline:
                return dict(p)
        return {}

    def _fetch(self) -> Path:
        a = self.args
        self.step("model_fetching", via=a.via)
        started = time.monotonic()
        if a.via == "url":
            if not a.url:
                raise CommandError("malformed", "args.url: a `via: url` rollout needs the model's URL")
            path = fetch_url(a.url, self.models, a.sha256, max_bytes=self.max_bytes, timeout=a.download_timeout_s,
                             ca_file=self.ca_file)  # fmt: skip
        else:
            path = self.fetch_chunks(a.sha256, self.max_bytes, a.download_timeout_s)
        self.step("model_fetched", bytes=path.stat().st_size, took_s=round(time.monotonic() - started, 3))
        return path

    def _check(self, current: Path, candidate: Path, tap: FrameTap) -> dict[str, Any]:
        a = self.args
        frames = tap.record(a.frames, 1, a.frames_timeout_s, self.pipeline)
        self.work.mkdir(mode=0o750, parents=True, exist_ok=True)
        data = save_frames(self.work / f"{a.sha256}.npz", frames)
        spec_file = self.work / f"{a.sha256}.json"
        status = self._pipeline_status()
        provider = str(status.get("provider") or "CPUExecutionProvider")
        pcfg = self.target.pipeline_config(self.pipeline)
        preprocess = pcfg.preprocess.model_dump(mode="json", exclude_unset=True) or None
        spec = CandidateSpec(
            current=current,
            candidate=candidate,
            frames=data,
            gates=a.gates,
            preprocess=preprocess,
            provider=GPU_CHECK_PROVIDER.get(provider, provider),
            max_slowdown=a.max_slowdown,
        )
        spec_file.write_text(spec.model_dump_json(), encoding="utf-8")
        self.step("model_validating", frames=len(frames))
        try:
            report = _run_check(self.target.candidate_command(), spec_file, a.check_timeout_s)
        finally:
            data.unlink(missing_ok=True)
            spec_file.unlink(missing_ok=True)
        if not report.get("passed"):
            failed = str(report.get("failed", "error"))
            why = _why(report)
            self.step("model_rejected", failed=failed, why=why)
            reason = {"validation": "validation_failed", "speed": "too_slow"}.get(failed, "check_failed")
            raise CommandError(reason, f"the new model was not swapped in: {why}", {"check": report})
        return report

    def _swap_and_watch(self, config: Path, path: str, before: dict[str, Any]) -> str | None:
        """Swap the new model in and watch it; what regressed, or None."""
        self._swap(config, path, before)
        # a motion-gated pipeline's rate follows the scene, not the model: there the watch looks at failures
        # only (the check before the swap already compared the speed on the same frames)
        gated = self.target.pipeline_config(self.pipeline).motion.enabled
        return self._watch(0.0 if gated else float(before.get("fps") or 0.0))

    def _swap(self, config: Path, path: str, before: dict[str, Any] | None) -> None:
        """Point the pipeline at `path` and reload (`before` None: this is the rollback)."""
        patch = {"pipelines": [{"name": self.pipeline, "model": {"path": path}}]}
        apply_remote_config(config, patch, replace=False, check=self.target.check_config)
        result = self.target.reload_and_wait(RELOAD_WAIT_S)
        if result.get("result") != "applied":
            if before is not None:  # the swap did not take: back to the previous file now
                self._swap(config, _raw_model_path(config.with_name(config.name + ".prev"), self.pipeline), None)
                self.step("model_rolled_back", reason=f"the reload failed: {result.get('error')}")
                raise CommandError("rolled_back", f"the reload with the new model failed: {result.get('error')}")
            raise CommandError("failed", f"the rollback's reload failed too: {result.get('error')}")
        if before is not None:
            self.step("model_swapped", previous=before.get("model", {}).get("sha256"))

    def _watch(self, baseline_fps: float) -> str | None:
        """None when the pipeline held up for `watch_s`; else what regressed."""
        a = self.args
        deadline = time.monotonic() + a.watch_s
        best = 0.0
        while True:
            status = self._pipeline_status()
            if status.get("state") == "failed":
                return f"pipeline {self.pipeline} failed: {status.get('error')}"
            if status.get("model", {}).get("sha256") not in (a.sha256, None):
                return "the pipeline no longer runs the new model"
            best = max(best, float(status.get("fps") or 0.0))
            left = deadline - time.monotonic()
            if left <= 0 or self.stopping.is_set():
                break
            self.stopping.wait(min(WATCH_STEP_S, left))  # asleep between looks; a stop ends the watch
        if a.watch_s > 0 and baseline_fps > 0 and best < a.min_fps_ratio * baseline_fps:
            return (f"{best:.1f} results/s at best in {a.watch_s:g} s, under {a.min_fps_ratio:g} x "
                    f"{baseline_fps:.1f} before the swap")  # fmt: skip
        return None

    def _tidy(self, keep: Path, previous: Path) -> None:
        """Fetched models beyond the newest KEEP_MODELS go (never the running or the previous one)."""
        try:
            fetched = sorted(self.models.glob("*.onnx"), key=lambda p: p.stat().st_mtime, reverse=True)
        except OSError:
            return
        kept = self.target.kept_models()
        for path in fetched[KEEP_MODELS:]:
            if path not in (keep, previous) and path not in kept:
                path.unlink(missing_ok=True)


def _raw_model_path(config: Path, pipeline: str) -> str:
    """The pipeline's `model.path` as the file spells it (a rollback restores it verbatim)."""
    try:
        data = yaml.safe_load(config.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise CommandError("failed", f"cannot read {config}: {exc}") from exc
    for p in data.get("pipelines") or []:
        if isinstance(p, dict) and p.get("name") == pipeline and isinstance(p.get("model"), dict):
            return str(p["model"]["path"])
    raise CommandError("failed", f"{config} has no pipeline {pipeline!r} with a model path")


def _run_check(command: list[str], spec_file: Path, timeout: float) -> dict[str, Any]:
    """Run the candidate check (edged/tools/candidate.py, as the daemon was handed it) in a child process;
    its JSON report."""
    if not command:
        return {"passed": False, "failed": "error", "error": "this daemon was started without the model check"}
    try:
        done = subprocess.run(  # our own interpreter and module, no shell
            [*command, str(spec_file)],
            capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"passed": False, "failed": "error", "error": f"the model check took over {timeout:g} s"}
    lines = done.stdout.strip().splitlines()
    try:
        report: dict[str, Any] = json.loads(lines[-1]) if lines else {}
    except ValueError:
        report = {}
    if not report:
        tail = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        return {"passed": False, "failed": "error", "error": f"the model check crashed: {tail[0][:300]}"}
    return report


def _why(report: dict[str, Any]) -> str:
    """One line: the first gate that failed."""
    if report.get("failed") == "error":
        return str(report.get("error"))
    if report.get("failed") == "speed":
        s = report.get("speed", {})
        return f"{s.get('ratio')}x slower than the current model (at most {s.get('max_slowdown')}x)"
    for check in report.get("validation", {}).get("checks", []):
        if not check.get("passed"):
            return f"{check.get('check')} {check.get('threshold')}: got {check.get('value')}"
    return "a gate failed"


__all__ = ["ModelArgs", "Rollout", "RolloutTarget", "model_path"]
