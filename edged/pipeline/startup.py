"""How each pipeline gets its model at start: the CPU cores shared out, the model each may run (its configured one,
or its last good one: lastgood.py), a probe in a child process for a model that died with the daemon before, and
the models that ran cleanly recorded as their pipelines' last good ones."""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from edged.core.errors import EdgedError
from edged.model import engines
from edged.model.session import CPU, TENSORRT, file_sha256, select_providers, share_cores, usable_cores
from edged.pipeline.lastgood import GOOD_AFTER_RESULTS, ModelGuard
from edged.pipeline.model import Model
from edged.pipeline.runner import PipelineRunner
from edged.pipeline.settings import PipelineConfig

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 300.0  # a model loaded in a child process at start (a TensorRT build can take minutes)

Probe = Callable[[PipelineConfig], "str | None"]  # loads a pipeline's model in a child process: why it failed


def load_models(
    pipelines: list[PipelineRunner], state_dir: Path, guard: ModelGuard, probe: Probe | None
) -> list[Model | None]:
    """Load every pipeline's model, the CPU cores shared between CPU pipelines; announce TensorRT builds. A
    pipeline whose model cannot run gets its last good one, or None: it is set aside (pipeline/lastgood.py)."""
    import onnxruntime as ort  # noqa: PLC0415

    available = ort.get_available_providers()
    on_cpu = [select_providers(runner.cfg.model.providers, available)[0] == CPU for runner in pipelines]
    shares = share_cores([runner.cfg.model for runner in pipelines], on_cpu, usable_cores())
    models = []
    for runner, cores in zip(pipelines, shares, strict=True):
        runner.cores = cores
        models.append(start_model(runner, guard, probe))  # the same loader as a reload's model swap
    if any(m is not None and m.loaded.provider == TENSORRT for m in models):
        engines.cleanup([runner.cfg.model for runner in pipelines], state_dir)
    return models


def child_probe(command: Sequence[str], config_path: Path | None) -> Probe | None:
    """Load a pipeline's model in a child process (`command` + the config file + the pipeline's name): None when
    it loads and runs, else what happened (a signal: the crash a model brought; else the child's last line)."""
    if not command or config_path is None:
        return None

    def probe(cfg: PipelineConfig) -> str | None:
        try:
            done = subprocess.run([*command, str(config_path), cfg.name], capture_output=True, text=True,
                                  timeout=PROBE_TIMEOUT_S, check=False)  # fmt: skip
        except subprocess.TimeoutExpired:
            return f"did not load within {PROBE_TIMEOUT_S:.0f} s"
        if done.returncode == 0:
            return None
        if done.returncode < 0:
            return f"died of {signal.Signals(-done.returncode).name} while loading and running it"
        tail = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        return f"failed to load it: {tail[0][:300]}"

    return probe


def start_model(runner: PipelineRunner, guard: ModelGuard, probe: Probe | None) -> Model | None:
    """The model `runner` starts on: its configured one, unless that was set aside (module docstring) or cannot
    be loaded; then its last good one; None when neither (the pipeline is set aside, status says why)."""
    cfg = runner.cfg
    try:
        sha = file_sha256(cfg.model.path)
    except OSError:
        sha = ""  # the loader says what is wrong with the file
    decision, tries = guard.decide(cfg.name, sha) if sha else ("load", 0)
    why: str | None = None
    if decision == "set_aside":
        why = (f"its model ({sha[:12]}) died with the daemon {tries} times before it ran cleanly; set aside "
               "(a native crash in ONNX Runtime, or on real frames)")  # fmt: skip
    elif decision == "probe" and probe is not None:
        problem = probe(cfg)
        if problem is not None:
            why = f"its model ({sha[:12]}) died with the daemon before it ran cleanly, and in a child process {problem}"
    if why is None:
        if sha:
            guard.trying(cfg.name, sha)
        try:
            return runner.load()
        except EdgedError as exc:
            why = f"its model cannot be loaded: {exc}"
    return _fall_back(runner, guard, sha, why)


def _fall_back(runner: PipelineRunner, guard: ModelGuard, sha: str, why: str) -> Model | None:
    good = guard.last_good(runner.name)
    pinned = runner.cfg.model.sha256
    if good is not None and pinned is not None and good.sha256 != pinned.lower():
        good = None  # `model.sha256` pins the one model this pipeline may run: no other, however good
    if good is not None and good.sha256 != sha:
        model_cfg = runner.cfg.model.model_copy(
            update={"path": good.path, "sha256": None, "custom_ops": list(good.custom_ops)}
        )
        cfg = runner.cfg.model_copy(update={"model": model_cfg})
        try:
            model = runner.load(cfg)
        except EdgedError as exc:
            why += f"; its last good model ({good.sha256[:12]}) cannot be loaded either: {exc}"
        else:
            runner.fallback = f"runs its last good model ({good.sha256[:12]}): {why}"
            runner.cfg = cfg
            log.error("pipeline %s %s", runner.name, runner.fallback)
            return model
    set_aside(runner, f"set aside: {why}; no earlier model ran cleanly here" if good is None or good.sha256 == sha
                     else f"set aside: {why}")  # fmt: skip
    log.error("pipeline %s %s", runner.name, runner.stats.error)
    return None


def prove_models(
    runners: list[PipelineRunner],
    guard: ModelGuard | None,
    seen: dict[str, tuple[str, float, int]],
    on_trial: str | None,
) -> None:
    """A model that ran cleanly for its `model.proven_after_s` becomes its pipeline's last good model (lastgood.py);
    not while a rollout has it on trial (the rollout's watch decides). `seen`: per pipeline, the model it runs,
    since when (monotonic) and its frame count then; kept by the caller between calls."""
    now = time.monotonic()
    for runner in runners:
        if guard is None or runner.ref is None or runner.name == on_trial or not runner.running():
            continue
        sha = runner.ref.current.loaded.sha256
        snap = runner.stats.snapshot()
        frames = int(snap.get("frames") or 0)
        first = seen.get(runner.name)
        if first is None or first[0] != sha:
            seen[runner.name] = (sha, now, frames)
            continue
        ran_s, results = now - first[1], frames - first[2]
        if (
            snap.get("state") == "running"
            and ran_s >= runner.cfg.model.proven_after_s
            and results >= GOOD_AFTER_RESULTS
        ):
            guard.proved(runner.name, runner.ref.current.loaded.path, sha, runner.cfg.model.custom_ops)


def set_aside(runner: PipelineRunner, why: str) -> None:
    """Not started: no model it could run (the rest of the daemon runs on; status says why)."""
    runner.aside = why
    runner.stats.set_state("failed", error=why)


def stopped_cleanly(guard: ModelGuard | None, runners: list[PipelineRunner]) -> None:
    """A clean stop: the models that ran did not crash the process (their tries go)."""
    if guard is not None:
        guard.stopped_cleanly({r.name for r in runners if r.ref is not None})
