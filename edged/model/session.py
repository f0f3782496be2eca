"""ONNX Runtime sessions: provider choice, provider options, loading errors, warm-up."""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from edged.core.errors import ModelError, ProviderError
from edged.model import trtcache
from edged.model.feeds import Feeds
from edged.model.preprocess import DTYPES, ORT_TYPES
from edged.model.settings import ModelConfig

log = logging.getLogger(__name__)

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"


@dataclass
class LoadedModel:
    """A ready session and what the pipeline and messages need to know about it."""

    session: ort.InferenceSession
    path: Path
    name: str
    sha256: str
    providers: list[str]  # what the session really uses, in order
    input_name: str
    input_shape: list[Any]
    input_type: str
    output_names: list[str]
    metadata: dict[str, str] = field(default_factory=dict)
    int8: bool = False  # holds quantized operators
    concurrency: int = 1  # runs the pipeline may make at once
    engine_dir: Path | None = None  # TensorRT's engine cache, sealed after the warm-up built the engines
    feeds: Feeds | None = None  # the model's other inputs (constants, recurrent state): model.inputs

    @property
    def provider(self) -> str:
        """The provider that runs the model (the first one the session really uses)."""
        return self.providers[0]

    def run(self, tensor: npt.NDArray[Any]) -> list[npt.NDArray[Any]]:
        """One inference; returns the outputs in `output_names` order."""
        if self.feeds is None:
            outputs: list[npt.NDArray[Any]] = self.session.run(self.output_names, {self.input_name: tensor})
            return outputs
        outputs = self.session.run(self.output_names, self.feeds.feed(tensor))
        self.feeds.keep(dict(zip(self.output_names, outputs, strict=True)))
        return outputs


QUANT_OPS = (b"QuantizeLinear", b"QLinearConv", b"QLinearMatMul", b"ConvInteger", b"MatMulInteger")


def is_quantized(path: Path) -> bool:
    """Whether the model holds int8 operators (QDQ or QOperator); op names are plain strings in the file."""
    overlap = max(len(op) for op in QUANT_OPS)
    tail = b""
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            data = tail + chunk
            if any(op in data for op in QUANT_OPS):
                return True
            tail = data[-overlap:]
    return False


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def select_providers(requested: list[str], available: list[str]) -> list[str]:
    """The config's ordered list intersected with what this runtime offers; CPU when nothing is left."""
    chosen = [p for p in requested if p in available]
    return chosen or [CPU]


def usable_cores() -> int:
    """CPU cores this process may run on (respects taskset/cgroup affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def thread_plan(cfg: ModelConfig, provider: str, cores: int) -> tuple[int, int]:
    """(concurrency, intra_op threads per run) for a model that may use `cores` CPU cores.

    On the CPU provider the default is frame-level parallelism: one run per core (at most 4), each
    single-threaded. For small edge models this beats one run spread over all cores (ONNX Runtime's
    intra-op threads synchronise per operator and spin while they wait, burning CPU a Pi needs for
    capture), and it keeps throughput up while the source thread decodes. `threads: N, concurrency: 1`
    gives the lowest single-frame latency instead. GPU providers run one frame at a time.
    With several pipelines, `cores` is this pipeline's share (`share_cores`), not the whole machine.
    """
    if provider != CPU:
        return cfg.concurrency or 1, cfg.threads
    if cfg.concurrency and cfg.threads:
        return cfg.concurrency, cfg.threads
    if cfg.threads:
        return max(1, cores // cfg.threads), cfg.threads
    concurrency = cfg.concurrency or max(1, min(cores, 4))
    return concurrency, max(1, cores // concurrency)


def share_cores(models: list[ModelConfig], on_cpu: list[bool], cores: int) -> list[int]:
    """The CPU cores each pipeline may use, so that several models do not oversubscribe the machine.

    The rule: a CPU pipeline that sets both `concurrency` and `threads` takes concurrency x threads cores
    (as configured; capped at the machine). The cores left are split evenly between the other CPU
    pipelines, at least one each, the first pipelines getting the remainder; `thread_plan` then plans each
    within its share. Pipelines on a GPU provider are not counted (their runs wait on the GPU) and get
    the whole machine as their figure. E.g. 4 cores, two auto CPU pipelines: 2 + 2, so each runs two
    single-threaded frames at once; three: 2 + 1 + 1.
    """
    shares = [cores] * len(models)
    auto = []
    reserved = 0
    for i, (cfg, cpu) in enumerate(zip(models, on_cpu, strict=True)):
        if not cpu:
            continue
        if cfg.concurrency and cfg.threads:
            shares[i] = min(cores, cfg.concurrency * cfg.threads)
            reserved += shares[i]
        else:
            auto.append(i)
    if reserved > cores:
        log.warning("CPU pipelines ask for %d cores in all; this machine has %d", reserved, cores)
    left = max(cores - reserved, 0)
    for rank, i in enumerate(auto):
        shares[i] = max(1, left // len(auto) + (1 if rank < left % len(auto) else 0))
    return shares


def provider_options(cfg: ModelConfig, provider: str, state_dir: Path, sha256: str) -> dict[str, Any]:
    """Options that matter on Jetson, then the config's `provider_options` on top.

    TensorRT's engine and timing cache go to the directory keyed by the model's sha256, the TensorRT
    version and the precision flags (`trtcache`), so an engine built for something else is never loaded.
    """
    opts: dict[str, Any] = {}
    if provider == TENSORRT:
        cache = trtcache.engine_dir(cfg, state_dir, sha256)
        opts = {
            "device_id": cfg.cuda_device_id,
            "trt_engine_cache_enable": True,
            "trt_engine_cache_path": str(cache),
            "trt_timing_cache_enable": True,
            "trt_timing_cache_path": str(cache),
            "trt_fp16_enable": cfg.trt_fp16,
            "trt_int8_enable": cfg.trt_int8,
        }
    elif provider == CUDA:
        opts = {"device_id": cfg.cuda_device_id}
    opts.update(cfg.provider_options.get(provider, {}))
    return opts


def load_problem(path: Path) -> str | None:
    """Why ONNX Runtime cannot load this model file (on CPU, no optimization: quick), or None when it can.
    `check-config` and `inspect` use it: an empty, truncated or too-new (opset) model is caught there."""
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001  (any failure is the answer to "does it load?")
        text = str(exc).strip().splitlines()
        return text[0] if text else type(exc).__name__
    return None


def _check_provider(cfg: ModelConfig, used: str, available: list[str]) -> None:
    """`require_provider`: refuse a session that did not get the first provider; else say it (a warning
    when the config named the providers, INFO for the default list on a machine without a GPU)."""
    want = cfg.providers[0]
    if used == want:
        return
    msg = f"model {cfg.path.name}: asked for {want} but the session runs on {used} (available: {available})"
    if cfg.require_provider:
        raise ProviderError(msg + "; require_provider is true, so edged will not start")
    if "providers" in cfg.model_fields_set:  # the config asked for it: worth a warning
        log.warning("%s; falling back", msg)
    else:  # the default list on a machine without a GPU (a Pi): what is expected, said once
        log.info("model %s: runs on %s (the default provider list; %s not offered here)", cfg.path.name, used, want)


def load_model(cfg: ModelConfig, state_dir: Path, *, cores: int | None = None) -> LoadedModel:
    """Build the session, read back the providers it really uses, and apply `require_provider`.

    `cores`: the CPU cores this model may use (default: every usable core).
    """
    path = cfg.path
    try:
        sha = file_sha256(path)
    except OSError as exc:
        raise ModelError(f"cannot read model {path}: {exc.strerror}; check model.path and permissions") from exc
    if cfg.sha256 is not None and sha != cfg.sha256.lower():
        raise ModelError(f"model {path} has sha256 {sha[:16]}..., but model.sha256 pins {cfg.sha256[:16]}...")
    available = ort.get_available_providers()
    chosen = select_providers(cfg.providers, available)
    missing = [p for p in cfg.providers if p not in available]
    if missing:
        log.info("model %s: providers not offered by this onnxruntime build: %s", path.name, ", ".join(missing))
    concurrency, threads = thread_plan(cfg, chosen[0], cores or usable_cores())
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = cfg.inter_op_threads
    if concurrency > 1 and threads > 1:
        # concurrent runs share the session's one intra-op pool: spinning workers would fight each other
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3
    for library in cfg.custom_ops:  # native code, loaded into this process (pipeline/lastgood.py guards it)
        opts.register_custom_ops_library(str(library))
    if TENSORRT in chosen:
        trtcache.prepare_dir(cfg, state_dir, sha)
    providers = [(p, provider_options(cfg, p, state_dir, sha)) for p in chosen]
    try:
        session = ort.InferenceSession(str(path), sess_options=opts, providers=providers)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(
            f"cannot load model {path}: {first}. The file is not a valid ONNX model (truncated copy, "
            "wrong file, or an opset this onnxruntime does not support); copy or export it again"
        ) from exc
    used = list(session.get_providers())
    _check_provider(cfg, used[0], available)
    output_names = [o.name for o in session.get_outputs()]
    feeds = Feeds(session.get_inputs(), output_names, cfg.inputs)
    inp = feeds.frame
    meta = session.get_modelmeta()
    metadata = dict(meta.custom_metadata_map)
    name = metadata.get("edged.name") or path.name.split(".")[0]
    if used[0] != chosen[0] or feeds.recurrent:
        concurrency = 1  # planned for another provider (be conservative), or a state carried run to run
    log.info(
        "model %s (sha256 %s) on %s, %d run(s) at once x %s thread(s)",
        name,
        sha[:12],
        ", ".join(used),
        concurrency,
        threads or "auto",
    )
    return LoadedModel(
        session=session,
        path=path,
        name=name,
        sha256=sha,
        providers=used,
        input_name=inp.name,
        input_shape=list(inp.shape),
        input_type=inp.type,
        output_names=output_names,
        metadata=metadata,
        int8=is_quantized(path),
        concurrency=concurrency,
        engine_dir=trtcache.engine_dir(cfg, state_dir, sha) if used[0] == TENSORRT else None,
        feeds=feeds if len(session.get_inputs()) > 1 else None,
    )


def warm_up(model: LoadedModel, tensor_shape: tuple[int, ...], runs: int) -> None:
    """Run the model on a blank input so the first real frame does not pay for lazy initialisation."""
    dtype = DTYPES.get(ORT_TYPES.get(model.input_type, "float32"), np.float32)
    blank = np.zeros(tensor_shape, dtype=dtype)
    try:
        for _ in range(runs):
            model.run(blank)
    except Exception as exc:
        raise ModelError(f"model {model.path.name} failed its warm-up run: {exc}") from exc
    if model.feeds is not None:
        model.feeds.reset()  # the first real window starts from the initial state, not the blanks
    if model.engine_dir is not None and runs:
        trtcache.seal(model.engine_dir)
