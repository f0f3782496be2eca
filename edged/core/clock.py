"""Whether the wall clock can be trusted, and what corrects the times stamped while it could not.

A Raspberry Pi has no real-time clock: booted without a network its wall clock starts at the last shutdown
(fake-hwclock) or at 1970 and stays wrong until a time service reaches a server, and then it is stepped.
edged does not guess which times are right; it asks:

- **Is the clock synchronized?** (`clock.sync`) `kernel`: the kernel's time status (adjtimex: a time service,
  systemd-timesyncd, chrony or ntpd, clears its "unsynchronized" flag once it set the clock; any manual set
  raises it again); `file`: a file that exists only while synchronized (`/run/systemd/timesync/synchronized`,
  which systemd-timesyncd makes); `command`: a command that exits 0 when synchronized; `auto`: the kernel's
  status, else that file, so a clock no service vouches for is not trusted; `assume`: the operator vouches
  (a container whose host keeps the time).
- **Did the wall clock step?** Its distance to CLOCK_BOOTTIME (which counts from the boot and never jumps)
  is watched at every check and at every frame: a change larger than `clock.step_s` is a step. A step is
  counted and logged, and the clock is taken as unsynchronized until the time service vouches for it *after*
  the step: the kernel's status (a manual set raises its "unsynchronized" flag), the command (run after the
  step), or the flag file written again since the last check before the step (its inode or times changed: the
  file that was there then vouched for the time before the step, and a `date -s` leaves it in place).

A frame captured while the clock is not trusted is stamped with what corrects its time later: the boot id
and its CLOCK_BOOTTIME capture time (`Unsynced`). Once the clock is synchronized (same boot), the true time
of that frame is `mono + offset`, the offset being the wall clock minus CLOCK_BOOTTIME then: results still
in the spool are corrected before they leave (`correct`), and those already sent are corrected by the
consumer from the correction the device publishes (`corrections`, persisted in `clock.json`).

The spool's TTL and its clock never read the wall clock (store/spool.py), so a step expires nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import logging
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from edged.core.durable import read_json, write_atomic
from edged.core.settings import Duration, Strict, from_config_dir

log = logging.getLogger(__name__)

TIMESYNCD_FLAG = Path("/run/systemd/timesync/synchronized")
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
STATE_FILE = "clock.json"
KEEP_CORRECTIONS = 16  # the corrections remembered and published (one per unsynchronized stretch)
COMMAND_TIMEOUT_S = 5.0
TIME_ERROR = 5  # adjtimex's return value when the clock is not synchronized (STA_UNSYNC)
STA_UNSYNC = 0x0040
MARK = b'"clock":{"synced":false'  # in a compact result message (pipeline/worker.py) stamped unsynchronized

Sync = Literal["auto", "kernel", "file", "command", "assume"]


class ClockConfig(Strict):
    """`clock:`: how edged learns whether the wall clock is synchronized (docs/configuration.md, "Time")."""

    sync: Sync = Field(
        "auto",
        description="What says the clock is synchronized: auto (the kernel's time status, else the file), "
        "kernel, file, command, or assume (always trusted).",
    )
    file: Path = Field(TIMESYNCD_FLAG, description="For sync: file (and auto): exists while synchronized.")
    command: list[str] | None = Field(
        None, description="For sync: command: argv of a command that exits 0 while synchronized."
    )
    check_s: Duration = Field(10.0, description="Ask the time service this often.")
    step_s: Duration = Field(1.0, description="A jump of the wall clock larger than this is a step.")

    @field_validator("file")
    @classmethod
    def _relative(cls, value: Path, info: ValidationInfo) -> Path:
        return from_config_dir(value, (info.context or {}).get("base_dir"))

    @model_validator(mode="after")
    def _command_given(self) -> ClockConfig:
        if self.sync == "command" and not self.command:
            raise ValueError("sync: command needs command: [argv...]")
        return self


@dataclass(frozen=True)
class Unsynced:
    """What a time stamped while the clock was not trusted needs to be corrected later."""

    boot: str  # /proc/sys/kernel/random/boot_id
    mono: float  # CLOCK_BOOTTIME at capture, seconds

    def shifted(self, by_s: float) -> Unsynced:
        """The stamp of a moment `by_s` seconds later (an event stamped with an earlier frame's time)."""
        return Unsynced(self.boot, self.mono + by_s)

    def fields(self) -> dict[str, Any]:
        """The message's `clock` object."""
        return {"synced": False, "boot": self.boot, "mono": round(self.mono, 3)}


def boottime() -> float:
    """Seconds since the boot, suspend included; never steps."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def boot_id() -> str:
    """This boot's id (a random UUID the kernel draws at each boot); "" where there is none."""
    try:
        return BOOT_ID.read_text(encoding="ascii").strip()[:64]
    except OSError:
        return ""


class _Timex(ctypes.Structure):
    # struct timex up to `status` (the same layout on 32- and 64-bit Linux), then room for the rest
    _fields_ = (
        ("modes", ctypes.c_uint),
        ("offset", ctypes.c_long),
        ("freq", ctypes.c_long),
        ("maxerror", ctypes.c_long),
        ("esterror", ctypes.c_long),
        ("status", ctypes.c_int),
        ("rest", ctypes.c_byte * 256),
    )


def kernel_synced() -> bool | None:
    """The kernel's verdict (adjtimex, read only): None where it cannot be asked."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        timex = _Timex()
        state = libc.adjtimex(ctypes.byref(timex))
    except (OSError, AttributeError):
        return None
    if state < 0:
        return None
    return state != TIME_ERROR and not timex.status & STA_UNSYNC


def _command_synced(argv: list[str]) -> tuple[bool, str]:
    try:
        done = subprocess.run(argv, capture_output=True, timeout=COMMAND_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"the command {argv[0]} failed: {exc}"
    return done.returncode == 0, f"the command {argv[0]} exited {done.returncode}"


def _file_stamp(path: Path) -> tuple[int, int, int] | None:
    """What tells one write of the flag file from another (inode, mtime, ctime in ns); None while it is absent."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_ctime_ns


def ask(cfg: ClockConfig, file_at_step: tuple[int, int, int] | None = None) -> tuple[bool, str]:
    """(synchronized, what said so) by `cfg.sync`. `file_at_step`: the flag file as it was when the clock last
    stepped: the same file does not vouch for the time after the step (the time service must write it again)."""
    if cfg.sync == "assume":
        return True, "assumed (clock.sync: assume)"
    if cfg.sync == "command":
        return _command_synced(cfg.command or [])
    kernel = kernel_synced() if cfg.sync in {"auto", "kernel"} else None
    if kernel or cfg.sync == "kernel":
        return bool(kernel), "the kernel's time status" + " is unreadable" * (kernel is None)
    return _file_says(cfg, file_at_step)


def _file_says(cfg: ClockConfig, file_at_step: tuple[int, int, int] | None) -> tuple[bool, str]:
    """The flag file's verdict (after the kernel's, with `auto`)."""
    stamp = _file_stamp(cfg.file)
    if stamp is not None and file_at_step is not None and stamp == file_at_step:
        return False, f"{cfg.file} was not written again since the clock stepped"
    if stamp is not None:
        return True, f"{cfg.file} exists"
    if cfg.sync == "file":
        return False, f"{cfg.file} does not exist"
    return False, f"neither the kernel's time status nor {cfg.file} says so"


class ClockWatch:
    """The clock's state for one daemon: `check()` from the daemon's timer, `stamp()` from every source (any
    thread), `correct()` from the uplink, `corrections` for the consumers."""

    def __init__(self, cfg: ClockConfig | None = None, state_dir: Path | None = None) -> None:
        self.cfg = cfg = cfg or ClockConfig(sync="assume")
        self.state_path = state_dir / STATE_FILE if state_dir is not None else None
        # the boot id; where the kernel gives none, one for this process (its stamps are corrected only by it)
        self.boot = boot_id() or f"process-{uuid.uuid4()}"
        self._lock = threading.Lock()
        self.synced = cfg.sync == "assume"
        self.detail = "not asked yet"
        self.since = time.monotonic()
        self.steps = 0
        self.last_step: dict[str, float] | None = None  # {"by_s", "at"} of the latest step
        self.flagged = 0  # frames stamped unsynchronized by this process
        self.version = 0  # bumped at every change a consumer should hear of
        self.check_wanted = threading.Event()  # a step seen by a source: the daemon checks at once
        self._file_seen: tuple[int, int, int] | None = None  # the flag file as the last check found it
        self._file_at_step: tuple[int, int, int] | None = None  # ... and as the last check before a step did
        self._offset = time.time() - boottime()
        self._listeners: list[Callable[[], None]] = []
        saved = read_json(self.state_path, "clock") if self.state_path is not None else None
        saved = saved if isinstance(saved, dict) else {}
        kept = saved.get("corrections")
        self.corrections: list[dict[str, Any]] = [c for c in kept if _valid(c)] if isinstance(kept, list) else []
        # frames of this boot were stamped unsynchronized and no correction covers them yet (an earlier run too)
        self._pending = bool(self.boot) and saved.get("pending") == self.boot

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call `listener()` (cheap, any thread) when the state or the corrections change."""
        self._listeners.append(listener)

    # -- the hot path ----------------------------------------------------------------------------------

    def stamp(self, ts: float, mono: float | None = None) -> Unsynced | None:
        """For a frame captured at wall time `ts` (CLOCK_BOOTTIME `mono`, taken with it; None: now's offset
        between the two is used): None while the clock is trusted, else its correction stamp. A step between
        the capture and this call is seen at the next frame, not blamed on this one."""
        offset = time.time() - boottime() if mono is None else ts - mono
        if abs(offset - self._offset) > self.cfg.step_s:
            self._stepped(offset)
        if self.synced:
            return None
        if not self._pending:
            self._mark_pending()
        self.flagged += 1  # a count for status (a lost increment between threads is harmless)
        return Unsynced(self.boot, ts - offset)

    def correct(self, payload: bytes) -> bytes:
        """A spooled result message on its way out: a time stamped unsynchronized in this boot is corrected
        when the clock is synchronized now (`ts` the true time, `clock.ts_original` what was stamped,
        `clock.corrected`). Anything else, or anything that does not parse, goes as it is."""
        if MARK not in payload or not self.synced:
            return payload
        offset = time.time() - boottime()
        try:
            data = json.loads(payload)
            clock = data.get("clock") if isinstance(data, dict) else None
            if not isinstance(clock, dict) or clock.get("corrected") or clock.get("boot") != self.boot:
                return payload
            mono, ts = float(clock["mono"]), float(data["ts"])
        except (ValueError, KeyError, TypeError):
            return payload
        clock.update(corrected=True, ts_original=ts)
        data["ts"] = round(mono + offset, 3)
        return json.dumps(data, separators=(",", ":")).encode()

    # -- the daemon's timer ----------------------------------------------------------------------------

    def check(self) -> None:
        """Ask the time service; note a step, a change of state, and the correction a synchronization brings."""
        self.check_wanted.clear()
        offset = time.time() - boottime()
        if abs(offset - self._offset) > self.cfg.step_s:
            self._stepped(offset)  # before asking: the answer must be about the time after the step
        try:
            synced, detail = ask(self.cfg, self._file_at_step)
            self._file_seen = _file_stamp(self.cfg.file)
        except OSError as exc:  # the flag file's folder unreadable, say: not vouched for, and said so
            synced, detail = False, f"cannot ask: {exc}"
        changed = False
        with self._lock:
            self.detail = detail
            if synced != self.synced:
                self.synced, self.since, changed = synced, time.monotonic(), True
                if synced and self._pending:
                    self._pending = False
                    now = {"boot": self.boot, "mono": round(boottime(), 3), "offset": round(offset, 3)}
                    self.corrections = [*self.corrections, now][-KEEP_CORRECTIONS:]
        if not changed:
            return
        if synced:
            log.info("clock: synchronized (%s)%s", detail, "; correcting the times stamped before" * bool(
                self.corrections and self.corrections[-1]["boot"] == self.boot))  # fmt: skip
        else:
            log.warning("clock: not synchronized (%s): results carry that, and are corrected once it is", detail)
        self._save()
        self._changed()

    def describe(self) -> dict[str, Any]:
        """The status JSON's `clock` object."""
        return {
            "state": "synchronized" if self.synced else "unsynchronized",
            "source": self.cfg.sync,
            "detail": self.detail,
            "since_s": round(time.monotonic() - self.since, 1),
            "steps": self.steps,
            "last_step": dict(self.last_step) if self.last_step else None,
            "flagged": self.flagged,
            "boot": self.boot,
        }

    def message(self) -> dict[str, Any]:
        """What the device publishes for its consumers (retained): the state and the corrections."""
        return {"state": "synchronized" if self.synced else "unsynchronized", "boot": self.boot,
                "corrections": list(self.corrections)}  # fmt: skip

    # -- inside ----------------------------------------------------------------------------------------

    def _stepped(self, offset: float) -> None:
        with self._lock:
            by = offset - self._offset
            if abs(by) <= self.cfg.step_s:
                return  # another thread saw it first
            self._offset = offset
            self.steps += 1
            self.last_step = {"by_s": round(by, 3), "at": round(time.time(), 3)}
            # the flag file as the last check before the step saw it vouched for the time before the step only
            self._file_at_step = self._file_seen
            was = self.synced
            if self.cfg.sync != "assume":
                self.synced = False  # until the time service says so again
                self.since = time.monotonic()
        log.warning("clock: the wall clock stepped by %+.3f s%s", by,
                    "; not trusted until the time service confirms it" * (was and not self.synced))  # fmt: skip
        self.check_wanted.set()
        self._changed()

    def _mark_pending(self) -> None:
        with self._lock:
            if self._pending:
                return
            self._pending = True
        self._save()

    def _save(self) -> None:
        if self.state_path is None:
            return
        body = {"pending": self.boot if self._pending else None, "corrections": self.corrections}
        try:
            write_atomic(self.state_path, json.dumps(body).encode())
        except OSError as exc:
            log.warning("clock: cannot write %s (%s)", self.state_path, exc.strerror or exc)

    def _changed(self) -> None:
        self.version += 1
        for listener in self._listeners:
            with contextlib.suppress(Exception):
                listener()


def _valid(correction: object) -> bool:
    return (
        isinstance(correction, dict)
        and isinstance(correction.get("boot"), str)
        and isinstance(correction.get("mono"), int | float)
        and isinstance(correction.get("offset"), int | float)
    )
