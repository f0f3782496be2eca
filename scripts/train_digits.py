"""Train the bundled demo model: a small CNN that reads one printed digit in a camera frame.

The training frames come from `digit_frames` (synthetic, seeded; nothing is downloaded) and become model
inputs through edged's own `Preprocessor`, so training and the daemon feed the network identical tensors.
The trained network is written as ONNX with `onnx.helper` (Conv/Relu/MaxPool/Flatten/Gemm, opset 17,
BatchNorm folded into the convolutions), quantized to int8 with ONNX Runtime (QDQ, per-channel weights,
symmetric int8 activations, so TensorRT can take it too), and both models get the `edged.*` metadata
the daemon reads (preprocessing recipe, labels, name).

    python scripts/train_digits.py                # writes edged/assets/digits.{fp32,int8}.onnx

The models are built in a temporary folder and evaluated with ONNX Runtime on a held-out generated set;
they are copied to the output folder only when every target holds (see `Targets`), and the script exits
non-zero otherwise. Reruns with the same seeds, library versions and thread count give byte-identical
models (the `edged.created` date aside). About 2.5 minutes on two cores; `--quick` is a 30 s smoke run.
Needs the `train` extra (torch, onnx).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import numpy.typing as npt
import onnx
import onnxruntime as ort
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import digit_frames
from int8_export import quantize, set_metadata

from edged.model.preprocess import Preprocessor, PreprocessSpec

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT_DIR = REPO / "edged" / "assets"
FP32_FILE = "digits.fp32.onnx"
INT8_FILE = "digits.int8.onnx"
MODEL_NAME = "digits"
LABELS = [str(d) for d in range(10)]
OPSET = 17
INPUT_NAME = "image"
OUTPUT_NAME = "logits"
FRAME_SIZE = (128, 96)  # width, height of the generated frames (and of the sample video)
SPEC = PreprocessSpec(
    size=(48, 36),  # width, height: the frame's 4:3, so "stretch" keeps the digits' shape
    resize="stretch",
    interpolation="area",  # the better downscaler; the daemon reads it from the model's metadata
    color="rgb",
    layout="nchw",
    dtype="float32",
    scale=1.0 / 255.0,
    mean=(0.5, 0.5, 0.5),
    std=(0.25, 0.25, 0.25),
)
CHANNELS = (16, 32, 64)  # three conv blocks, each halving the resolution
HIDDEN = 64
CHUNK = 1000  # frames per generation task; seeds are per chunk, so worker count does not matter
# SeedSequence streams, so the three sets never share frames
TRAIN_STREAM, CALIB_STREAM, EVAL_STREAM = 0, 1, 2

Array = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Targets:
    """What the script insists on before it writes the models."""

    fp32_accuracy: float = 0.98
    int8_agreement: float = 0.99
    size_ratio: float = 0.35  # int8 file size / fp32 file size, at most
    max_export_error: float = 1e-3  # |torch logits - ONNX fp32 logits|, at most


class DigitNet(nn.Module):
    """Three conv-BN-ReLU-maxpool blocks and a two-layer classifier head (~120k parameters)."""

    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c_in = 3
        for c_out in CHANNELS:
            layers += [
                nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
                nn.BatchNorm2d(c_out),
                nn.ReLU(),
                nn.MaxPool2d(2),
            ]
            c_in = c_out
        self.features = nn.Sequential(*layers)
        w, h = SPEC.size
        flat = CHANNELS[-1] * (h // 2 ** len(CHANNELS)) * (w // 2 ** len(CHANNELS))
        self.fc1 = nn.Linear(flat, HIDDEN)
        self.dropout = nn.Dropout(0.2)
        self.fc2 = nn.Linear(HIDDEN, len(LABELS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits for a (N, 3, H, W) batch."""
        x = torch.flatten(self.features(x), 1)
        logits: torch.Tensor = self.fc2(self.dropout(torch.relu(self.fc1(x))))
        return logits


# ---------------------------------------------------------------------------------------------- data


def _render_chunk(task: tuple[int, int, int, int]) -> tuple[Array, npt.NDArray[np.int64]]:
    """Worker: generate and preprocess one chunk of frames."""
    seed, stream, index, count = task
    cv2.setNumThreads(1)  # the pool is the parallelism; OpenCV's own threads only contend with it
    frames, labels = digit_frames.render_batch(np.random.SeedSequence([seed, stream, index]), count, *FRAME_SIZE)
    pre = Preprocessor(SPEC)
    x = np.concatenate([pre(f) for f in frames])
    return x, np.asarray(labels, dtype=np.int64)


def make_dataset(seed: int, stream: int, count: int, workers: int) -> tuple[Array, npt.NDArray[np.int64]]:
    """`count` preprocessed frames (N, 3, H, W) and their labels; depends on seed and stream only."""
    tasks = [(seed, stream, i, min(CHUNK, count - i * CHUNK)) for i in range((count + CHUNK - 1) // CHUNK)]
    if workers > 1 and len(tasks) > 1:
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            parts = pool.map(_render_chunk, tasks)
    else:
        parts = [_render_chunk(t) for t in tasks]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


# ------------------------------------------------------------------------------------------ training


def train(
    x: Array, y: npt.NDArray[np.int64], *, epochs: int, seed: int, batch_size: int = 128, lr: float = 3e-3
) -> DigitNet:
    """Train a fresh DigitNet with AdamW and a one-cycle schedule; deterministic for a given seed."""
    torch.manual_seed(seed)
    model = DigitNet()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    steps_per_epoch = len(x) // batch_size
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=epochs * steps_per_epoch)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.05)
    rng = np.random.default_rng(seed)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    for epoch in range(epochs):
        model.train()
        order = torch.from_numpy(rng.permutation(len(x)))
        total, correct, loss_sum = 0, 0, 0.0
        t0 = time.perf_counter()
        for step in range(steps_per_epoch):
            idx = order[step * batch_size : (step + 1) * batch_size]
            xb, yb = xt[idx], yt[idx]
            logits = model(xb)
            loss = loss_fn(logits, yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            loss_sum += float(loss.detach()) * len(idx)
            correct += int((logits.argmax(1) == yb).sum())
            total += len(idx)
        print(
            f"  epoch {epoch + 1}/{epochs}: loss {loss_sum / total:.4f}, train acc {correct / total:.4f} "
            f"({time.perf_counter() - t0:.0f} s)"
        )
    return model.eval()


# -------------------------------------------------------------------------------------------- export


def _fold(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> tuple[Array, Array]:
    """Conv weight and bias with the (eval-mode) BatchNorm folded in."""
    if bn.running_mean is None or bn.running_var is None:
        raise ValueError("BatchNorm without running statistics cannot be folded")
    w = conv.weight.detach().double()
    scale = bn.weight.detach().double() / torch.sqrt(bn.running_var.double() + bn.eps)
    bias = bn.bias.detach().double() - bn.running_mean.double() * scale
    return (
        (w * scale[:, None, None, None]).float().numpy(),
        bias.float().numpy(),
    )


def export_onnx(model: DigitNet, path: Path) -> None:
    """Write the trained network as an opset-17 ONNX graph built by hand."""
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    prev = INPUT_NAME
    modules = list(model.features)
    for i in range(len(CHANNELS)):
        conv, bn = modules[4 * i], modules[4 * i + 1]
        if not (isinstance(conv, nn.Conv2d) and isinstance(bn, nn.BatchNorm2d)):
            raise TypeError(f"block {i} is not Conv2d + BatchNorm2d")
        w, b = _fold(conv, bn)
        inits += [numpy_helper.from_array(w, f"conv{i}.weight"), numpy_helper.from_array(b, f"conv{i}.bias")]
        nodes += [
            helper.make_node(
                "Conv",
                [prev, f"conv{i}.weight", f"conv{i}.bias"],
                [f"conv{i}"],
                name=f"conv{i}",
                kernel_shape=[3, 3],
                pads=[1, 1, 1, 1],
                strides=[1, 1],
            ),
            helper.make_node("Relu", [f"conv{i}"], [f"relu{i}"], name=f"relu{i}"),
            helper.make_node(
                "MaxPool", [f"relu{i}"], [f"pool{i}"], name=f"pool{i}", kernel_shape=[2, 2], strides=[2, 2]
            ),
        ]
        prev = f"pool{i}"
    for name, fc in (("fc1", model.fc1), ("fc2", model.fc2)):
        inits += [
            numpy_helper.from_array(fc.weight.detach().numpy().astype(np.float32), f"{name}.weight"),
            numpy_helper.from_array(fc.bias.detach().numpy().astype(np.float32), f"{name}.bias"),
        ]
    nodes += [
        helper.make_node("Flatten", [prev], ["flat"], name="flatten", axis=1),
        helper.make_node("Gemm", ["flat", "fc1.weight", "fc1.bias"], ["fc1"], name="fc1", transB=1),
        helper.make_node("Relu", ["fc1"], ["fc1_relu"], name="fc1_relu"),
        helper.make_node("Gemm", ["fc1_relu", "fc2.weight", "fc2.bias"], [OUTPUT_NAME], name="fc2", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        MODEL_NAME,
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, list(SPEC.tensor_shape))],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, [1, len(LABELS)])],
        initializer=inits,
    )
    onnx_model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="edged/scripts/train_digits.py"
    )
    onnx_model.ir_version = 8  # runs on ONNX Runtime >= 1.13
    onnx.checker.check_model(onnx_model, full_check=True)
    onnx.save(onnx_model, str(path))


# ---------------------------------------------------------------------------------------- evaluation


def session(path: Path) -> ort.InferenceSession:
    """A CPU ONNX Runtime session, two threads."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def predict(path: Path, x: Array) -> npt.NDArray[np.float32]:
    """Logits of the ONNX model for every frame of `x` (one run per frame: the batch dim is 1)."""
    sess = session(path)
    return np.concatenate([sess.run([OUTPUT_NAME], {INPUT_NAME: x[i : i + 1]})[0] for i in range(len(x))])


def torch_logits(model: DigitNet, x: Array) -> npt.NDArray[np.float32]:
    """Logits of the trained torch model, for checking the export."""
    with torch.no_grad():
        return np.concatenate([model(torch.from_numpy(x[i : i + 512])).numpy() for i in range(0, len(x), 512)])


@dataclass
class Report:
    """What the held-out evaluation measured."""

    frames: int
    fp32_accuracy: float
    int8_accuracy: float
    agreement: float
    export_error: float
    size32: int = 0
    size8: int = 0

    def summary(self, eval_seed: int) -> dict[str, float | int]:
        """The figures stored in the models' `edged.eval` metadata."""
        return {
            "fp32_accuracy": round(self.fp32_accuracy, 4),
            "int8_accuracy": round(self.int8_accuracy, 4),
            "int8_fp32_agreement": round(self.agreement, 4),
            "eval_frames": self.frames,
            "eval_seed": eval_seed,
        }

    def print_and_check(self, targets: Targets) -> list[str]:
        """Print the figures and one line per target; return the names of the targets missed."""
        ratio = self.size8 / self.size32
        print(f"export max |torch - onnx| logit error: {self.export_error:.2e}")
        print(f"fp32 top-1 accuracy on {self.frames} held-out frames: {self.fp32_accuracy:.4f}")
        print(f"int8 top-1 accuracy on {self.frames} held-out frames: {self.int8_accuracy:.4f}")
        print(f"int8 / fp32 top-1 agreement: {self.agreement:.4f}")
        print(f"sizes: fp32 {self.size32} B, int8 {self.size8} B, ratio {ratio:.3f}")
        checks = [
            ("fp32 accuracy", self.fp32_accuracy >= targets.fp32_accuracy, f">= {targets.fp32_accuracy}"),
            ("int8 agreement", self.agreement >= targets.int8_agreement, f">= {targets.int8_agreement}"),
            ("size ratio", ratio <= targets.size_ratio, f"<= {targets.size_ratio}"),
            ("export error", self.export_error <= targets.max_export_error, f"<= {targets.max_export_error}"),
        ]
        for name, ok, want in checks:
            print(f"  [{'ok' if ok else 'FAIL'}] {name} {want}")
        return [name for name, ok, _ in checks if not ok]


def evaluate(model: DigitNet, fp32: Path, int8: Path, x: Array, y: npt.NDArray[np.int64]) -> Report:
    """Run both ONNX models (and the torch model, to check the export) on the held-out set."""
    logits32, logits8 = predict(fp32, x), predict(int8, x)
    pred32, pred8 = logits32.argmax(1), logits8.argmax(1)
    return Report(
        frames=len(x),
        fp32_accuracy=float((pred32 == y).mean()),
        int8_accuracy=float((pred8 == y).mean()),
        agreement=float((pred32 == pred8).mean()),
        export_error=float(np.abs(logits32 - torch_logits(model, x)).max()),
    )


# ---------------------------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR, help="where the two models go")
    p.add_argument("--seed", type=int, default=0, help="training data, weight init and shuffling seed")
    p.add_argument("--eval-seed", type=int, default=1, help="held-out evaluation set seed")
    p.add_argument("--train-size", type=int, default=40_000, help="generated training frames")
    p.add_argument("--calib-size", type=int, default=300, help="frames for int8 calibration")
    p.add_argument("--eval-size", type=int, default=3_000, help="held-out frames (at least 2000)")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--workers", type=int, default=2, help="processes generating frames")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--quick", action="store_true", help="smoke run: small sets, three epochs, no targets, nothing kept")
    args = p.parse_args(argv)
    if args.quick:
        args.train_size, args.eval_size, args.calib_size, args.epochs = 6_000, 500, 100, 3
    elif args.eval_size < 2000:
        p.error("--eval-size must be at least 2000")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Generate, train, export, quantize, evaluate; copy the models out when the targets hold."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    started = time.perf_counter()

    t0 = time.perf_counter()
    x_train, y_train = make_dataset(args.seed, TRAIN_STREAM, args.train_size, args.workers)
    x_calib, _ = make_dataset(args.seed, CALIB_STREAM, args.calib_size, 1)
    x_eval, y_eval = make_dataset(args.eval_seed, EVAL_STREAM, args.eval_size, args.workers)
    print(
        f"data: {len(x_train)} train, {len(x_calib)} calibration, {len(x_eval)} held-out frames, "
        f"input {list(SPEC.tensor_shape)} ({time.perf_counter() - t0:.0f} s)"
    )

    t0 = time.perf_counter()
    model = train(x_train, y_train, epochs=args.epochs, seed=args.seed)
    train_s = time.perf_counter() - t0
    n_params = sum(p.numel() for p in model.parameters())
    print(f"trained {n_params} parameters in {train_s:.0f} s")

    with tempfile.TemporaryDirectory(prefix="train_digits-") as tmp:
        work = Path(tmp)
        fp32, int8 = work / FP32_FILE, work / INT8_FILE
        export_onnx(model, fp32)
        quantize(fp32, int8, INPUT_NAME, x_calib, work)
        report = evaluate(model, fp32, int8, x_eval, y_eval)
        common = {
            "edged.preprocess": SPEC.to_metadata(),
            "edged.labels": json.dumps(LABELS),
            "edged.name": MODEL_NAME,
            "edged.source": "scripts/train_digits.py",
            "edged.train_seed": str(args.seed),
            "edged.train_frames": str(len(x_train)),
            "edged.train_epochs": str(args.epochs),
            "edged.created": dt.datetime.now(dt.timezone.utc).date().isoformat(),
            "edged.eval": json.dumps(report.summary(args.eval_seed), sort_keys=True),
        }
        set_metadata(fp32, {**common, "edged.precision": "fp32"})
        set_metadata(int8, {**common, "edged.precision": "int8"})
        report.size32, report.size8 = fp32.stat().st_size, int8.stat().st_size
        failed = report.print_and_check(Targets())
        if args.quick:
            print("--quick: targets not enforced, models not kept")
            return 0
        if failed:
            print(f"targets missed ({', '.join(failed)}); {args.out_dir} left as it was", file=sys.stderr)
            return 1
        args.out_dir.mkdir(parents=True, exist_ok=True)
        for f in (fp32, int8):
            shutil.copyfile(f, args.out_dir / f.name)
    print(f"wrote {FP32_FILE} and {INT8_FILE} to {args.out_dir} ({time.perf_counter() - started:.0f} s in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
