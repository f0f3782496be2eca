"""Build a MobileNetV2-sized classifier with random weights, then quantize it to int8 (QDQ).

The benchmark needs a model with the real cost of MobileNetV2 at 224x224 (about 300 MMACs, 3.5 M
parameters), not a real classifier: it measures throughput, never accuracy. So the topology is the
real one (stem 3x3/2 conv to 32 channels, 17 inverted residual blocks with expansion 6, depthwise 3x3
convolutions, ReLU6 as Clip(0, 6), residual Adds, 1x1 conv to 1280, global average pool, Gemm to
1000), BatchNorm folded into the conv biases as a deployed model has it, and the weights are seeded
random numbers with a He-like scale so activations neither explode nor vanish through the 50-odd
layers (which would make the int8 calibration degenerate).

Nothing is downloaded and torch is not needed: the graph is written with `onnx.helper`, opset 17.

    python scripts/make_bench_model.py -o bench-out

writes `mobilenetv2.fp32.onnx` and `mobilenetv2.int8.onnx` with the `edged.preprocess` and
`edged.name` metadata, so edged needs no preprocess section for them.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
INPUT_NAME = "image"
OUTPUT_NAME = "logits"
NUM_CLASSES = 1000
IMAGE_SIZE = 224
MODEL_NAME = "mobilenetv2-random"
FP32_FILE = "mobilenetv2.fp32.onnx"
INT8_FILE = "mobilenetv2.int8.onnx"
DEFAULT_OUT_DIR = Path("bench-out")
PREPROCESS: dict[str, object] = {
    "size": [IMAGE_SIZE, IMAGE_SIZE],
    "resize": "stretch",
    "color": "rgb",
    "layout": "nchw",
    "dtype": "float32",
    "scale": 0.00392156862745098,
    "mean": [0.485, 0.456, 0.406],
    "std": [0.229, 0.224, 0.225],
    "pad_value": 114,
}
# MobileNetV2 (Sandler et al. 2018, table 2): expansion t, output channels c, repeats n, first stride s.
INVERTED_RESIDUAL_SETTING: tuple[tuple[int, int, int, int], ...] = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)
STEM_CHANNELS = 32
LAST_CHANNELS = 1280
# Scale of a residual branch's projection weights (a folded BatchNorm with a small gamma, as trained
# MobileNets have): keeps the variance of the residual stream from doubling at every Add.
RESIDUAL_GAIN = 0.5


@dataclass
class GraphBuilder:
    """Accumulates nodes and initializers; every layer gets a unique, readable name."""

    rng: np.random.Generator
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    initializers: list[onnx.TensorProto] = field(default_factory=list)
    count: int = 0

    def _name(self, kind: str) -> str:
        self.count += 1
        return f"{kind}_{self.count}"

    def _const(self, name: str, array: npt.NDArray[np.floating[Any]]) -> str:
        self.initializers.append(numpy_helper.from_array(array.astype(np.float32), name))
        return name

    def conv(
        self,
        x: str,
        in_ch: int,
        out_ch: int,
        kernel: int,
        *,
        stride: int = 1,
        groups: int = 1,
        gain: float = 2.0,
    ) -> str:
        """Conv with bias (BatchNorm folded in); weights ~ N(0, gain / fan_in)."""
        name = self._name("conv")
        fan_in = (in_ch // groups) * kernel * kernel
        std = float(np.sqrt(gain / fan_in))
        w = self.rng.normal(0.0, std, size=(out_ch, in_ch // groups, kernel, kernel))
        b = self.rng.normal(0.0, 0.01, size=(out_ch,))
        pad = kernel // 2
        self.nodes.append(
            helper.make_node(
                "Conv",
                [x, self._const(f"{name}.weight", w), self._const(f"{name}.bias", b)],
                [name],
                name=name,
                kernel_shape=[kernel, kernel],
                strides=[stride, stride],
                pads=[pad, pad, pad, pad],
                group=groups,
            )
        )
        return name

    def relu6(self, x: str) -> str:
        """ReLU6 as Clip(x, 0, 6), the form the exporters write and ORT fuses into Conv."""
        name = self._name("relu6")
        lo = self._const(f"{name}.min", np.array(0.0, dtype=np.float32))
        hi = self._const(f"{name}.max", np.array(6.0, dtype=np.float32))
        self.nodes.append(helper.make_node("Clip", [x, lo, hi], [name], name=name))
        return name

    def add(self, a: str, b: str) -> str:
        """Residual Add."""
        name = self._name("add")
        self.nodes.append(helper.make_node("Add", [a, b], [name], name=name))
        return name

    def inverted_residual(self, x: str, in_ch: int, out_ch: int, stride: int, expansion: int) -> str:
        """1x1 expand + ReLU6, 3x3 depthwise + ReLU6, 1x1 linear projection, Add when shapes allow."""
        hidden = in_ch * expansion
        h = x
        if expansion != 1:
            h = self.relu6(self.conv(h, in_ch, hidden, 1))
        h = self.relu6(self.conv(h, hidden, hidden, 3, stride=stride, groups=hidden))
        residual = stride == 1 and in_ch == out_ch
        gain = RESIDUAL_GAIN**2 if residual else 1.0
        h = self.conv(h, hidden, out_ch, 1, gain=gain)
        return self.add(x, h) if residual else h

    def head(self, x: str, in_ch: int) -> str:
        """GlobalAveragePool, Flatten, Gemm to the class logits."""
        pooled = self._name("gap")
        self.nodes.append(helper.make_node("GlobalAveragePool", [x], [pooled], name=pooled))
        flat = self._name("flatten")
        self.nodes.append(helper.make_node("Flatten", [pooled], [flat], name=flat, axis=1))
        name = "classifier"
        w = self.rng.normal(0.0, np.sqrt(1.0 / in_ch), size=(NUM_CLASSES, in_ch))
        b = np.zeros((NUM_CLASSES,), dtype=np.float32)
        self.nodes.append(
            helper.make_node(
                "Gemm",
                [flat, self._const(f"{name}.weight", w), self._const(f"{name}.bias", b)],
                [OUTPUT_NAME],
                name=name,
                transB=1,
            )
        )
        return OUTPUT_NAME


def build_mobilenetv2(seed: int = 0) -> onnx.ModelProto:
    """The MobileNetV2 (width 1.0, 224x224) graph with seeded random weights, opset 17."""
    g = GraphBuilder(rng=np.random.default_rng(seed))
    x = g.relu6(g.conv(INPUT_NAME, 3, STEM_CHANNELS, 3, stride=2))
    channels = STEM_CHANNELS
    for expansion, out_ch, repeats, first_stride in INVERTED_RESIDUAL_SETTING:
        for i in range(repeats):
            x = g.inverted_residual(x, channels, out_ch, first_stride if i == 0 else 1, expansion)
            channels = out_ch
    x = g.relu6(g.conv(x, channels, LAST_CHANNELS, 1))
    g.head(x, LAST_CHANNELS)
    graph = helper.make_graph(
        g.nodes,
        "mobilenetv2",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, [1, 3, IMAGE_SIZE, IMAGE_SIZE])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, [1, NUM_CLASSES])],
        g.initializers,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="edged-make-bench-model"
    )
    model.ir_version = 8  # opset 17's IR; loads on every ONNX Runtime edged supports
    onnx.checker.check_model(model, full_check=True)
    return model


def set_metadata(model: onnx.ModelProto) -> None:
    """Write (or overwrite) the `edged.preprocess` and `edged.name` metadata entries."""
    wanted = {"edged.preprocess": json.dumps(PREPROCESS), "edged.name": MODEL_NAME}
    kept = [p for p in model.metadata_props if p.key not in wanted]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    for key, value in wanted.items():
        model.metadata_props.append(onnx.StringStringEntryProto(key=key, value=value))


def synthetic_image(rng: np.random.Generator, width: int = 640, height: int = 480) -> npt.NDArray[np.uint8]:
    """A camera-like BGR frame: smooth colour gradients, a few filled shapes, sensor noise."""
    low = rng.integers(0, 256, size=(6, 8, 3), dtype=np.uint8)
    img = cv2.resize(low, (width, height), interpolation=cv2.INTER_CUBIC)
    for _ in range(int(rng.integers(2, 7))):
        color = tuple(int(c) for c in rng.integers(0, 256, size=3))
        cx, cy = int(rng.integers(0, width)), int(rng.integers(0, height))
        size = int(rng.integers(20, min(width, height) // 2))
        if rng.random() < 0.5:
            cv2.circle(img, (cx, cy), size // 2, color, thickness=-1)
        else:
            cv2.rectangle(img, (cx - size // 2, cy - size // 3), (cx + size // 2, cy + size // 3), color, -1)
    noise = rng.normal(0.0, 6.0, size=img.shape)
    return np.asarray(np.clip(img.astype(np.float32) + noise, 0, 255), dtype=np.uint8)


def make_preprocessor() -> Callable[[npt.NDArray[np.uint8]], npt.NDArray[np.float32]]:
    """The preprocessing the metadata describes, done by edged's own Preprocessor."""
    from edged.model.preprocess import Preprocessor, PreprocessSpec

    spec = PreprocessSpec.resolve(
        None,
        {"edged.preprocess": json.dumps(PREPROCESS)},
        [1, 3, IMAGE_SIZE, IMAGE_SIZE],
        "tensor(float)",
    )
    return Preprocessor(spec)


class SyntheticCalibration:
    """onnxruntime.quantization CalibrationDataReader over seeded synthetic images."""

    def __init__(self, count: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        preprocess = make_preprocessor()
        self._batches = [preprocess(synthetic_image(rng)) for _ in range(count)]
        self._iter: Iterator[npt.NDArray[np.float32]] = iter(self._batches)

    def get_next(self) -> dict[str, npt.NDArray[np.float32]] | None:
        """The next calibration input, or None when done."""
        batch = next(self._iter, None)
        return None if batch is None else {INPUT_NAME: batch}

    def rewind(self) -> None:
        """Start over (some calibrators read the data twice)."""
        self._iter = iter(self._batches)


def quantize(fp32_path: Path, int8_path: Path, calibration_images: int, seed: int, activations: str = "int8") -> None:
    """Static quantization: QDQ format, per-channel int8 weights, MinMax calibration.

    Activations are int8 (S8S8, ONNX Runtime's default for QDQ) unless `activations` is "uint8"
    (U8S8, the older CPU default; about twice as fast on an x86 CPU with VNNI in our runs).
    """
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    with tempfile.TemporaryDirectory(prefix="edged-quant-") as tmp:
        prepared = Path(tmp) / "prepared.onnx"
        # shape inference, as ORT recommends; no ORT graph rewrite (it adds contrib opset imports)
        quant_pre_process(fp32_path, prepared, skip_optimization=True)
        raw = Path(tmp) / "int8.onnx"
        quantize_static(
            prepared,
            raw,
            SyntheticCalibration(calibration_images, seed + 1),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QUInt8 if activations == "uint8" else QuantType.QInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
        )
        model = onnx.load(raw)
    set_metadata(model)
    onnx.save(model, int8_path)


def build(
    out_dir: Path = DEFAULT_OUT_DIR, seed: int = 0, calibration_images: int = 32, activations: str = "int8"
) -> tuple[Path, Path]:
    """Write the fp32 and int8 models into out_dir; return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    fp32_path = out_dir / FP32_FILE
    int8_path = out_dir / INT8_FILE
    model = build_mobilenetv2(seed)
    set_metadata(model)
    onnx.save(model, fp32_path)
    quantize(fp32_path, int8_path, calibration_images, seed, activations)
    return fp32_path, int8_path


def main() -> int:
    """Command line: build both models and print their sizes."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-o", "--out-dir", type=Path, default=DEFAULT_OUT_DIR, help="default: bench-out/")
    parser.add_argument("--seed", type=int, default=0, help="weights and calibration seed")
    parser.add_argument("--calibration-images", type=int, default=32, help="synthetic images to calibrate on")
    parser.add_argument(
        "--activations",
        choices=("int8", "uint8"),
        default="int8",
        help="activation type of the int8 model: int8 (S8S8, default) or uint8 (U8S8)",
    )
    args = parser.parse_args()
    for path in build(args.out_dir, args.seed, args.calibration_images, args.activations):
        print(f"{path}  {path.stat().st_size / 2**20:.2f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
