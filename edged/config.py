"""The one configuration schema, put together from the stages' own sections, YAML loading, and errors
as `file:line key=value: msg`.

Each stage owns its section (and its defaults): `pipelines[]` is edged/pipeline/settings.py (which
takes the source, model, postprocess and publish sections from their stages), `spool` is
edged/store/settings.py, `mqtt` edged/uplink/settings.py. What is left here is the daemon's own keys and
the `status` socket section."""

from __future__ import annotations

import contextlib
import functools
import json
import re
import socket
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from edged.capture.base import SOURCES
from edged.control.settings import ControlConfig
from edged.core import configfile
from edged.core.clock import ClockConfig
from edged.core.errors import ConfigError
from edged.core.settings import NAME_PATTERN, Strict, from_config_dir
from edged.model.postprocess import POSTPROCESSORS
from edged.pipeline.resultfilter import PUBLISH_FILTERS
from edged.pipeline.settings import PipelineConfig
from edged.store.settings import SpoolConfig
from edged.uplink.homeassistant import HomeAssistantConfig
from edged.uplink.settings import MqttConfig


class StatusConfig(Strict):
    """The status socket that `edged status` reads."""

    socket: Path | None = Field(None, description="Unix socket; default <state_dir>/status.sock.")
    mode: int = Field(
        0o660,
        description='Socket file mode, octal ("0660"); never world-writable.',
        json_schema_extra={"default_text": "`0660`"},
    )

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


class MetricsConfig(Strict):
    """Prometheus metrics (docs/home-assistant-and-metrics.md). Neither key set: off."""

    listen: str | None = Field(
        None,
        description='Serve /metrics on host:port, e.g. "127.0.0.1:9108"; an address beyond loopback only when '
        "you name one.",
    )
    textfile: Path | None = Field(
        None, description="Also write them to this .prom file for node_exporter's textfile collector."
    )
    textfile_interval_s: float = Field(15.0, gt=0, description="How often the textfile is written.")

    @field_validator("listen")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        if value is not None:
            host, sep, port = value.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"expected host:port, like 127.0.0.1:9108, got {value!r}")
        return value


class Config(Strict):
    """The whole daemon configuration."""

    device_id: str = Field(
        default_factory=socket.gethostname,
        pattern=NAME_PATTERN,
        description="This device's name in topics and messages ([A-Za-z0-9_.-], at most 64).",
        json_schema_extra={"default_text": "host name"},
    )
    state_dir: Path = Field(
        Path("/var/lib/edged"),
        description="Spool database (spool.db), sequence-number leases, TensorRT cache, snapshots.",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Logs go to stderr (journald adds the time)."
    )
    watchdog_stall_s: float = Field(
        60.0, gt=0, description="A pipeline without progress this long stops the systemd watchdog pings."
    )
    status: StatusConfig = Field(default_factory=StatusConfig)
    mqtt: MqttConfig = Field(default_factory=MqttConfig)
    spool: SpoolConfig = Field(default_factory=SpoolConfig)
    clock: ClockConfig = Field(default_factory=ClockConfig)
    control: ControlConfig | None = Field(
        None, description="Remote control over MQTT with signed commands (docs/fleet.md). Absent: off."
    )
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    homeassistant: HomeAssistantConfig = Field(default_factory=HomeAssistantConfig)
    pipelines: list[PipelineConfig] = Field(min_length=1, description="At least one; names unique.")

    @field_validator("state_dir")
    @classmethod
    def _state_dir_relative(cls, value: Path, info: ValidationInfo) -> Path:
        return from_config_dir(value, (info.context or {}).get("base_dir"))

    @field_validator("pipelines")
    @classmethod
    def _unique_names(cls, value: list[PipelineConfig]) -> list[PipelineConfig]:
        seen: set[str] = set()
        for p in value:
            if p.name in seen:
                raise ValueError(f"pipeline name {p.name!r} is used twice; names must be unique")
            seen.add(p.name)
        return value

    @model_validator(mode="after")
    def _control_needs_mqtt(self) -> Config:
        if self.control is not None and not self.mqtt.enabled:
            raise ValueError("control needs mqtt (commands arrive through the broker); enable mqtt or drop control")
        return self

    @property
    def status_socket(self) -> Path:
        """Where the status socket lives."""
        return self.status.socket or self.state_dir / "status.sock"


def find_status_socket(path: Path) -> tuple[Path, str | None]:
    """(the status socket that the config file at `path` names, a note when the file does not load).

    `edged status` must find the daemon whatever state the file is in: an operator who has just broken it
    most needs to know whether the daemon still runs. So a file that fails validation (a typo, a model
    file not there yet) still gives its `state_dir` and `status.socket` where those two keys are sound, and
    the defaults where they are not; the note says that the file has problems and where to see them."""
    if not path.exists():  # no config at all (the demo, a device set up elsewhere): the default socket
        state_dir = Config.model_fields["state_dir"].default
        return state_dir / "status.sock", f"note: no config at {path}; asking the default socket"
    try:
        return load_config(path).status_socket, None
    except ConfigError as exc:
        problems = exc.problems
    data: Any = None
    text = ""
    with contextlib.suppress(ConfigError):
        text = configfile.read_text(path)
        data, _ = configfile.load(text, str(path))
    data = data if isinstance(data, dict) else scan_paths(text)  # a YAML error mid-edit: the two keys by their lines
    socket_path: Path | None = None
    with contextlib.suppress(ValidationError):
        socket_path = StatusConfig.model_validate(data.get("status") or {}).socket
    if socket_path is None:
        state_dir = Config.model_fields["state_dir"].default
        with contextlib.suppress(TypeError):
            state_dir = from_config_dir(Path(data.get("state_dir", state_dir)), path.parent)
        socket_path = state_dir / "status.sock"
    more = f" (and {len(problems) - 1} more: edged check-config {path})" if len(problems) > 1 else ""
    note = f"note: the config does not load (a reload keeps the running one): {problems[0]}{more}"
    return socket_path, note


_STATE_DIR_LINE = re.compile(r"^state_dir:[ \t]*(?P<v>[^#\n]*?)[ \t]*(?:#.*)?$", re.MULTILINE)
_SOCKET_INLINE = re.compile(r"^status:[ \t]*\{[^}\n]*?\bsocket:[ \t]*(?P<v>[^,}\n]+?)[ \t]*[,}]", re.MULTILINE)
_SOCKET_BLOCK = re.compile(r"^status:[ \t]*(?:#.*)?\n(?:[ \t]+.*\n)*?[ \t]+socket:[ \t]*(?P<v>[^#\n]*?)[ \t]*(?:#.*)?$",
                           re.MULTILINE)  # fmt: skip


def scan_paths(text: str) -> dict[str, Any]:
    """`state_dir` and `status.socket` read off the lines of a file that is not valid YAML (someone is editing
    it), so that `edged status --config` still finds the daemon; {} where they are not to be found."""
    found: dict[str, Any] = {}
    if (m := _STATE_DIR_LINE.search(text)) and m.group("v"):
        found["state_dir"] = m.group("v").strip("'\"")
    socket = _SOCKET_INLINE.search(text) or _SOCKET_BLOCK.search(text)
    if socket and socket.group("v"):
        found["status"] = {"socket": socket.group("v").strip("'\"")}
    return found


def load_config(path: Path) -> Config:
    """Read and validate a YAML config file; raise ConfigError listing every problem (bounded: see
    edged/core/configfile.py)."""
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


class ConfigLocator:
    """Lines and values of keys in a config file that already loaded, for problems found after the schema
    (the model checks of check-config); the file is read once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: Any = None
        self.lines: dict[tuple[str | int, ...], int] = {}
        try:
            self.data, node = configfile.load(configfile.read_text(path), str(path))
        except ConfigError:
            return
        if node is not None:
            _collect_lines(node, (), self.lines)

    def problem(self, keys: tuple[str | int, ...], message: str) -> str:
        """`file:line key=value: message` for the key at `keys`."""
        value: Any = self.data
        for key in keys:
            value = _child(value, key)
        shown = _show(value) if value is not None else "<missing>"
        return f"{self.path}:{_line_for(keys, self.lines)} {_dotted(keys)}={shown}: {message}"


def config_from_dict(data: dict[str, Any], source: str = "<built-in config>") -> Config:
    """Validate a config built in code (the demo); errors in the same format, without line numbers."""
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError([_format_error(err, data, {}, source) for err in exc.errors()]) from exc


def _child(value: Any, key: str | int) -> Any:
    if isinstance(value, dict):
        return value.get(key)
    if isinstance(value, list) and isinstance(key, int) and 0 <= key < len(value):
        return value[key]
    return None


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
        elif isinstance(current, dict) and isinstance(elem, str) and elem in _union_tags():
            continue  # a tagged union's member (a source type, a publish mode), not a key in the file
        else:
            resolved = False
            path.append(elem)
            break
    line = _line_for(tuple(path), lines)
    key = _dotted(path) or "config"
    value = _show(current) if resolved else "<missing>"
    if err["type"] == "extra_forbidden":  # a password pasted under the wrong name must not reach logs or replies
        value = "<not shown>"
    message = _message(err)
    return f"{source}:{line} {key}={value}: {message}"


@functools.cache
def _union_tags() -> frozenset[str]:
    """Every registered type key / mode: pydantic puts the union member in an error's location."""
    return frozenset(SOURCES.keys() | POSTPROCESSORS.keys() | PUBLISH_FILTERS.keys())


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


SHOW_MAX = 240  # a value in an error line at most: a whole path of any sensible depth, never a pasted blob


def _show(value: Any) -> str:
    """A value for an error line, bounded: a longer one keeps its head and its tail (a path's file name)."""
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    if len(text) <= SHOW_MAX:
        return text
    half = (SHOW_MAX - 3) // 2
    return text[:half] + "..." + text[-half:]


def _message(err: Any) -> str:
    kind = err["type"]
    msg = str(err["msg"])
    if kind == "extra_forbidden":
        return "unknown key; check the spelling against the config reference in docs/configuration.md"
    if kind == "missing":
        return "required key is missing"
    if kind == "union_tag_invalid":
        return f"unknown type; expected one of: {err.get('ctx', {}).get('expected_tags', '')}"
    if kind == "literal_error":
        return f"must be one of {err.get('ctx', {}).get('expected', '')}"
    return msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
