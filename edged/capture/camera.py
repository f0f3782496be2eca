"""`camera` source: OpenCV VideoCapture on a device, a video file, a stream URL or a GStreamer pipeline."""

from __future__ import annotations

import functools
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import cv2
import numpy as np
import numpy.typing as npt
from pydantic import Field, ValidationInfo, field_validator, model_validator

from edged.capture import rtsp
from edged.capture.base import SOURCES, Frame, FrameSlot, Preparer, Source
from edged.capture.motion import MotionGate
from edged.core.backoff import Backoff
from edged.core.clock import boottime
from edged.core.settings import Strict, check_order, from_config_dir, is_file, look_up
from edged.core.stats import PipelineStats

log = logging.getLogger(__name__)
STALL_SHARE = 0.9  # a read that blocked this share of stall_s met the read timeout: the stream stalled


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
    clock: Literal["wall", "video"] = Field(
        "wall",
        description="Frame times: wall (when captured) or video (a file only: when it was opened plus the frame's "
        "place in the recording, so motion keep-alive, tracking and events follow the recording when it is read "
        "faster than real time).",
    )
    width: int | None = Field(None, gt=0, description="Resolution to request from a camera (width).")
    height: int | None = Field(None, gt=0, description="Resolution to request from a camera (height).")
    reconnect_min_s: float = Field(0.5, gt=0, description="First reconnect delay after a failure.")
    reconnect_max_s: float = Field(
        4.0,
        gt=0,
        description="Cap of the exponential reconnect delay: a camera that comes back is read within about this "
        "long (plus its open time).",
    )
    stall_s: float = Field(
        5.0,
        gt=0,
        description="A stream (rtsp://, http://) that delivers no frame for this long has stalled: it is reopened "
        "and status says so (OpenCV's FFmpeg read timeout).",
    )
    open_timeout_s: float = Field(10.0, gt=0, description="How long opening a stream may take before it is retried.")
    transport: Literal["auto", "tcp", "udp"] = Field(
        "auto",
        description="RTSP transport: auto (FFmpeg's: UDP, then TCP when UDP gets nothing), tcp (interleaved in the "
        "RTSP connection: through NAT and firewalls, no lost packets) or udp (lowest latency on a clean LAN).",
    )
    stop_at_end: bool = Field(
        False,
        description="A video file that ends stops this pipeline instead of being reopened "
        "(used by `edged demo` and batch jobs).",
    )

    @field_validator("uri")
    @classmethod
    def _video_file_exists(cls, value: str | int, info: ValidationInfo) -> str | int:
        """A video file that is not there is a typo: refused at check-config. A camera device (anything
        under /dev) or a stream that is absent is merely unplugged or down: the pipeline waits for it."""
        base = (info.context or {}).get("base_dir")
        if base is None or isinstance(value, int) or source_kind(value) != "file" or value.startswith("/dev/"):
            return value  # a config built in code (the demo) is not checked: only a config file's typos are
        path = from_config_dir(Path(value), base)  # relative to the config file, as model.path is
        if not is_file(look_up(path, "the video file")):
            raise ValueError(
                f"video file not found: {path}; a camera is /dev/videoN or its index, a stream rtsp://... "
                "(those may be absent at start: the pipeline waits for them)"
            )
        return str(path)

    @model_validator(mode="after")
    def _backoff_order(self) -> CameraSourceConfig:
        check_order(self, "reconnect_min_s", "reconnect_max_s")
        return self


CaptureFactory = Callable[[CameraSourceConfig], Any]
ReadOutcome = Literal["stopped", "end", "failed"]


def source_kind(uri: str | int) -> str:
    """Classify a camera uri: device, file, stream or gstreamer."""
    if isinstance(uri, int) or uri.isdigit() or uri.startswith("/dev/"):
        return "device"
    if "://" in uri:
        return "stream"
    if "!" in uri:
        return "gstreamer"
    return "file"


def missing_device(uri: str | int) -> str | None:
    """Why a device path names nothing now (`/dev/vidoe0`: a typo is waited for like an unplugged camera), with
    the video devices there are; None when it exists (or is an index)."""
    if isinstance(uri, int) or uri.isdigit():
        return None
    try:
        if look_up(Path(uri), "the device") is not None:
            return None
    except ValueError as exc:  # a name no device can have
        return f"{exc}; the pipeline waits for it to appear"
    here = sorted(str(p) for p in Path("/dev").glob("video*"))
    there = ", ".join(here[:8]) if here else "none"
    return f"no such device {uri} (video devices here: {there}); the pipeline waits for it to appear"


@functools.cache
def has_backend(name: str) -> bool:
    """Whether this OpenCV build includes a video I/O backend (e.g. "GStreamer", "FFMPEG")."""
    pattern = rf"^\s*{re.escape(name)}:\s*YES"
    return re.search(pattern, cv2.getBuildInformation(), re.MULTILINE) is not None


FFMPEG_OPTIONS = "OPENCV_FFMPEG_CAPTURE_OPTIONS"  # read by OpenCV at each open: key;value pairs joined by |
_OPTIONS_LOCK = threading.Lock()  # the variable is the process's: one stream opens with its options at a time


def _open_stream(uri: str, timeouts: list[int], transport: str) -> Any:
    """An FFmpeg stream, with the source's own RTSP transport (OpenCV takes FFmpeg's options only from the
    environment, read when a capture opens: set for this open alone, the operator's own options kept)."""
    if transport == "auto" or not uri.lower().startswith(("rtsp://", "rtsps://")):
        return cv2.VideoCapture(uri, cv2.CAP_FFMPEG, timeouts)
    with _OPTIONS_LOCK:
        before = os.environ.get(FFMPEG_OPTIONS)
        os.environ[FFMPEG_OPTIONS] = "|".join(filter(None, [before, f"rtsp_transport;{transport}"]))
        try:
            return cv2.VideoCapture(uri, cv2.CAP_FFMPEG, timeouts)
        finally:
            if before is None:
                os.environ.pop(FFMPEG_OPTIONS, None)
            else:
                os.environ[FFMPEG_OPTIONS] = before


def open_capture(cfg: CameraSourceConfig) -> Any:
    """Open a cv2.VideoCapture for the config; the caller checks isOpened()."""
    uri = cfg.uri
    kind = source_kind(uri)
    if kind == "device":
        target: str | int = int(uri) if isinstance(uri, int) or uri.isdigit() else uri
        cap = cv2.VideoCapture(target)
    elif kind == "gstreamer":
        cap = cv2.VideoCapture(str(uri), cv2.CAP_GSTREAMER)
    elif kind == "stream":
        # FFmpeg's own read timeout is 30 s: a frozen camera looked healthy for a minute and a half
        timeouts = [
            cv2.CAP_PROP_OPEN_TIMEOUT_MSEC,
            int(cfg.open_timeout_s * 1000),
            cv2.CAP_PROP_READ_TIMEOUT_MSEC,
            int(cfg.stall_s * 1000),
        ]
        cap = _open_stream(str(uri), timeouts, cfg.transport)
    else:
        cap = cv2.VideoCapture(str(uri))
    if cap.isOpened() and kind == "device":
        if cfg.width:
            cap.set(cv2.CAP_PROP_FRAME_WIDTH, cfg.width)
        if cfg.height:
            cap.set(cv2.CAP_PROP_FRAME_HEIGHT, cfg.height)
        if cfg.fps:
            cap.set(cv2.CAP_PROP_FPS, cfg.fps)
    return cap


@SOURCES.register("camera", CameraSourceConfig)
class CameraSource(Source):
    """Reads frames into a FrameSlot; reconnects with capped exponential backoff when the source fails.

    Pacing: a live source (device, stream) is read continuously and the latest frame wins. A file is a
    recording, not a live feed: with `fps: 0` it is read at the model's pace (nothing dropped); with
    `fps > 0` it is played in real time, so a slow model drops frames like it would on a camera.
    """

    def __init__(
        self,
        cfg: CameraSourceConfig,
        *,
        slot: FrameSlot,
        stats: PipelineStats,
        name: str = "edged-source",
        capture_factory: CaptureFactory = open_capture,
        prepare: Preparer | None = None,
        motion: MotionGate | None = None,
    ) -> None:
        super().__init__(name)
        self.cfg = cfg
        self.motion = motion  # None: every frame goes to the model
        self.slot = slot
        self.stats = stats
        self.kind = source_kind(cfg.uri)
        self._open = capture_factory
        self._prepare = prepare
        self._counter = 0
        self._last_frame_mono = time.monotonic()
        self.where = rtsp.redact_uri(str(cfg.uri))  # for logs and status: never a password

    def body(self) -> None:
        """Open, read, and on failure reopen with backoff, until stopped or the file ended for good."""
        backoff = Backoff(self.cfg.reconnect_min_s, self.cfg.reconnect_max_s)
        failures_logged = 0
        try:
            while not self._halt.is_set():
                cap, why = self._try_open()
                if cap is None:
                    failures_logged = self._note_failure(why, failures_logged)
                    self._halt.wait(backoff.next_delay())
                    continue
                self.stats.set_state("running")
                self._last_frame_mono = time.monotonic()
                outcome, frames = self._read_loop(cap)
                cap.release()
                if frames:
                    backoff.reset()
                    failures_logged = 0
                if outcome == "stopped":
                    break
                if outcome == "end" and self.kind == "file":
                    if self.cfg.stop_at_end:
                        log.info(
                            "source %s: end of file after %d frames", self.where, frames,
                            extra={"PIPELINE": self.stats.name},
                        )  # fmt: skip
                        self.stats.set_state("ended")
                        return
                    if self.cfg.loop and frames:
                        continue  # start the file again at once
                why = "end of file" if outcome == "end" else self._read_failure()
                failures_logged = self._note_failure(f"{why} after {frames} frames", failures_logged)
                self._halt.wait(backoff.next_delay())
        finally:
            if self._close_slot:
                self.slot.close()

    def _not_there(self) -> str | None:
        """Why the source cannot be opened without asking OpenCV (whose backends warn at every retry)."""
        if self.kind == "file" and not Path(str(self.cfg.uri)).is_file():
            return "file not found"
        if self.kind == "device" and self._open is open_capture:  # (a test's fake camera has no device)
            return missing_device(self.cfg.uri)
        if self.kind == "gstreamer" and not has_backend("GStreamer"):
            # PyPI's opencv-python(-headless) has no GStreamer; JetPack's python3-opencv does
            return (
                "this OpenCV build has no GStreamer support: install the distribution's python3-opencv "
                "(JetPack ships one) and create the venv with --system-site-packages, or use /dev/videoN"
            )
        return None

    def _try_open(self) -> tuple[Any, str]:
        if (why := self._not_there()) is not None:
            return None, why
        try:
            cap = self._open(self.cfg)
        except (cv2.error, OSError) as exc:
            return None, f"cannot open: {exc}"
        if cap is None or not cap.isOpened():
            if cap is not None:
                cap.release()
            if self.kind == "stream":  # the camera's own answer says more than OpenCV's "not opened"
                return None, f"cannot open: {rtsp.probe(str(self.cfg.uri)) or 'the stream did not open'}"
            return None, "cannot open (device busy or gone, or unsupported format)"
        return cap, ""

    def _read_failure(self) -> str:
        """Why the read loop ended on a live source: a stall (no frame for stall_s), or a read error."""
        gap = time.monotonic() - self._last_frame_mono
        if self.kind == "stream" and gap >= self.cfg.stall_s * STALL_SHARE:
            return f"stalled: no frame for {gap:.1f} s"
        return "read failed"

    def _frame(self, image: npt.NDArray[np.uint8], index: int, ts: float, mono: float | None) -> Frame:
        if self._prepare is None:
            return Frame(image, ts, index, mono=mono)
        # preprocessing here overlaps it with the model run of the previous frame (a pipeline stage)
        t0 = time.perf_counter()
        tensor, token = self._prepare(image)
        return Frame(image, ts, index, tensor, (time.perf_counter() - t0) * 1e3, token, mono=mono)

    def _read(self, cap: Any) -> tuple[bool, Any]:
        """One frame (a stream's read gives up after stall_s); remembers when the last one came.

        A stream's read that blocked for stall_s is a stall even when it returns a frame: with H.264 or H.265,
        FFmpeg's read timeout hands out a frame its decoder buffered before the freeze, once per timeout, and
        fails only at the third (a frozen camera looked alive for 3 x stall_s, its old frames published as
        new). Such a frame is not fresh: it is dropped, and the stream is reopened as stalled."""
        started = time.monotonic()
        ok, image = cap.read()
        if self.kind == "stream" and time.monotonic() - started >= self.cfg.stall_s * STALL_SHARE:
            return False, None
        if ok and image is not None:
            self._last_frame_mono = time.monotonic()
        return bool(ok), image

    def _read_loop(self, cap: Any) -> tuple[ReadOutcome, int]:
        interval = 1.0 / self.cfg.fps if self.cfg.fps > 0 else 0.0
        paced_by_model = self.kind == "file" and interval == 0.0
        next_due = time.monotonic()
        frames = 0
        video_clock = self.kind == "file" and self.cfg.clock == "video"
        opened = time.time()
        video_fps = (float(cap.get(cv2.CAP_PROP_FPS) or 0.0) or 25.0) if video_clock else 0.0
        while not self._halt.is_set():
            if paced_by_model:
                while not self.slot.wait_empty(0.2):
                    if self._halt.is_set():
                        return "stopped", frames
            ok, image = self._read(cap)
            if not ok or image is None:
                return ("end" if self.kind == "file" else "failed"), frames
            index = frames if self.kind == "file" else self._counter
            frames += 1
            self._counter += 1
            if interval:
                now = time.monotonic()
                if self.kind != "file" and now < next_due:
                    continue  # live source faster than the target rate: skip, not a drop
                if self.kind == "file" and now < next_due:
                    self._halt.wait(next_due - now)
                next_due = max(next_due + interval, time.monotonic() - interval)
            ts = opened + index / video_fps if video_clock else time.time()
            mono = None if video_clock else boottime()  # beside the wall time: what corrects it (core/clock.py)
            if self.motion is not None and not self.motion.wanted(image, ts if video_clock else time.monotonic()):
                self.stats.count_motion_skip()  # a still scene: the model does not run
                continue
            dropped = self.slot.put(self._frame(np.asarray(image), index, ts, mono))
            self.stats.count_capture(dropped)
        return "stopped", frames
