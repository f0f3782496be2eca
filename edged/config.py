"""The one configuration schema (pydantic, strict), YAML loading, and errors as `file:line key=value: msg`."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from edged import configfile
from edged.errors import ConfigError
from edged.sources.sensor import SensorSourceConfig
from edged.units import parse_duration, parse_size

DEFAULT_CONFIG_PATH = Path("/etc/edged/edged.yaml")
DEFAULT_PROVIDERS = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$"


class Strict(BaseModel):
    """Base for every config section: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class CameraSourceConfig(Strict):
    """OpenCV VideoCapture source: a device, a video file, a stream URL or a GStreamer pipeline."""

    type: Literal["camera"] = Field(description="Source type key.")
    uri: str | int = Field(
        description="Device index (0), /dev/videoN, a video file, rtsp:// or http:// URL, or a GStreamer "
        "pipeline ending in appsink."
    )
    fps: float = Field(
        0.0,
        ge=0,
        description="Target frames/s. 0 = as fast as the model goes (a file is then read at model pace, "
        "nothing dropped; a live source still delivers the latest frame).",
    )
    loop: bool = Field(False, description="Start a video file again at its end instead of reconnecting.")
    width: int | None = Field(None, gt=0, description="Resolution to request from a camera (width).")
    height: int | None = Field(None, gt=0, description="Resolution to request from a camera (height).")
    reconnect_min_s: float = Field(0.5, gt=0, description="First reconnect delay after a failure.")
    reconnect_max_s: float = Field(30.0, gt=0, description="Cap of the exponential reconnect delay.")
    stop_at_end: bool = Field(
        False,
        description="A video file that ends stops this pipeline instead of being reopened "
        "(used by `edged demo` and batch jobs).",
    )

    @model_validator(mode="after")
    def _backoff_order(self) -> CameraSourceConfig:
        if self.reconnect_max_s < self.reconnect_min_s:
            raise ValueError("reconnect_max_s must be >= reconnect_min_s")
        return self


class ModelConfig(Strict):
    """The ONNX model and how ONNX Runtime runs it."""

    path: Path = Field(description="The .onnx file (relative paths are relative to the config file).")
    providers: list[str] = Field(
        default_factory=lambda: list(DEFAULT_PROVIDERS),
        min_length=1,
        description="Execution providers in order of preference; intersected with what the runtime offers.",
    )
    require_provider: bool = Field(
        False, description="Fail at startup instead of warning when the first provider is not used."
    )
    threads: int = Field(
        0, ge=0, description="intra_op threads per model run; 0 = auto (see concurrency and the README)."
    )
    concurrency: int = Field(
        0,
        ge=0,
        le=16,
        description="Frames run through the model at once, by threads sharing the one session; 0 = auto: "
        "on the CPU provider one run per core (max 4) with one thread each, on a GPU provider 1.",
    )
    inter_op_threads: int = Field(0, ge=0, description="inter_op threads; 0 lets ONNX Runtime decide.")
    warmup_runs: int = Field(2, ge=0, description="Runs on a blank input before the pipeline is ready.")
    cuda_device_id: int = Field(0, ge=0, description="GPU index for CUDA and TensorRT.")
    trt_engine_cache_dir: Path | None = Field(None, description="TensorRT engine cache; default <state_dir>/trt-cache.")
    trt_fp16: bool = Field(True, description="Let TensorRT use fp16 kernels.")
    trt_int8: bool = Field(True, description="Let TensorRT use int8 kernels (QDQ models).")
    sha256: str | None = Field(
        None, pattern=r"^[0-9a-fA-F]{64}$", description="Pin: refuse a model file with another sha256."
    )
    provider_options: dict[str, dict[str, str | int | float | bool]] = Field(
        default_factory=dict, description="Extra options per provider, passed through as given."
    )

    @field_validator("path")
    @classmethod
    def _model_exists(cls, value: Path, info: ValidationInfo) -> Path:
        base = (info.context or {}).get("base_dir")
        path = value.expanduser()
        if not path.is_absolute() and base is not None:
            path = Path(base) / path
        if not path.exists():
            raise ValueError(f"model file not found: {path}; check model.path")
        if not path.is_file():
            raise ValueError(f"model path is not a file: {path}")
        return path

    @field_validator("providers")
    @classmethod
    def _known_providers(cls, value: list[str]) -> list[str]:
        known = _known_provider_names()
        for name in value:
            if name not in known:
                close = [k for k in known if k.lower().startswith(name.lower()[:4])]
                hint = f" (did you mean {close[0]}?)" if close else ""
                raise ValueError(f"unknown execution provider {name!r}{hint}; known: {', '.join(sorted(known))}")
        return value


class PreprocessConfig(Strict):
    """How a frame becomes the model's input tensor. Omitted keys come from the model's metadata."""

    size: tuple[int, int] | None = Field(None, description="[width, height] of the model input.")
    resize: Literal["stretch", "letterbox"] | None = Field(None, description="How to fit the frame.")
    interpolation: Literal["nearest", "linear", "area", "cubic"] | None = Field(
        None, description="Resampling used to resize (default linear, OpenCV's default)."
    )
    color: Literal["rgb", "bgr", "gray"] | None = Field(None, description="Channel order fed to the model.")
    layout: Literal["nchw", "nhwc"] | None = Field(None, description="Tensor layout.")
    dtype: Literal["float32", "float16", "uint8", "int8"] | None = Field(None, description="Tensor dtype.")
    scale: float | None = Field(None, description="Multiply pixel values (0..255) by this first.")
    mean: list[float] | None = Field(None, description="Subtract per channel after scaling.")
    std: list[float] | None = Field(None, description="Divide per channel after subtracting the mean.")
    pad_value: int | None = Field(None, ge=0, le=255, description="Letterbox border colour (grey level).")


class ClassifyConfig(Strict):
    """Classification: softmax if the model gives logits, top-k with labels."""

    type: Literal["classify"]
    top_k: int = Field(3, ge=1, le=1000, description="How many classes to report.")
    labels: Path | None = Field(None, description="Text file, one label per line; default: model metadata.")
    softmax: Literal["auto", "always", "never"] = Field(
        "auto", description="auto: apply softmax unless the outputs already sum to 1."
    )


class RawConfig(Strict):
    """Raw outputs: shape, dtype and summary per output; values included up to a cap."""

    type: Literal["raw"]
    max_values: int = Field(64, ge=0, description="Include at most this many values per output.")


class DetectConfig(Strict):
    """Object detection: YOLO-style heads or models that output boxes themselves; see edged/inference/detect.py."""

    type: Literal["detect"]
    format: Literal["auto", "yolov5", "yolov8", "boxes"] = Field(
        "auto",
        description="Head family. yolov5: [1, N, 5+nc] with objectness; yolov8 (also YOLO11): [1, 4+nc, N] "
        "or transposed, no objectness; boxes: NMS inside the graph, one [1, N, 6] output (x1, y1, x2, y2, "
        "score, class) or separate boxes / scores / classes outputs. auto: from the output shapes and labels.",
    )
    score_threshold: float = Field(0.25, ge=0, le=1, description="Detections scoring less are dropped.")
    iou_threshold: float = Field(0.45, gt=0, le=1, description="NMS: overlap above which the weaker box goes.")
    max_detections: int = Field(100, ge=1, le=10000, description="Keep at most this many, best first.")
    class_agnostic: bool = Field(False, description="NMS across classes (default: per class).")
    classes: list[str | int] | None = Field(
        None, description="Report only these classes (labels or indices); default every class."
    )
    labels: Path | None = Field(None, description="Text file, one label per line; default: model metadata.")
    normalized: Literal["auto", "yes", "no"] = Field(
        "auto", description="Box coordinates in 0..1 of the model input (auto: when every coordinate is <= 1.5)."
    )


PostprocessConfig = Annotated[ClassifyConfig | RawConfig | DetectConfig, Field(discriminator="type")]


class PublishConfig(Strict):
    """Which results leave the device. Every frame is still run and counted in the status."""

    mode: Literal["every", "on_change", "interval"] = Field(
        "every",
        description="every: each result; on_change: when the set of labels or a per-label count changes "
        "(a classifier: its top-1 label); interval: at most one result every interval_s.",
    )
    interval_s: float = Field(
        0.0,
        ge=0,
        description="interval: the minimum spacing; on_change: also publish an unchanged result this often "
        "(a heartbeat; 0 = never).",
    )

    @model_validator(mode="after")
    def _interval_needs_seconds(self) -> PublishConfig:
        if self.mode == "interval" and self.interval_s <= 0:
            raise ValueError("publish.mode interval needs interval_s > 0")
        return self


class SnapshotConfig(Strict):
    """A JPEG written under <state_dir>/snapshots/<pipeline>/ when an event is published; never sent over MQTT."""

    enabled: bool = Field(False, description="Write snapshots.")
    on: Literal["detection", "change"] = Field(
        "detection",
        description="detection: a published result with at least one detection; change: a published result "
        "whose labels or counts differ from the previous frame's.",
    )
    max_files: int = Field(100, ge=1, le=100000, description="Keep at most this many per pipeline; oldest removed.")
    jpeg_quality: int = Field(85, ge=1, le=100, description="JPEG quality.")
    crop: bool = Field(False, description="Write the best detection's box instead of the whole frame.")


# each source type's config model lives with its source (the camera's stays here); `type` picks it
SourceConfig = Annotated[CameraSourceConfig | SensorSourceConfig, Field(discriminator="type")]


class PipelineConfig(Strict):
    """One source -> one model -> results on one topic."""

    name: str = Field(pattern=NAME_PATTERN, description="Pipeline name; part of the topic and `seq` key.")
    source: SourceConfig
    model: ModelConfig
    preprocess: PreprocessConfig = Field(default_factory=PreprocessConfig)
    postprocess: PostprocessConfig = Field(default_factory=lambda: ClassifyConfig(type="classify"))
    publish: PublishConfig = Field(default_factory=PublishConfig)
    snapshot: SnapshotConfig = Field(default_factory=SnapshotConfig)

    @model_validator(mode="after")
    def _preprocess_is_for_images(self) -> PipelineConfig:
        if isinstance(self.source, SensorSourceConfig) and self.preprocess.model_fields_set:
            raise ValueError(
                "preprocess applies to images; a sensor source shapes its windows with source.window, hop, "
                "channels, layout, normalize, mean and std"
            )
        return self


Size = Annotated[int, BeforeValidator(parse_size), Field(ge=0)]
Duration = Annotated[float, BeforeValidator(parse_duration), Field(gt=0)]


class TlsConfig(Strict):
    """TLS to the broker. Certificates are checked, host name included, unless `insecure` says otherwise."""

    ca_file: Path | None = Field(None, description="CA bundle that signed the broker's certificate.")
    cert_file: Path | None = Field(None, description="Client certificate (mutual TLS).")
    key_file: Path | None = Field(None, description="Client key; must not be readable by others.")
    insecure: bool = Field(False, description="Skip the host-name check (a warning is logged). Testing only.")

    @model_validator(mode="after")
    def _pair(self) -> TlsConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together (mutual TLS needs both)")
        return self


NAME_MAX = 64  # NAME_PATTERN's longest device_id / pipeline name
TOPIC_MAX_BYTES = 65_535  # MQTT: a topic name is a UTF-8 string with a 16-bit length


def check_topic_template(template: str) -> str:
    """A topic edged can publish to whatever the names: MQTT forbids wildcards, NUL and more than 65,535
    bytes in a topic name; `$...` topics are the broker's own (Mosquitto refuses publishes to them)."""
    longest = template.replace("{device_id}", "x" * NAME_MAX).replace("{pipeline}", "x" * NAME_MAX)
    if not template:
        raise ValueError("a topic cannot be empty")
    if "+" in template or "#" in template:
        raise ValueError("a topic to publish to cannot hold the wildcards + or #")
    if template.startswith("$"):
        raise ValueError("topics starting with $ belong to the broker ($SYS/...); brokers refuse publishes there")
    if "\x00" in template:
        raise ValueError("a topic cannot hold the NUL character")
    try:
        size = len(longest.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ValueError("a topic must be valid UTF-8 text") from exc
    if size > TOPIC_MAX_BYTES:
        raise ValueError(f"{size} bytes with the longest names ({NAME_MAX} characters); MQTT allows {TOPIC_MAX_BYTES}")
    return template


class MqttConfig(Strict):
    """The broker results are published to."""

    enabled: bool = Field(True, description="false: only spool (results wait on disk).")
    host: str = Field("localhost", description="Broker host name or address.")
    port: int = Field(1883, ge=1, le=65535)
    protocol: Literal["3.1.1", "5"] = Field("5", description="MQTT protocol version.")

    @field_validator("protocol", mode="before")
    @classmethod
    def _protocol_as_text(cls, value: object) -> object:
        return str(value) if isinstance(value, int | float) else value  # `protocol: 5` in YAML is a number

    qos: Literal[0, 1] = Field(1, description="1 = at-least-once: rows leave the spool on PUBACK only.")
    client_id: str | None = Field(None, description="Default edged-<device_id>.")
    keepalive_s: int = Field(30, ge=5, le=3600)
    topic: str = Field("edged/{device_id}/{pipeline}/results", description="Result topic template.")
    availability_topic: str = Field("edged/{device_id}/status", description="Retained online/offline.")
    max_inflight: int = Field(32, ge=1, le=1000, description="Unacknowledged messages at most.")
    reconnect_min_s: float = Field(0.5, gt=0)
    reconnect_max_s: float = Field(30.0, gt=0)
    shutdown_grace_s: float = Field(3.0, ge=0, description="On stop, publish what can go within this.")
    tls: TlsConfig | None = Field(None, description="Connect with TLS (port 8883 usually).")
    username: str | None = Field(None, description="MQTT user name.")
    password_file: Path | None = Field(None, description="File holding the password; must not be readable by others.")
    password_credential: str | None = Field(
        None, description="Name of a systemd credential (LoadCredential=) holding the password."
    )
    dead_letter_after: int = Field(5, ge=1, description="A result the broker refuses this many times is set aside.")
    batch: int = Field(1, ge=1, le=1000, description="Results per message (>1: a JSON array) for slow links.")
    max_rate: float = Field(0.0, ge=0, description="Messages/s at most while draining a backlog; 0 = no limit.")
    stats_interval_s: float = Field(60.0, ge=0, description="Stats message every this many seconds; 0 = off.")
    stats_topic: str = Field("edged/{device_id}/stats", description="Stats message topic template.")
    stats_retain: bool = Field(True, description="Retain the stats message.")
    message_expiry: bool = Field(True, description="MQTT 5: messages expire when their spool TTL would.")

    @field_validator("topic", "availability_topic", "stats_topic")
    @classmethod
    def _publishable_topic(cls, value: str) -> str:
        return check_topic_template(value)

    @model_validator(mode="after")
    def _backoff_order(self) -> MqttConfig:
        if self.reconnect_max_s < self.reconnect_min_s:
            raise ValueError("reconnect_max_s must be >= reconnect_min_s")
        return self

    @model_validator(mode="after")
    def _one_password(self) -> MqttConfig:
        if self.password_file is not None and self.password_credential is not None:
            raise ValueError("give password_file or password_credential, not both")
        if (self.password_file or self.password_credential) and not self.username:
            raise ValueError("a password needs a username")
        return self


class SpoolConfig(Strict):
    """The durable queue (SQLite, WAL) under state_dir."""

    sync: Literal["normal", "full"] = Field(
        "normal", description="normal: survives a crash; full: fsync per commit, survives a power cut."
    )
    batch_max: int = Field(
        128, ge=1, le=10000, description="Commit once this many unacknowledged results wait in memory ..."
    )
    batch_ms: int = Field(
        1000,
        ge=0,
        le=60000,
        description="... or once the oldest has waited this many milliseconds, first wins. A result the broker "
        "acknowledged before then is never written; kill -9 loses at most this window of unacknowledged results.",
    )
    max_bytes: Size = Field(256 * 2**20, description="Stored payload bytes at most (never more than the disk holds).")
    max_age: Duration = Field(7 * 86400.0, description="TTL, e.g. 7d: older results are dropped (counted).")
    on_full: Literal["drop_oldest", "drop_newest"] = Field("drop_oldest", description="What gives way when full.")
    min_free_bytes: Size = Field(64 * 2**20, description="Free space the spool leaves on the filesystem.")
    ballast_bytes: Size = Field(16 * 2**20, description="Ballast released on a full disk so SQLite can evict.")


class StatusConfig(Strict):
    """The status socket that `edged status` reads."""

    socket: Path | None = Field(None, description="Unix socket; default <state_dir>/status.sock.")
    mode: int = Field(0o660, description='Socket file mode, octal ("0660"); never world-writable.')

    @field_validator("mode", mode="before")
    @classmethod
    def _octal(cls, value: object) -> object:
        if isinstance(value, str):
            try:
                return int(value.removeprefix("0o"), 8)
            except ValueError as exc:
                raise ValueError(f"mode must be an octal number like 0660, got {value!r}") from exc
        return value

    @field_validator("mode")
    @classmethod
    def _not_world_writable(cls, value: int) -> int:
        if value & 0o002:
            raise ValueError("status socket must not be world-writable (drop the o+w bit)")
        return value


class Config(Strict):
    """The whole daemon configuration."""

    device_id: str = Field(default_factory=socket.gethostname, pattern=NAME_PATTERN)
    state_dir: Path = Field(Path("/var/lib/edged"), description="Spool database and sequence numbers.")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    watchdog_stall_s: float = Field(
        60.0, gt=0, description="A pipeline without progress this long stops the systemd watchdog pings."
    )
    status: StatusConfig = Field(default_factory=StatusConfig)
    mqtt: MqttConfig = Field(default_factory=MqttConfig)
    spool: SpoolConfig = Field(default_factory=SpoolConfig)
    pipelines: list[PipelineConfig] = Field(min_length=1)

    @field_validator("state_dir")
    @classmethod
    def _state_dir_relative(cls, value: Path, info: ValidationInfo) -> Path:
        base = (info.context or {}).get("base_dir")
        value = value.expanduser()
        if not value.is_absolute() and base is not None:
            return Path(base) / value
        return value

    @field_validator("pipelines")
    @classmethod
    def _unique_names(cls, value: list[PipelineConfig]) -> list[PipelineConfig]:
        seen: set[str] = set()
        for p in value:
            if p.name in seen:
                raise ValueError(f"pipeline name {p.name!r} is used twice; names must be unique")
            seen.add(p.name)
        return value

    @property
    def status_socket(self) -> Path:
        """Where the status socket lives."""
        return self.status.socket or self.state_dir / "status.sock"


def _known_provider_names() -> set[str]:
    import onnxruntime as ort  # noqa: PLC0415  (heavy; only when a config is validated)

    return set(ort.get_all_providers())


def default_config_path() -> Path:
    """`$EDGED_CONFIG` or /etc/edged/edged.yaml."""
    env = os.environ.get("EDGED_CONFIG")
    return Path(env) if env else DEFAULT_CONFIG_PATH


def load_config(path: Path) -> Config:
    """Read and validate a YAML config file; raise ConfigError listing every problem (bounded: see
    edged/configfile.py)."""
    return parse_config(configfile.read_text(path), source=str(path), base_dir=path.parent)


def parse_config(text: str, source: str = "<config>", base_dir: Path | None = None) -> Config:
    """Validate YAML text; errors are `source:line key=value: message`."""
    data, node = configfile.load(text, source)
    if not isinstance(data, dict):
        raise ConfigError([f"{source}:1 config: the file must be a YAML mapping of keys, got {type(data).__name__}"])
    lines: dict[tuple[str | int, ...], int] = {}
    if node is not None:
        _collect_lines(node, (), lines)
    try:
        return Config.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as exc:
        problems = [_format_error(err, data, lines, source) for err in exc.errors()]
        raise ConfigError(problems) from exc


def key_line(path: Path, keys: tuple[str | int, ...]) -> int:
    """The line of a key in a config file that already loaded (for problems found after validation)."""
    try:
        _, node = configfile.load(configfile.read_text(path), str(path))
    except ConfigError:
        return 1
    lines: dict[tuple[str | int, ...], int] = {}
    if node is not None:
        _collect_lines(node, (), lines)
    return _line_for(keys, lines)


def config_from_dict(data: dict[str, Any], source: str = "<built-in config>") -> Config:
    """Validate a config built in code (the demo); errors in the same format, without line numbers."""
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError([_format_error(err, data, {}, source) for err in exc.errors()]) from exc


def _collect_lines(node: yaml.Node, path: tuple[str | int, ...], out: dict[tuple[str | int, ...], int]) -> None:
    out[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            child = (*path, key_node.value)
            _collect_lines(value_node, child, out)
            out[child] = key_node.start_mark.line + 1  # a key's problem is reported on the key's line
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _collect_lines(item, (*path, i), out)


def _format_error(err: Any, data: dict[str, Any], lines: dict[tuple[str | int, ...], int], source: str) -> str:
    loc: tuple[str | int, ...] = tuple(err["loc"])
    path: list[str | int] = []
    current: Any = data
    resolved = True
    for elem in loc:
        if (isinstance(current, dict) and elem in current) or (
            isinstance(current, list) and isinstance(elem, int) and 0 <= elem < len(current)
        ):
            current = current[elem]  # type: ignore[index]
            path.append(elem)
        elif isinstance(current, dict) and isinstance(elem, str) and current.get("type") == elem:
            continue  # a discriminated-union tag, not a key in the file
        else:
            resolved = False
            path.append(elem)
            break
    line = _line_for(tuple(path), lines)
    key = _dotted(path) or "config"
    value = _show(current) if resolved else "<missing>"
    message = _message(err)
    return f"{source}:{line} {key}={value}: {message}"


def _line_for(path: tuple[str | int, ...], lines: dict[tuple[str | int, ...], int]) -> int:
    for end in range(len(path), -1, -1):
        if path[:end] in lines:
            return lines[path[:end]]
    return 1


def _dotted(path: Iterable[str | int]) -> str:
    out = ""
    for elem in path:
        out += f"[{elem}]" if isinstance(elem, int) else (f".{elem}" if out else str(elem))
    return out


def _show(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= 80 else text[:77] + "..."


def _message(err: Any) -> str:
    kind = err["type"]
    msg = str(err["msg"])
    if kind == "extra_forbidden":
        return "unknown key; check the spelling against the config reference in README.md"
    if kind == "missing":
        return "required key is missing"
    if kind == "union_tag_invalid":
        return f"unknown type; expected one of: {err.get('ctx', {}).get('expected_tags', '')}"
    if kind == "literal_error":
        return f"must be one of {err.get('ctx', {}).get('expected', '')}"
    return msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
