"""Sensor record formats (CSV lines, JSON lines, raw binary records), the sample clock and the windower.

A parser turns the bytes a transport delivered into samples: a (n, channels) float64 array in the
configured channel order, and the sample clock of each sample when the data carries one. A line or record
that cannot be read is counted as malformed and skipped; it never raises.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

MAX_LINE = 65536  # a "line" longer than this (binary noise on a text port) is dropped as malformed
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
FloatArray = npt.NDArray[np.float64]
Channel = str | int


@dataclass
class Parsed:
    """Samples read from one chunk of input."""

    values: FloatArray  # (n, channels)
    clock: FloatArray | None  # (n,) seconds from the data's own clock, or None
    malformed: int = 0
    problem: str = ""  # why the last malformed line/record was rejected, with a short excerpt


class Parser:
    """Base: `feed` bytes, get samples. `final` marks the end of a unit (a UDP datagram)."""

    def __init__(self, n_channels: int, has_clock: bool, time_scale: float) -> None:
        self.n_channels = n_channels
        self.has_clock = has_clock
        self.time_scale = time_scale

    def feed(self, data: bytes, *, final: bool = False) -> Parsed:
        """Parse what `data` completes; keep a partial line/record for the next call unless `final`."""
        raise NotImplementedError

    def reset(self) -> None:
        """Forget buffered partial input (after a reconnect)."""

    def _result(self, rows: list[list[float]], stamps: list[float], bad: int, problem: str) -> Parsed:
        values = np.asarray(rows, dtype=np.float64).reshape(len(rows), self.n_channels)
        clock = np.asarray(stamps, dtype=np.float64) * self.time_scale if self.has_clock else None
        return Parsed(values, clock, bad, problem)


class LineParser(Parser):
    """Splits input into lines; subclasses read one line into (values, clock value)."""

    def __init__(self, n_channels: int, has_clock: bool, time_scale: float) -> None:
        super().__init__(n_channels, has_clock, time_scale)
        self._buf = b""

    def reset(self) -> None:
        """Drop a partial line."""
        self._buf = b""

    def feed(self, data: bytes, *, final: bool = False) -> Parsed:
        """Parse every complete line in `data` (and the rest too when `final`)."""
        self._buf += data
        lines = self._buf.split(b"\n")
        self._buf = b"" if final else lines.pop()
        rows: list[list[float]] = []
        stamps: list[float] = []
        bad, problem = 0, ""
        if len(self._buf) > MAX_LINE:
            bad, problem, self._buf = 1, f"line longer than {MAX_LINE} bytes", b""
        for raw in lines:
            text = raw.strip()
            if not text:
                continue
            try:
                parsed = self.parse_line(text.decode("utf-8"))
            except (ValueError, TypeError) as exc:  # UnicodeDecodeError is a ValueError
                bad += 1
                problem = f"{exc} in {_excerpt(text)}"
                continue
            if parsed is not None:
                rows.append(parsed[0])
                stamps.append(parsed[1])
        return self._result(rows, stamps, bad, problem)

    def parse_line(self, line: str) -> tuple[list[float], float] | None:
        """(channel values, clock value) of a line; None for a line to skip; ValueError/TypeError if malformed."""
        raise NotImplementedError


def _excerpt(raw: bytes) -> str:
    return repr(raw[:60]) + ("..." if len(raw) > 60 else "")


def _finite(values: list[float]) -> list[float]:
    if not all(math.isfinite(v) for v in values):
        raise ValueError("a value is not finite")
    return values


class CsvParser(LineParser):
    """Delimited text: channels are column names or 0-based column indices.

    Names come from `columns` or from a header line (a line without a single number in it); a header
    that arrives again (a writer that reopened the pipe) is skipped.
    """

    def __init__(
        self,
        channels: Sequence[Channel],
        *,
        columns: Sequence[str] | None = None,
        delimiter: str = ",",
        time_field: Channel | None = None,
        time_scale: float = 1.0,
    ) -> None:
        super().__init__(len(channels), time_field is not None, time_scale)
        self.channels = list(channels)
        self.time_field = time_field
        self.delimiter = delimiter
        self.columns = list(columns) if columns is not None else None
        self._index: list[int] | None = None
        self._time_index: int | None = None
        self._resolve()

    def _resolve(self) -> None:
        refs = [*self.channels, *([self.time_field] if self.time_field is not None else [])]
        if any(isinstance(r, str) for r in refs) and self.columns is None:
            return  # wait for a header
        cols = self.columns or []
        missing = [r for r in refs if isinstance(r, str) and r not in cols]
        if missing:
            self._index = None
            raise ValueError(f"header has no column {missing[0]!r} (columns: {', '.join(cols)})")
        idx = [cols.index(r) if isinstance(r, str) else r for r in refs]
        self._index = idx[: len(self.channels)]
        self._time_index = idx[-1] if self.time_field is not None else None

    def parse_line(self, line: str) -> tuple[list[float], float] | None:
        """One CSV line; a header line is learnt or skipped."""
        fields = [f.strip() for f in line.split(self.delimiter)]
        if not any(_is_number(f) for f in fields):
            if fields == self.columns:
                return None  # the header again
            if self.columns is None:
                self.columns = fields
                try:
                    self._resolve()
                except ValueError:
                    self.columns = None  # a later, better header may still come
                    raise
                return None
            raise ValueError("no number in the line")
        if self._index is None:
            raise ValueError("no header line yet naming the columns (set source.columns)")
        try:
            values = [float(fields[i]) for i in self._index]
            stamp = float(fields[self._time_index]) if self._time_index is not None else 0.0
        except IndexError:
            raise ValueError(f"{len(fields)} fields, fewer than the channels need") from None
        return _finite(values), stamp


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


class JsonParser(LineParser):
    """One JSON object per line; channels (and the time field) are keys, dotted for nested objects."""

    def __init__(self, channels: Sequence[str], *, time_field: str | None = None, time_scale: float = 1.0) -> None:
        super().__init__(len(channels), time_field is not None, time_scale)
        self.paths = [c.split(".") for c in channels]
        self.time_path = time_field.split(".") if time_field is not None else None

    def parse_line(self, line: str) -> tuple[list[float], float] | None:
        """One JSON line."""
        obj = json.loads(line)  # JSONDecodeError is a ValueError
        if not isinstance(obj, dict):
            raise TypeError("not a JSON object")
        values = [_number(obj, p) for p in self.paths]
        stamp = _number(obj, self.time_path) if self.time_path is not None else 0.0
        return _finite(values), stamp


def _number(obj: dict[str, Any], path: list[str]) -> float:
    value: Any = obj
    for key in path:
        if not isinstance(value, dict) or key not in value:
            raise ValueError(f"no field {'.'.join(path)!r}")
        value = value[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"field {'.'.join(path)!r} is not a number")
    return float(value)


class BinaryParser(Parser):
    """Fixed-size records of `record_values` numbers of one dtype; channels are indices into a record.

    On a stream the records must be aligned from the start of each connection; in a datagram (`final`)
    a length that is not a whole number of records makes the datagram malformed. A record holding a
    non-finite value (NaN, inf) is malformed.
    """

    def __init__(
        self,
        channels: Sequence[int],
        *,
        dtype: str,
        endian: str = "little",
        record_values: int,
        time_field: int | None = None,
        time_scale: float = 1.0,
    ) -> None:
        super().__init__(len(channels), time_field is not None, time_scale)
        self.dtype = np.dtype(dtype).newbyteorder("<" if endian == "little" else ">")
        self.record_values = record_values
        self.record_size = self.dtype.itemsize * record_values
        self.channels = list(channels)
        self.time_field = time_field
        self._buf = b""

    def reset(self) -> None:
        """Drop a partial record."""
        self._buf = b""

    def feed(self, data: bytes, *, final: bool = False) -> Parsed:
        """Decode every whole record."""
        bad, problem = 0, ""
        if final:
            buf, self._buf = self._buf + data, b""
            if len(buf) % self.record_size:
                return Parsed(
                    np.empty((0, self.n_channels)),
                    None,
                    1,
                    f"datagram of {len(buf)} bytes is not a whole number of {self.record_size}-byte records",
                )
        else:
            buf = self._buf + data
            whole = len(buf) - len(buf) % self.record_size
            buf, self._buf = buf[:whole], buf[whole:]
        records = np.frombuffer(buf, dtype=self.dtype).reshape(-1, self.record_values).astype(np.float64)
        ok = np.isfinite(records).all(axis=1)
        if not ok.all():
            bad, problem = int((~ok).sum()), "record with a non-finite value"
            records = records[ok]
        clock = records[:, self.time_field] * self.time_scale if self.time_field is not None else None
        return Parsed(np.ascontiguousarray(records[:, self.channels]), clock, bad, problem)


class SampleClock:
    """Timestamps for samples: the data's epoch clock, a device clock anchored to arrival, or arrival time."""

    def __init__(self, epoch: bool) -> None:
        self.epoch = epoch
        self._offset: float | None = None
        self._last = -math.inf

    def reset(self) -> None:
        """A new connection: anchor a device clock again."""
        self._offset, self._last = None, -math.inf

    def stamps(self, clock: FloatArray | None, arrival: float, n: int) -> FloatArray:
        """Epoch seconds of `n` samples that arrived at `arrival`."""
        if clock is None:
            return np.full(n, arrival)
        if self.epoch:
            return clock
        if self._offset is None or (n and clock[0] < self._last):  # first data, or the device restarted
            self._offset = arrival - float(clock[-1])
        if n:
            self._last = float(clock[-1])
        return clock + self._offset


class Windower:
    """Cuts a stream of samples into windows of `window` samples every `hop` samples.

    The timestamp of a window is that of its last sample (the moment the window was complete).
    """

    def __init__(self, window: int, hop: int, n_channels: int) -> None:
        self.window = window
        self.hop = hop
        self.n_channels = n_channels
        self.reset()

    def reset(self) -> None:
        """Start over (a gap in the data: no window spans it)."""
        self._values = np.empty((0, self.n_channels))
        self._stamps = np.empty(0)
        self._skip = 0

    def push(self, values: FloatArray, stamps: FloatArray) -> list[tuple[FloatArray, float]]:
        """Add samples; return the windows they complete, oldest first."""
        vals = np.concatenate([self._values, values]) if len(self._values) else values
        ts = np.concatenate([self._stamps, stamps]) if len(self._stamps) else stamps
        out: list[tuple[FloatArray, float]] = []
        start = 0
        while True:
            if self._skip:
                drop = min(self._skip, len(vals) - start)
                start += drop
                self._skip -= drop
            if len(vals) - start < self.window:
                break
            out.append((vals[start : start + self.window].copy(), float(ts[start + self.window - 1])))
            advance = min(self.hop, self.window)
            start += advance
            self._skip = self.hop - advance
        self._values, self._stamps = vals[start:].copy(), ts[start:].copy()
        return out
