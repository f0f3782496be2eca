"""Write the bundled sample video: digits shown one after another, with a per-frame label file.

    python scripts/make_sample_video.py        # writes edged/assets/sample.mp4 and sample.labels.csv

Each digit is held for several frames in one random style (font, colours, background, size), moving a
little from frame to frame, so consecutive frames differ but every frame shows exactly one digit (no
blended transitions). The video is MPEG-4 Part 2 (`mp4v`), which every OpenCV build with FFmpeg reads.
The label file has a `frame,label` header and one row per frame (frames counted from 0).

After writing, the script decodes the video again, checks that it has exactly as many frames as label
rows, and runs the int8 demo model on the decoded frames, preprocessed the way edged does it (the spec
resolved from the model's metadata), reporting the accuracy. The files are kept only when the frame
count matches and the accuracy reaches --min-accuracy (default 0.97); otherwise the script exits 1.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))
import digit_frames

from edged.model.preprocess import Preprocessor, PreprocessSpec

REPO = Path(__file__).resolve().parent.parent
ASSETS = REPO / "edged" / "assets"
VIDEO_FILE = "sample.mp4"
LABELS_FILE = "sample.labels.csv"
WIDTH, HEIGHT = 128, 96
FPS = 10.0
FRAMES_PER_DIGIT = 5
ROUNDS = 2  # every digit appears this many times: 2 x 10 digits x 5 frames = 100 frames, 10 s


def digit_order(rng: np.random.Generator, rounds: int) -> list[int]:
    """`rounds` shuffled passes over 0..9, never the same digit twice in a row."""
    order: list[int] = []
    for _ in range(rounds):
        perm = [int(d) for d in rng.permutation(10)]
        if order and perm[0] == order[-1]:
            perm[0], perm[-1] = perm[-1], perm[0]
        order += perm
    return order


def render_video(seed: int, rounds: int, per_digit: int) -> tuple[list[digit_frames.Frame], list[int]]:
    """The frames (BGR uint8) and their labels."""
    rng = np.random.default_rng(seed)
    frames: list[digit_frames.Frame] = []
    labels: list[int] = []
    for digit in digit_order(rng, rounds):
        # the video codec does the compressing here, so no JPEG round trip on top
        style = dataclasses.replace(digit_frames.random_style(rng, digit, WIDTH, HEIGHT), jpeg_quality=0)
        for k in range(per_digit):
            if k:
                style = digit_frames.jitter(style, rng)
            frames.append(digit_frames.draw(style, rng))
            labels.append(digit)
    return frames, labels


def write_video(path: Path, frames: list[digit_frames.Frame]) -> None:
    """Encode `frames` as mp4v at FPS."""
    fourcc = cv2.VideoWriter.fourcc(*"mp4v")
    writer = cv2.VideoWriter(str(path), fourcc, FPS, (WIDTH, HEIGHT))
    if not writer.isOpened():
        raise RuntimeError(f"OpenCV cannot write {path} with the mp4v codec (no FFmpeg backend?)")
    try:
        for frame in frames:
            writer.write(frame)
    finally:
        writer.release()


def write_labels(path: Path, labels: list[int]) -> None:
    """`frame,label` CSV, one row per frame."""
    with path.open("w", newline="") as fh:
        out = csv.writer(fh, lineterminator="\n")
        out.writerow(["frame", "label"])
        out.writerows(enumerate(labels))


def read_labels(path: Path) -> list[int]:
    """Labels from a `frame,label` CSV, checking that the frame numbers run 0, 1, 2, ..."""
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    for i, row in enumerate(rows):
        if int(row["frame"]) != i:
            raise ValueError(f"{path}: row {i + 2} has frame {row['frame']}, expected {i}")
    return [int(row["label"]) for row in rows]


def decode(path: Path) -> list[digit_frames.Frame]:
    """Every frame cv2.VideoCapture returns for `path`."""
    cap = cv2.VideoCapture(str(path))
    if not cap.isOpened():
        raise RuntimeError(f"OpenCV cannot open {path}")
    frames = []
    try:
        while True:
            ok, frame = cap.read()
            if not ok:
                break
            frames.append(np.asarray(frame, dtype=np.uint8))
    finally:
        cap.release()
    return frames


def model_accuracy(model: Path, frames: list[digit_frames.Frame], labels: list[int]) -> tuple[float, list[int]]:
    """Top-1 accuracy of `model` on `frames`, preprocessed from the model's own metadata; also the misses."""
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    meta = sess.get_modelmeta().custom_metadata_map
    spec = PreprocessSpec.resolve(None, meta, list(inp.shape), inp.type)
    pre = Preprocessor(spec)
    preds = [int(np.argmax(sess.run(None, {inp.name: pre(f)})[0])) for f in frames]
    misses = [i for i, (p, y) in enumerate(zip(preds, labels, strict=True)) if p != y]
    return 1.0 - len(misses) / len(labels), misses


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", type=Path, default=ASSETS, help="where sample.mp4 and its labels go")
    p.add_argument("--model", type=Path, default=ASSETS / "digits.int8.onnx", help="model to check with")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--rounds", type=int, default=ROUNDS, help="passes over the ten digits")
    p.add_argument("--frames-per-digit", type=int, default=FRAMES_PER_DIGIT)
    p.add_argument("--min-accuracy", type=float, default=0.97, help="on the decoded video, to keep it")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Render, encode, decode again, check; move the two files into place when the checks pass."""
    args = parse_args(argv)
    frames, labels = render_video(args.seed, args.rounds, args.frames_per_digit)
    with tempfile.TemporaryDirectory(prefix="sample_video-") as tmp:
        video, label_file = Path(tmp) / VIDEO_FILE, Path(tmp) / LABELS_FILE
        write_video(video, frames)
        write_labels(label_file, labels)

        decoded, rows = decode(video), read_labels(label_file)
        print(
            f"{VIDEO_FILE}: {len(frames)} frames written, {len(decoded)} decoded, {len(rows)} label rows, "
            f"{WIDTH}x{HEIGHT} at {FPS:g} fps ({len(decoded) / FPS:.1f} s), {video.stat().st_size} bytes"
        )
        if not len(decoded) == len(rows) == len(frames):
            print("frame count mismatch: not keeping the video", file=sys.stderr)
            return 1
        diff = np.mean([np.abs(a.astype(np.int16) - b).mean() for a, b in zip(frames, decoded, strict=True)])
        print(f"mean |rendered - decoded| per pixel: {diff:.2f} (codec loss)")
        acc, misses = model_accuracy(args.model, decoded, rows)
        print(f"{args.model.name} top-1 accuracy on the decoded video: {acc:.4f} ({len(misses)} misses)")
        if misses:
            print(f"  missed frames: {misses}")
        if acc < args.min_accuracy:
            print(f"accuracy below {args.min_accuracy}: not keeping the video", file=sys.stderr)
            return 1
        args.out_dir.mkdir(parents=True, exist_ok=True)
        for f in (video, label_file):
            shutil.copyfile(f, args.out_dir / f.name)
    print(f"wrote {args.out_dir / VIDEO_FILE} and {args.out_dir / LABELS_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
