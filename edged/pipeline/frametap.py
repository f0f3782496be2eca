"""Copies of the frames a running pipeline's model sees: for a remote `record` and a rollout's validation.

The tap sits in the inference worker's turn (capture order), before the publish filter, so it sees every
frame the model ran on. Disarmed it costs one attribute read per frame. Armed, it copies one frame in
`every` until it has `frames` of them or `max_bytes` worth, then wakes whoever waits.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import numpy.typing as npt

from edged.core.errors import EdgedError

FRAMES_KEY = "frames"  # the .npz layout quantize --calib and validate --data read (edged/tools/frames.py)
TAP_MAX_BYTES = 256 * 2**20


class FrameTap:
    """One recording at a time per pipeline."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._want = 0
        self._every = 1
        self._seen = 0
        self._bytes = 0
        self._max_bytes = TAP_MAX_BYTES
        self._kept: list[npt.NDArray[np.uint8]] = []
        self._cancelled = False

    def arm(self, frames: int, every: int = 1, max_bytes: int = TAP_MAX_BYTES) -> None:
        """Start keeping frames (EdgedError when a recording is already in progress)."""
        with self._lock:
            if self._want:
                raise EdgedError("a recording is already in progress on this pipeline")
            self._kept, self._seen, self._bytes = [], 0, 0
            self._every, self._max_bytes = max(1, every), max_bytes
            self._done.clear()
            self._cancelled = False
            self._want = max(1, frames)

    def offer(self, image: npt.NDArray[np.uint8]) -> None:
        """A frame the model ran on (inference worker, in capture order)."""
        if not self._want:
            return
        with self._lock:
            if not self._want:
                return
            self._seen += 1
            if (self._seen - 1) % self._every:
                return
            self._kept.append(image.copy())
            self._bytes += image.nbytes
            if len(self._kept) >= self._want or self._bytes >= self._max_bytes:
                self._want = 0
                self._done.set()

    def cancel(self) -> None:
        """End a recording in progress now (the daemon stops): the waiter returns what it has."""
        self._cancelled = True
        self._done.set()

    def wait(self, timeout: float) -> list[npt.NDArray[np.uint8]]:
        """The frames kept once the recording is complete, or what it has after `timeout` (then disarmed)."""
        self._done.wait(timeout)
        with self._lock:
            self._want = 0
            kept, self._kept = self._kept, []
            return kept

    def record(self, frames: int, every: int, timeout: float, pipeline: str) -> list[npt.NDArray[np.uint8]]:
        """Arm, wait, and return what came (EdgedError when not one frame did within `timeout`)."""
        self.arm(frames, every)
        kept = self.wait(timeout)
        if not kept and self._cancelled:
            raise EdgedError(f"pipeline {pipeline}: the daemon stopped before a frame came")
        if not kept:
            raise EdgedError(f"pipeline {pipeline} gave no frame within {timeout:g} s")
        return kept


def save_frames(path: Path, frames: list[npt.NDArray[np.uint8]] | npt.NDArray[np.uint8]) -> Path:
    """Save raw BGR frames as a `.npz` set that `--calib`/`--data` read back."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)  # frames of the scene: not for others
    os.fchmod(fd, 0o640)  # whatever the umask
    with os.fdopen(fd, "wb") as out:
        np.savez_compressed(out, frames=np.asarray(frames, dtype=np.uint8))  # key: FRAMES_KEY
    return path
