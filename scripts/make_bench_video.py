"""Write a deterministic synthetic video (moving shapes over a drifting gradient, sensor noise).

The benchmark decodes this file in every role, so it is an ordinary mp4 (MPEG-4 Part 2, fourcc
'mp4v', what every OpenCV wheel can both write and read) at a camera-like size. Frame i depends only
on the seed and i, so two runs write the same pixels.

    python scripts/make_bench_video.py -o bench-out/bench.mp4 --frames 600 --size 640x480
"""

from __future__ import annotations

import argparse
from pathlib import Path

import cv2
import numpy as np
import numpy.typing as npt

DEFAULT_FRAMES = 600
DEFAULT_SIZE = (640, 480)
DEFAULT_FPS = 30.0
SHAPES = 8


def _parse_size(text: str) -> tuple[int, int]:
    """'640x480' -> (640, 480)."""
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"size must look like 640x480, got {text!r}") from exc
    if w < 16 or h < 16 or w % 2 or h % 2:
        raise argparse.ArgumentTypeError(f"size must be even and at least 16x16, got {text!r}")
    return w, h


class FrameMaker:
    """Frame i of the synthetic scene; deterministic in (seed, i)."""

    def __init__(self, width: int, height: int, seed: int = 0) -> None:
        self.width = width
        self.height = height
        self.seed = seed
        rng = np.random.default_rng(seed)
        self._colors = rng.integers(0, 256, size=(SHAPES, 3))
        self._start = rng.random((SHAPES, 2)) * (width, height)
        self._velocity = (rng.random((SHAPES, 2)) - 0.5) * 16.0  # pixels per frame
        self._radius = rng.integers(12, max(13, min(width, height) // 6), size=SHAPES)
        yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
        self._xx = xx / width
        self._yy = yy / height

    def frame(self, index: int) -> npt.NDArray[np.uint8]:
        """BGR uint8 frame number `index`."""
        phase = index / 60.0
        b = 128 + 100 * np.sin(2 * np.pi * (self._xx + phase))
        g = 128 + 100 * np.sin(2 * np.pi * (self._yy - 0.5 * phase))
        r = 128 + 100 * np.cos(2 * np.pi * (self._xx + self._yy + 0.25 * phase))
        img = np.stack([b, g, r], axis=-1).astype(np.uint8)
        size = np.array([self.width, self.height], dtype=np.float64)
        for k in range(SHAPES):
            # bounce off the borders: position folded into [0, size]
            pos = np.abs((self._start[k] + self._velocity[k] * index) % (2 * size) - size)
            center = (int(pos[0]), int(pos[1]))
            color = tuple(int(c) for c in self._colors[k])
            radius = int(self._radius[k])
            if k % 2:
                cv2.circle(img, center, radius, color, thickness=-1)
            else:
                top_left = (center[0] - radius, center[1] - radius // 2)
                cv2.rectangle(img, top_left, (center[0] + radius, center[1] + radius // 2), color, -1)
        rng = np.random.default_rng((self.seed, index))
        noise = rng.integers(-8, 9, size=img.shape, dtype=np.int16)
        return np.asarray(np.clip(img.astype(np.int16) + noise, 0, 255), dtype=np.uint8)


def write_video(
    path: Path,
    frames: int = DEFAULT_FRAMES,
    size: tuple[int, int] = DEFAULT_SIZE,
    fps: float = DEFAULT_FPS,
    seed: int = 0,
) -> Path:
    """Write `frames` frames of `size` (width, height) to `path` as mp4v; return the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.part.mp4")  # the container is picked from the suffix
    writer = cv2.VideoWriter(str(tmp), cv2.VideoWriter.fourcc(*"mp4v"), fps, size)
    if not writer.isOpened():
        raise RuntimeError(f"OpenCV cannot write mp4v video to {tmp} (no video writer backend?)")
    try:
        maker = FrameMaker(size[0], size[1], seed)
        for i in range(frames):
            writer.write(maker.frame(i))
    finally:
        writer.release()
    tmp.replace(path)  # a half-written file never has the final name
    return path


def count_frames(path: Path) -> int:
    """Frames OpenCV actually decodes from `path` (not the container's claim)."""
    cap = cv2.VideoCapture(str(path))
    try:
        n = 0
        while cap.grab():
            n += 1
        return n
    finally:
        cap.release()


def main() -> int:
    """Command line: write the video and print what was written."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-o", "--output", type=Path, default=Path("bench-out/bench.mp4"))
    parser.add_argument("--frames", type=int, default=DEFAULT_FRAMES)
    parser.add_argument("--size", type=_parse_size, default=DEFAULT_SIZE, help="WIDTHxHEIGHT, default 640x480")
    parser.add_argument("--fps", type=float, default=DEFAULT_FPS, help="frame rate written in the container")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    path = write_video(args.output, args.frames, args.size, args.fps, args.seed)
    w, h = args.size
    print(f"{path}  {count_frames(path)} frames {w}x{h}  {path.stat().st_size / 2**20:.2f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
