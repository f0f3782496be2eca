"""A street scene made here, with ground truth, and the detector that finds its objects.

    python scripts/vision_scene.py OUT_DIR [--objects 24] [--seconds 360]

writes OUT_DIR/scene.avi (MJPG 320x240, 10 frames/s), OUT_DIR/scene.truth.json,
OUT_DIR/scene-detector.onnx and OUT_DIR/scene-marks.onnx. Used by benchmarks/vision.py and the tests.

The scene: a still, textured background with camera noise (the motion gate must see stillness in it),
and 40x40 objects, red "car"s and blue "person"s, that enter from the left or the right in a lane, cross,
and leave; some park in the middle for a while (a `stationary` event) and drive on. Objects in one lane
never overlap in time. Each object carries a 10x10 mark in its middle, white ("light") or black
("dark"), for the second model. The truth holds, per object, its label, mark, its box in every frame it
is in, and when it entered and left (the first and last frame with at least half of it in view).

The detector is a small convolutional network with hand-set weights, a real ONNX graph that ONNX
Runtime runs like any other: colour channels (red over green and blue; blue over red and green), three
3x3 smoothing convolutions over 16 channels (the backbone; their cost per frame is that of a small
real detector at this input size), and a 40x40 box filter at stride 4 whose response is the share of a
box covered by the colour (not by the mark, nor by the edges the smoothing blurs: a box on an object
scores about 0.7), cubed (so a box half off the object scores 0.1, not 0.5, and NMS keeps one box per
object): a YOLOv8-style head of [cx, cy, w, h, car, person] for 5,041 anchors.

The second model, for the crops, classifies the mark: the mean brightness of the middle of a 32x32
crop against 0.5, through a softmax over ["light", "dark"], with a dynamic batch dimension (edged runs
all crops of a frame in one batch).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edged.model.preprocess import PreprocessSpec

WIDTH, HEIGHT, FPS = 320, 240, 10.0
SIZE = 40  # objects are SIZE x SIZE pixels
INPUT = 320  # the detector's input is INPUT x INPUT (the frame letterboxed: no scaling, bars top and bottom)
STRIDE = 4
CHANNELS = 16
LABELS = ["car", "person"]
MARKS = ["light", "dark"]
MARK = 10  # the mark is MARK x MARK pixels in the middle of an object
CROP = 32  # the mark model's input is CROP x CROP
COLOURS = {"car": (40, 40, 220), "person": (220, 60, 40)}  # BGR
LANES = (32, 100, 168)  # top y of each lane (on the detector's anchor grid: y + 40 bars is a multiple of 4)
SPEED = 160.0  # pixels per second (16 per frame)


@dataclass
class Trip:
    """One object's way through the scene."""

    label: str
    lane: int
    start: float  # seconds
    rightwards: bool
    park_s: float  # 0: drives through

    def x_at(self, t: float) -> float | None:
        """Its left edge at `t`, None when it is not in the picture."""
        dt = t - self.start
        half = (WIDTH + SIZE) / 2 / SPEED  # time to reach the middle
        if dt < 0:
            return None
        if dt > half:
            dt = half if dt < half + self.park_s else dt - self.park_s
        x = -SIZE + SPEED * dt
        if x > WIDTH:
            return None
        return x if self.rightwards else WIDTH - SIZE - x

    def end(self) -> float:
        """When it has left."""
        return self.start + (WIDTH + SIZE) / SPEED + self.park_s


def plan(objects: int, seconds: float, seed: int = 7) -> list[Trip]:
    """`objects` trips spread over `seconds`, no two in one lane at once."""
    rng = np.random.default_rng(seed)
    free = [0.0] * len(LANES)
    gap = seconds / objects
    trips = []
    for i in range(objects):
        start = 1.0 + i * gap + float(rng.uniform(0, gap * 0.3))
        lane = int(np.argmin(free))
        start = max(start, free[lane] + 0.5)
        park = float(rng.choice([0.0, 0.0, 20.0]))
        trip = Trip(LABELS[i % 2], lane, start, bool(i % 3), park)
        free[lane] = trip.end()
        trips.append(trip)
    return trips


def background(seed: int = 3) -> npt.NDArray[np.uint8]:
    """A grey street: texture that never moves."""
    rng = np.random.default_rng(seed)
    base = rng.integers(95, 150, size=(HEIGHT // 8, WIDTH // 8, 1), dtype=np.uint8)
    grey = cv2.resize(base, (WIDTH, HEIGHT), interpolation=cv2.INTER_NEAREST)
    return np.repeat(grey[:, :, None], 3, axis=2)


def visible(x: float) -> bool:
    """At least half of the object in view."""
    return -SIZE / 2 <= x <= WIDTH - SIZE / 2


def write_scene(out: Path, objects: int, seconds: float) -> tuple[Path, Path]:
    """The video and its truth file."""
    trips = plan(objects, seconds)
    frames = int(max(seconds, max(t.end() for t in trips) + 12.0) * FPS)  # the last one has long left
    still = background()
    rng = np.random.default_rng(11)
    video = out / "scene.avi"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter.fourcc(*"MJPG"), FPS, (WIDTH, HEIGHT))
    if not writer.isOpened():
        raise SystemExit("OpenCV cannot write MJPG video here")
    truth: list[dict[str, Any]] = [
        {"id": i + 1, "label": t.label, "mark": MARKS[i % 2], "parks_s": t.park_s, "boxes": {}}
        for i, t in enumerate(trips)
    ]
    for f in range(frames):
        t = f / FPS
        image = np.clip(still.astype(np.int16) + rng.integers(-4, 5, size=still.shape), 0, 255).astype(np.uint8)
        for trip, obj in zip(trips, truth, strict=True):
            x = trip.x_at(t)
            if x is None:
                continue
            y = LANES[trip.lane]
            x0, x1 = max(0, round(x)), min(WIDTH, round(x) + SIZE)
            if x1 > x0:
                image[y : y + SIZE, x0:x1] = COLOURS[trip.label]
                m0, m1 = round(x) + (SIZE - MARK) // 2, round(x) + (SIZE + MARK) // 2
                if m0 >= 0 and m1 <= WIDTH:
                    image[y + (SIZE - MARK) // 2 : y + (SIZE + MARK) // 2, m0:m1] = 255 if obj["mark"] == "light" else 0
            if visible(x):
                obj["boxes"][f] = [round(x, 1), y, round(x, 1) + SIZE, y + SIZE]
        writer.write(image)
    writer.release()
    for obj in truth:
        seen = sorted(obj["boxes"])
        obj["enter_s"], obj["leave_s"] = seen[0] / FPS, seen[-1] / FPS
    path = out / "scene.truth.json"
    path.write_text(json.dumps({"fps": FPS, "frames": frames, "objects": truth}), encoding="utf-8")
    return video, path


def _save(graph: onnx.GraphProto, path: Path, spec: PreprocessSpec, labels: list[str]) -> Path:
    """The model with edged's metadata (its preprocessing, name and labels), checked and written."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    meta = {"edged.preprocess": spec.to_metadata(), "edged.name": graph.name, "edged.labels": json.dumps(labels)}
    helper.set_model_props(model, meta)
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def _conv(name: str, x: str, w: npt.NDArray[np.float32], inits: list[onnx.TensorProto], **attrs: Any) -> onnx.NodeProto:
    inits.append(numpy_helper.from_array(w.astype(np.float32), f"{name}_w"))
    return helper.make_node("Conv", [x, f"{name}_w"], [name], **attrs)


def make_detector(path: Path) -> Path:
    """The scene's detector (see the module docstring)."""
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []
    colour = np.zeros((CHANNELS, 3, 1, 1), np.float32)  # input is RGB
    colour[0, :, 0, 0] = [1, -1, 0]  # red over green
    colour[1, :, 0, 0] = [1, 0, -1]  # red over blue
    colour[2, :, 0, 0] = [-1, 0, 1]  # blue over red
    colour[3, :, 0, 0] = [0, -1, 1]  # blue over green
    inits.append(numpy_helper.from_array(np.full(CHANNELS, -0.3, np.float32), "colour_b"))
    inits.append(numpy_helper.from_array(colour, "colour_w"))
    nodes += [
        helper.make_node("Conv", ["image", "colour_w", "colour_b"], ["colour"]),
        helper.make_node("Relu", ["colour"], ["c0"]),
    ]
    smooth = np.zeros((CHANNELS, CHANNELS, 3, 3), np.float32)
    for c in range(CHANNELS):
        smooth[c, c] = 1.0 / 9.0
    x = "c0"
    for i in range(1, 4):
        nodes.append(_conv(f"s{i}", x, smooth, inits, pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"s{i}"], [f"c{i}"]))
        x = f"c{i}"
    head = np.zeros((2, CHANNELS, 1, 1), np.float32)
    head[0, 0:2, 0, 0] = 1.6  # car: red over both
    head[1, 2:4, 0, 0] = 1.6  # person: blue over both
    nodes.append(_conv("maps", x, head, inits))
    inits += [numpy_helper.from_array(np.float32(0), "zero"), numpy_helper.from_array(np.float32(1), "one")]
    nodes.append(helper.make_node("Clip", ["maps", "zero", "one"], ["cover"]))
    box = np.full((2, 1, SIZE, SIZE), 1.0 / (SIZE * SIZE), np.float32)
    nodes.append(_conv("share", "cover", box, inits, strides=[STRIDE, STRIDE], group=2))
    side = (INPUT - SIZE) // STRIDE + 1
    n = side * side
    grid = np.arange(side, dtype=np.float32) * STRIDE + SIZE / 2
    cy, cx = np.meshgrid(grid, grid, indexing="ij")
    boxes = np.stack([cx.ravel(), cy.ravel(), np.full(n, SIZE), np.full(n, SIZE)])[None].astype(np.float32)
    inits += [numpy_helper.from_array(boxes, "anchors"), numpy_helper.from_array(np.asarray([1, 2, n]), "flat")]
    nodes += [
        helper.make_node("Mul", ["share", "share"], ["share2"]),
        helper.make_node("Mul", ["share2", "share"], ["share3"]),
        helper.make_node("Reshape", ["share3", "flat"], ["scores"]),
        helper.make_node("Concat", ["anchors", "scores"], ["output0"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "scene-detector",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, INPUT, INPUT])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, 4 + len(LABELS), n])],
        initializer=inits,
    )
    return _save(graph, path, PreprocessSpec(size=(INPUT, INPUT), resize="letterbox"), LABELS)


def make_mark_model(path: Path, batch: int | str = "batch") -> Path:
    """The second model: light or dark mark in the middle of a crop (see the module docstring); `batch`
    1 makes its batch dimension fixed (one crop a run)."""
    lo, hi = CROP // 2 - 4, CROP // 2 + 4
    inits = [
        numpy_helper.from_array(np.asarray([lo, lo], np.int64), "starts"),
        numpy_helper.from_array(np.asarray([hi, hi], np.int64), "ends"),
        numpy_helper.from_array(np.asarray([2, 3], np.int64), "axes"),
        numpy_helper.from_array(np.float32(0.5), "half"),
        numpy_helper.from_array(np.float32(10.0), "gain"),
        numpy_helper.from_array(np.asarray([1], np.int64), "one_axis"),
    ]
    nodes = [
        helper.make_node("Slice", ["crop", "starts", "ends", "axes"], ["middle"]),
        helper.make_node("ReduceMean", ["middle"], ["mean"], axes=[1, 2, 3], keepdims=0),
        helper.make_node("Unsqueeze", ["mean", "one_axis"], ["m1"]),
        helper.make_node("Sub", ["m1", "half"], ["light"]),
        helper.make_node("Neg", ["light"], ["dark"]),
        helper.make_node("Concat", ["light", "dark"], ["logits"], axis=1),
        helper.make_node("Mul", ["logits", "gain"], ["scaled"]),
        helper.make_node("Softmax", ["scaled"], ["probs"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "scene-marks",
        [helper.make_tensor_value_info("crop", TensorProto.FLOAT, [batch, 3, CROP, CROP])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [batch, len(MARKS)])],
        initializer=inits,
    )
    return _save(graph, path, PreprocessSpec(size=(CROP, CROP), resize="stretch"), MARKS)


def main(argv: list[str] | None = None) -> int:
    """Write the scene, its truth and the detector into OUT_DIR."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--objects", type=int, default=24)
    parser.add_argument("--seconds", type=float, default=360.0)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    video, truth = write_scene(args.out, args.objects, args.seconds)
    detector = make_detector(args.out / "scene-detector.onnx")
    marks = make_mark_model(args.out / "scene-marks.onnx")
    print(f"wrote {video}, {truth}, {detector}, {marks}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
