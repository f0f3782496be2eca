"""What every source shares: the frame type, the latest-frame slot, the Source thread and the registry
of source types.

Capture is the first stage: a device, file, stream or sensor enters, `Frame`s leave through a
`FrameSlot` (latest frame wins). A source may prepare the model input in its own thread with the
`prepare` callable its pipeline hands it (capture never imports the model stage)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy.typing as npt

from edged.core.clock import Unsynced
from edged.core.osthread import CAPTURE_NICE
from edged.core.registry import Registry
from edged.core.stats import PipelineStats
from edged.core.threads import Supervised

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Frame:
    """One captured frame. `ts` is the capture time (epoch seconds); `index` the source's frame number.

    `tensor` is the model input when the source thread already prepared the frame (`pre_ms` long) with
    its pipeline's Preparer; `pre_token` identifies the preparation used (after a model swap a frame
    prepared for the old model is prepared again).
    `image` is a BGR uint8 picture for a camera, a (window, channels) float array for a sensor.
    """

    image: npt.NDArray[Any]
    ts: float
    index: int
    tensor: npt.NDArray[Any] | None = None
    pre_ms: float = 0.0
    pre_token: object = None
    mono: float | None = None  # CLOCK_BOOTTIME when `ts` was taken (None: not known, the slot's time is used)
    own_clock: bool = False  # `ts` is the data's own epoch time (a sensor's), not this device's clock: not flagged
    clock: Unsynced | None = None  # stamped by the slot while the wall clock is not trusted (core/clock.py)


class Preparer(Protocol):
    """What a pipeline hands its source to make the model input in the source's thread (overlapping the
    previous frame's model run): the current model's preparation, swapped with the model."""

    @property
    def spec(self) -> Any:
        """The current preparation's recipe (a sensor source reads its channels, window and hop)."""

    def __call__(self, data: npt.NDArray[Any]) -> tuple[npt.NDArray[Any], object]:
        """(model input, token naming the preparation used: a frame prepared for a swapped-out model is
        prepared again by the worker)."""


class FrameSlot:
    """A one-frame mailbox between a source and its model: `put` overwrites, so the latest frame wins.

    The source never blocks on a slow model; every overwritten frame is reported as dropped. Every frame of
    every source passes here as it is captured, so here it is stamped when the wall clock is not trusted
    (`stamp`: the daemon's ClockWatch; None trusts the clock).
    """

    def __init__(self, stamp: Callable[[float, float | None], Unsynced | None] | None = None) -> None:
        self._cond = threading.Condition()
        self._frame: Frame | None = None
        self._closed = False
        self.stamp = stamp

    def put(self, frame: Frame) -> int:
        """Store `frame`; return 1 when it replaced a frame the model never saw, else 0.

        After `close()` (the consumer gave up) frames are not stored and count as dropped.
        """
        if self.stamp is not None and frame.clock is None and not frame.own_clock:
            clock = self.stamp(frame.ts, frame.mono)
            if clock is not None:
                frame = replace(frame, clock=clock)
        with self._cond:
            if self._closed:
                return 1
            dropped = 1 if self._frame is not None else 0
            self._frame = frame
            self._cond.notify_all()
            return dropped

    def get(self, timeout: float | None) -> Frame | None:
        """Take the frame, waiting up to `timeout` (None: until there is one); None on timeout or when
        closed and empty."""
        with self._cond:
            self._cond.wait_for(lambda: self._frame is not None or self._closed, timeout)
            frame, self._frame = self._frame, None
            if frame is not None:
                self._cond.notify_all()
            return frame

    def wait_empty(self, timeout: float) -> bool:
        """Wait until the model took the last frame (paces a file to the model). True when empty."""
        with self._cond:
            self._cond.wait_for(lambda: self._frame is None or self._closed, timeout)
            return self._frame is None

    def close(self) -> None:
        """No more frames: wake the consumer; it drains what is left, then sees `closed`."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        """True once the source has finished and the slot is empty."""
        with self._cond:
            return self._closed and self._frame is None


class Source(Supervised):
    """A thread that fills a FrameSlot until stopped. Subclasses implement `body`, watch `_halt` and,
    on the way out, close the slot when `_close_slot` says so. Capture runs at nice +CAPTURE_NICE (and
    the decoder threads it starts inherit it): delivery goes first when the CPU is short."""

    cfg: Any  # the source's config model (it has `uri`)
    stats: PipelineStats
    slot: FrameSlot

    def __init__(self, name: str) -> None:
        super().__init__(name, nice=CAPTURE_NICE)
        self._halt = threading.Event()
        self._close_slot = True

    def _note_failure(self, why: str, logged: int) -> int:
        """Count a reconnect, show it in the status, log it; returns the failures in a row so far."""
        self.stats.count_reconnect()
        where = getattr(self, "where", str(self.cfg.uri))  # a camera's stream address without its password
        self.stats.set_state("reconnecting", f"{where}: {why}")
        # the first failures in a row are worth a warning; after that the status shows the count
        level = logging.WARNING if logged < 3 else logging.DEBUG
        log.log(level, "source %s: %s; reconnecting with backoff", where, why, extra={"PIPELINE": self.stats.name})
        return logged + 1

    def detach(self) -> None:
        """Give a source that did not stop in time a slot nobody reads: its late frames go nowhere, so a
        replacement source is the only one feeding the pipeline."""
        self.slot = FrameSlot()

    def stop(self, *, close_slot: bool = True) -> None:
        """Ask the source to finish (safe to call more than once); it closes its slot on the way out
        unless `close_slot` is False (a source being replaced by another feeding the same slot)."""
        self._close_slot = close_slot
        self._halt.set()


SourceFactory = Callable[..., Source]
# type key -> (config model, Source class); each source module registers itself
SOURCES: Registry[SourceFactory] = Registry(
    "source", "type", ("edged.capture.camera", "edged.capture.sensor"), plugins="edged.sources"
)


def make_source(cfg: Any, **kwargs: Any) -> Source:
    """Build the source for a pipeline's `source` config (tests may swap entries in SOURCES.factories)."""
    return SOURCES.factory(cfg.type)(cfg, **kwargs)
