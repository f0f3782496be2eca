"""`sensor` source: samples from a serial port, named pipe, tailed file, helper command or UDP, in windows.

A "frame" is a window of samples: `window` samples of the selected `channels`, one every `hop` samples.
The pipeline hands the source its Preparer (edged/model/window.py's transform, swapped with the model):
the source reads the resolved channels, window and hop from it, builds the model input in its own thread
and hands `Frame(image=<window (window, channels)>, tensor=<model input>)` to the model through the
latest-frame slot, like a camera does.

States in status: "waiting" (no samples yet, or none for `stall_s`: "waiting for data"), "running",
"reconnecting" (the transport failed or ended; reopened with capped exponential backoff).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from edged.capture.base import SOURCES, Frame, FrameSlot, Preparer, Source
from edged.capture.sensor_io import (
    CommandTransport,
    TailTransport,
    Transport,
    UdpTransport,
    open_fifo,
    open_serial,
    parse_address,
)
from edged.capture.sensor_parse import (
    TIME_UNITS,
    BinaryParser,
    Channel,
    CsvParser,
    JsonParser,
    Parser,
    SampleClock,
    Windower,
)
from edged.core.backoff import Backoff
from edged.core.clock import boottime
from edged.core.errors import SourceError
from edged.core.settings import Strict, check_order, from_config_dir
from edged.core.stats import PipelineStats

log = logging.getLogger(__name__)

POLL_S = 0.2  # longest a read blocks: the stop flag is seen within this
# windows cut from one read (a burst: a FIFO's backlog at the start, a serial buffer after a pause) are handed
# over one by one, each waiting for the model to take the one before, for this long in all; then the latest
# wins as for a camera. Short, so the transport's own buffer never overflows meanwhile (a serial port's 4 KiB
# holds 350 ms at 115,200 baud).
BURST_WAIT_S = 0.25
MALFORMED_LOG_EVERY_S = 10.0
BAUD_RATES = (1200, 2400, 4800, 9600, 19200, 38400, 57600, 115200, 230400, 460800, 500000, 576000, 921600,
              1000000, 1500000, 2000000, 3000000, 4000000)  # fmt: skip
TRANSPORT_KEYS = {  # keys that only mean something for one transport or format
    "path": ("serial", "fifo", "file"),
    "baud": ("serial",),
    "raw": ("serial",),
    "from_start": ("file",),
    "command": ("command",),
    "address": ("udp",),
}
FORMAT_KEYS = {"delimiter": "csv", "columns": "csv", "dtype": "binary", "endian": "binary", "record_values": "binary"}
Transports = Literal["serial", "fifo", "file", "command", "udp"]


@dataclass(frozen=True)
class Windowing:
    """How the samples are cut: which channels, samples per window, samples between window starts."""

    channels: tuple[Channel, ...]
    window: int
    hop: int


class SensorSourceConfig(Strict):
    """Samples from a sensor, cut into windows. Keys not given for windowing come from the model."""

    type: Literal["sensor"] = Field(description="Source type key.")
    transport: Transports = Field(
        description="serial (a tty/character device), fifo (a named pipe, created when missing), file (a file "
        "being appended to), command (stdout of a helper command edged runs), udp (datagrams on address)."
    )
    path: Path | None = Field(None, description="serial/fifo/file: the device, pipe or file (relative: to the config).")
    baud: int = Field(115200, description="serial: line speed, set with termios.")
    raw: bool = Field(True, description="serial: raw mode (8N1, no echo, no line editing or CR/LF translation).")
    from_start: bool = Field(False, description="file: read what is already in the file first (default: only new).")
    command: list[str] | None = Field(
        None, min_length=1, description="command: program and arguments (no shell); restarted with backoff."
    )
    address: str | None = Field(None, description="udp: host:port to bind, e.g. 127.0.0.1:9000 or 0.0.0.0:9000.")
    format: Literal["csv", "json", "binary"] = Field(
        description="csv: delimited lines; json: one object per line; binary: fixed-size records."
    )
    delimiter: str = Field(",", min_length=1, max_length=1, description="csv: the column separator.")
    columns: list[str] | None = Field(
        None, description="csv: column names; default: from a header line (a line with no number in it)."
    )
    dtype: Literal["int8", "uint8", "int16", "uint16", "int32", "uint32", "float32", "float64"] | None = Field(
        None, description="binary: type of every value in a record."
    )
    endian: Literal["little", "big"] = Field("little", description="binary: byte order.")
    record_values: int | None = Field(
        None, gt=0, description="binary: values per record; default: the highest channel/time index + 1."
    )
    channels: list[str | int] | None = Field(
        None,
        min_length=1,
        description="Channels in model order: csv column names or 0-based indices, json keys (dotted for "
        "nested), binary value indices. Default: the model's edged.window channels.",
    )
    time_field: str | int | None = Field(
        None, description="Column/key/index holding the sample clock; without one, samples get their arrival time."
    )
    time_unit: Literal["s", "ms", "us", "ns"] = Field("s", description="Unit of the time field.")
    time_epoch: bool = Field(
        True, description="true: the time field is Unix time; false: a device clock, anchored to arrival time."
    )
    window: int | None = Field(None, gt=0, description="Samples per window; default: model metadata or input shape.")
    hop: int | None = Field(None, gt=0, description="Samples between window starts; default: the window (no overlap).")
    layout: Literal["channels_first", "channels_last"] | None = Field(
        None, description="channels_first: model input [1, channels, window]; channels_last: [1, window, channels]."
    )
    normalize: Literal["none", "fixed", "window"] | None = Field(
        None, description="none; fixed: (x - mean) / std per channel; window: z-score per channel of each window."
    )
    mean: list[float] | None = Field(None, min_length=1, description="normalize fixed: one value or one per channel.")
    std: list[float] | None = Field(None, min_length=1, description="normalize fixed: one value or one per channel.")
    stall_s: float = Field(5.0, gt=0, description='No samples for this long: the pipeline shows "waiting".')
    reconnect_min_s: float = Field(0.5, gt=0, description="First reopen delay after the transport failed.")
    reconnect_max_s: float = Field(30.0, gt=0, description="Cap of the exponential reopen delay.")

    @field_validator("path")
    @classmethod
    def _relative_to_config(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        return None if value is None else from_config_dir(value, (info.context or {}).get("base_dir"))

    @field_validator("baud")
    @classmethod
    def _standard_baud(cls, value: int) -> int:
        if value not in BAUD_RATES:
            raise ValueError(f"baud must be a standard rate: {', '.join(map(str, BAUD_RATES))}")
        return value

    @field_validator("address")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        if value is not None:
            parse_address(value)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> SensorSourceConfig:
        t, given = self.transport, self.model_fields_set
        needed = {"serial": "path", "fifo": "path", "file": "path", "command": "command", "udp": "address"}[t]
        if getattr(self, needed) is None:
            raise ValueError(f"transport {t} needs {needed}")
        for key, transports in TRANSPORT_KEYS.items():
            if key in given and t not in transports:
                raise ValueError(f"{key} applies to transport {' / '.join(transports)}, not {t}")
        for key, fmt in FORMAT_KEYS.items():
            if key in given and self.format != fmt:
                raise ValueError(f"{key} applies to format {fmt}, not {self.format}")
        self._check_format()
        check_order(self, "reconnect_min_s", "reconnect_max_s")
        return self

    def _check_format(self) -> None:
        refs = [*(self.channels or []), *([self.time_field] if self.time_field is not None else [])]
        if self.format == "binary":
            if self.dtype is None:
                raise ValueError("format binary needs dtype")
            if self.channels is None or not all(isinstance(r, int) and r >= 0 for r in refs):
                raise ValueError("format binary needs channels (and time_field) as value indices (0, 1, ...)")
            if self.record_values is not None and max(int(r) for r in refs) >= self.record_values:
                raise ValueError(f"a channel index is >= record_values ({self.record_values})")
        elif self.format == "json" and not all(isinstance(r, str) for r in refs):
            raise ValueError("format json needs channels (and time_field) as key names")
        elif self.format == "csv":
            if any(isinstance(r, int) and r < 0 for r in refs):
                raise ValueError("csv column indices start at 0")
            missing = [r for r in refs if isinstance(r, str) and self.columns is not None and r not in self.columns]
            if missing:
                raise ValueError(f"channel {missing[0]!r} is not one of columns {self.columns}")

    @property
    def uri(self) -> str:
        """Where the samples come from, for status and logs."""
        if self.transport == "command":
            return "command: " + " ".join(self.command or [])
        if self.transport == "udp":
            return f"udp://{self.address}"
        if self.transport == "serial":
            return f"serial:{self.path}@{self.baud}"
        return f"{self.transport}:{self.path}"

    def given_windowing(self) -> Windowing:
        """The windowing from this config alone (no model to fill the gaps): window and channels given."""
        if not self.channels or self.window is None:
            raise SourceError(f"source {self.uri}: without a model, give source.channels and source.window")
        return Windowing(tuple(self.channels), self.window, self.hop or self.window)

    def window_settings(self) -> dict[str, Any]:
        """The windowing keys given here (None: from the model), for WindowSpec.resolve."""
        keys = ("channels", "window", "hop", "layout", "normalize", "mean", "std")
        return {k: getattr(self, k) for k in keys}


def open_transport(cfg: SensorSourceConfig) -> Transport:
    """Open the configured transport; OSError when it cannot be opened now."""
    if cfg.transport == "serial" and cfg.path is not None:
        return open_serial(cfg.path, cfg.baud, cfg.raw)
    if cfg.transport == "fifo" and cfg.path is not None:
        return open_fifo(cfg.path)
    if cfg.transport == "file" and cfg.path is not None:
        return TailTransport(cfg.path, cfg.from_start)
    if cfg.transport == "command" and cfg.command is not None:
        return CommandTransport(cfg.command)
    if cfg.transport == "udp" and cfg.address is not None:
        return UdpTransport(cfg.address)
    raise OSError(f"transport {cfg.transport} is not configured")  # the config validator prevents this


def make_parser(cfg: SensorSourceConfig, channels: tuple[str | int, ...]) -> Parser:
    """The record parser for the config's format and the resolved channels."""
    scale = TIME_UNITS[cfg.time_unit]
    if cfg.format == "json":
        return JsonParser([str(c) for c in channels], time_field=_opt_str(cfg.time_field), time_scale=scale)
    if cfg.format == "binary":
        index = [int(c) for c in channels]
        refs = [*index, *([int(cfg.time_field)] if cfg.time_field is not None else [])]
        return BinaryParser(
            index,
            dtype=str(cfg.dtype),
            endian=cfg.endian,
            record_values=cfg.record_values or max(refs) + 1,
            time_field=int(cfg.time_field) if cfg.time_field is not None else None,
            time_scale=scale,
        )
    return CsvParser(
        channels, columns=cfg.columns, delimiter=cfg.delimiter, time_field=cfg.time_field, time_scale=scale
    )


def _opt_str(value: str | int | None) -> str | None:
    return None if value is None else str(value)


class MalformedLog:
    """Logs the first malformed input at once, then at most one summary line per interval."""

    def __init__(self, where: str, every_s: float = MALFORMED_LOG_EVERY_S) -> None:
        self.where = where
        self.every_s = every_s
        self._pending = 0
        self._next = 0.0

    def note(self, count: int, problem: str) -> None:
        """`count` malformed lines/records were skipped; `problem` describes the last one."""
        self._pending += count
        now = time.monotonic()
        if now >= self._next:
            log.warning("%s: skipped %d malformed line(s)/record(s); last: %s", self.where, self._pending, problem)
            self._pending = 0
            self._next = now + self.every_s


@SOURCES.register("sensor", SensorSourceConfig)
class SensorSource(Source):
    """Reads samples, cuts windows, builds the model input, puts frames into the slot; reopens on failure."""

    def __init__(
        self,
        cfg: SensorSourceConfig,
        *,
        slot: FrameSlot,
        stats: PipelineStats,
        name: str = "edged-source",
        prepare: Preparer | None = None,
    ) -> None:
        super().__init__(name)
        self.cfg = cfg
        self.slot = slot
        self.stats = stats
        self.prepare = prepare
        spec = prepare.spec if prepare is not None else cfg.given_windowing()
        self.windower = Windower(spec.window, spec.hop, len(spec.channels))
        try:
            self.parser = make_parser(cfg, spec.channels)
        except ValueError as exc:  # channels from the model's metadata that do not fit this format
            raise SourceError(f"source {cfg.uri}: channels {list(spec.channels)} do not fit: {exc}") from exc
        self.clock = SampleClock(cfg.time_epoch)
        self.transport: Transport | None = None  # the open one (tests read a UDP port from it)
        self.samples = 0
        self._malformed_log = MalformedLog(f"source {cfg.uri}")
        self._index = 0

    def body(self) -> None:
        """Open, read, and on failure reopen with backoff, until stopped."""
        backoff = Backoff(self.cfg.reconnect_min_s, self.cfg.reconnect_max_s)
        failures = 0
        try:
            while not self._halt.is_set():
                try:
                    transport = open_transport(self.cfg)
                except OSError as exc:
                    failures = self._note_failure(f"cannot open: {exc}", failures)
                    self._halt.wait(backoff.next_delay())
                    continue
                self.transport = transport
                before = self.samples
                try:
                    why = self._read_loop(transport)
                finally:
                    transport.close()
                if self.samples > before:
                    backoff.reset()
                    failures = 0
                if why is None:
                    break
                if isinstance(transport, CommandTransport):
                    why = f"command exited with status {transport.proc.returncode}"
                failures = self._note_failure(why, failures)
                self._halt.wait(backoff.next_delay())
        finally:
            if self._close_slot:
                self.slot.close()

    def _read_loop(self, transport: Transport) -> str | None:
        """Read until stopped (None) or the transport ended/failed (the reason)."""
        self.parser.reset()
        self.windower.reset()
        self.clock.reset()
        self.stats.set_state("waiting", "waiting for data")
        waiting = True
        last_data = time.monotonic()
        while not self._halt.is_set():
            try:
                data = transport.read(POLL_S)
            except OSError as exc:
                return f"read failed: {exc}"
            if data is None:
                return "input ended"
            if data and self._take(data, transport.datagrams):
                last_data = time.monotonic()
                if waiting:
                    self.stats.set_state("running", "")
                    waiting = False
            elif not waiting and time.monotonic() - last_data > self.cfg.stall_s:
                self.stats.set_state("waiting", f"waiting for data: no samples for {self.cfg.stall_s:g} s")
                log.warning("source %s: no samples for %g s", self.cfg.uri, self.cfg.stall_s)
                waiting = True
            if waiting:
                self.stats.touch()  # not a result, but a live loop: the watchdog must not restart us for it
        return None

    def _frame(self, window: Any, ts: float, mono: float, own: bool) -> Frame:
        if self.prepare is None:
            return Frame(window, ts, self._index, mono=mono, own_clock=own)
        t0 = time.perf_counter()
        tensor, token = self.prepare(window)
        took = (time.perf_counter() - t0) * 1e3
        return Frame(window, ts, self._index, tensor, took, token, mono=mono, own_clock=own)

    def _take(self, data: bytes, final: bool) -> int:
        """Parse, window and hand over; returns the number of good samples."""
        arrival, arrival_mono = time.time(), boottime()  # the second corrects the first (core/clock.py)
        parsed = self.parser.feed(data, final=final)
        if parsed.malformed:
            self.stats.count_malformed(parsed.malformed)
            self._malformed_log.note(parsed.malformed, parsed.problem)
        n = len(parsed.values)
        if not n:
            return 0
        self.samples += n
        stamps = self.clock.stamps(parsed.clock, arrival, n)
        own = parsed.clock is not None and self.clock.epoch  # the data's epoch time: the sensor's word, not ours
        deadline = time.monotonic() + BURST_WAIT_S
        for window, ts in self.windower.push(parsed.values, stamps):
            frame = self._frame(window, ts, arrival_mono + (ts - arrival), own)
            self._index += 1
            if (left := deadline - time.monotonic()) > 0:
                self.slot.wait_empty(left)  # a burst is no reason to drop windows the model has time for
            self.stats.count_capture(self.slot.put(frame))
        return n
