"""Train the bundled demo sensor model: motor vibration windows -> healthy / imbalance / bearing fault.

The windows come from `vibration_signals` (synthetic, seeded; nothing is downloaded): 3 channels (x, y, z)
of 256 samples at 2 kHz. The network is a small 1-D CNN (three Conv1d-BN-ReLU blocks with stride 2,
global average pooling, one linear layer; ~8k parameters). It is written as ONNX with `onnx.helper`
(opset 17, BatchNorm folded into the convolutions), quantized to int8 with ONNX Runtime exactly like the
digits model (static QDQ, per-channel symmetric int8 weights, symmetric int8 activations, MinMax
calibration on generated windows), and both models get the metadata the daemon reads:

- `edged.name`, `edged.labels` (JSON list),
- `edged.window` (JSON): `channels`, `window`, `hop`, `layout`, `normalize`, `mean`, `std`,
  `sample_rate_hz` -- how a sensor source must cut and scale its samples (see edged/model/window.py).

    python scripts/train_vibration.py     # writes edged/assets/vibration.{fp32,int8}.onnx (~15 s on 2 cores)

The models are copied out only when every target holds (fp32 accuracy, int8 agreement, export error);
the script exits non-zero otherwise. Needs the `train` extra (torch, onnx).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnx
import onnxruntime as ort
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vibration_signals as vs
from int8_export import quantize, set_metadata

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT_DIR = REPO / "edged" / "assets"
FP32_FILE, INT8_FILE = "vibration.fp32.onnx", "vibration.int8.onnx"
MODEL_NAME = "vibration"
OPSET = 17
INPUT_NAME, OUTPUT_NAME = "window", "logits"
BLOCKS = ((16, 9), (32, 5), (32, 5))  # (channels, kernel) per Conv1d block, each with stride 2
TRAIN_STREAM, CALIB_STREAM, EVAL_STREAM = 0, 1, 2
TARGET_ACCURACY, TARGET_AGREEMENT, TARGET_EXPORT_ERROR = 0.98, 0.99, 1e-3

Array = npt.NDArray[np.float32]


class VibrationNet(nn.Module):
    """Three Conv1d-BN-ReLU blocks (stride 2), global average pooling, a linear classifier."""

    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c_in = len(vs.CHANNELS)
        for c_out, k in BLOCKS:
            layers += [
                nn.Conv1d(c_in, c_out, k, stride=2, padding=k // 2, bias=False),
                nn.BatchNorm1d(c_out),
                nn.ReLU(),
            ]
            c_in = c_out
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(c_in, len(vs.LABELS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits for a (N, 3, 256) batch."""
        logits: torch.Tensor = self.fc(self.features(x).mean(dim=2))
        return logits


def to_inputs(raw: Array, mean: Array, std: Array) -> Array:
    """(N, window, channels) samples -> (N, channels, window) normalised model inputs (as the daemon does)."""
    return np.ascontiguousarray(((raw - mean) / std).transpose(0, 2, 1), dtype=np.float32)


def train(x: Array, y: npt.NDArray[np.int64], *, epochs: int, seed: int, batch: int = 128) -> VibrationNet:
    """AdamW with a one-cycle schedule; deterministic for a given seed."""
    torch.manual_seed(seed)
    model = VibrationNet()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=1e-4)
    steps = len(x) // batch
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=5e-3, total_steps=epochs * steps)
    loss_fn = nn.CrossEntropyLoss()
    rng = np.random.default_rng(seed)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    for epoch in range(epochs):
        model.train()
        order = torch.from_numpy(rng.permutation(len(x)))
        correct = 0
        for step in range(steps):
            idx = order[step * batch : (step + 1) * batch]
            logits = model(xt[idx])
            loss = loss_fn(logits, yt[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            correct += int((logits.argmax(1) == yt[idx]).sum())
        print(f"  epoch {epoch + 1}/{epochs}: train acc {correct / (steps * batch):.4f}")
    return model.eval()


def export_onnx(model: VibrationNet, path: Path) -> None:
    """Write the trained network as an opset-17 ONNX graph built by hand (BatchNorm folded)."""
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    prev = INPUT_NAME
    mods = list(model.features)
    for i, (_, k) in enumerate(BLOCKS):
        conv, bn = mods[3 * i], mods[3 * i + 1]
        if not (isinstance(conv, nn.Conv1d) and isinstance(bn, nn.BatchNorm1d)):
            raise TypeError(f"block {i} is not Conv1d + BatchNorm1d")
        if bn.running_mean is None or bn.running_var is None:
            raise ValueError("BatchNorm without running statistics cannot be folded")
        scale = bn.weight.detach().double() / torch.sqrt(bn.running_var.double() + bn.eps)
        w = (conv.weight.detach().double() * scale[:, None, None]).float().numpy()
        b = (bn.bias.detach().double() - bn.running_mean.double() * scale).float().numpy()
        inits += [numpy_helper.from_array(w, f"conv{i}.weight"), numpy_helper.from_array(b, f"conv{i}.bias")]
        nodes += [
            helper.make_node(
                "Conv",
                [prev, f"conv{i}.weight", f"conv{i}.bias"],
                [f"conv{i}"],
                name=f"conv{i}",
                kernel_shape=[k],
                pads=[k // 2, k // 2],
                strides=[2],
            ),
            helper.make_node("Relu", [f"conv{i}"], [f"relu{i}"], name=f"relu{i}"),
        ]
        prev = f"relu{i}"
    inits += [
        numpy_helper.from_array(model.fc.weight.detach().numpy().astype(np.float32), "fc.weight"),
        numpy_helper.from_array(model.fc.bias.detach().numpy().astype(np.float32), "fc.bias"),
    ]
    nodes += [
        helper.make_node("GlobalAveragePool", [prev], ["pooled"], name="pool"),
        helper.make_node("Flatten", ["pooled"], ["flat"], name="flatten", axis=1),
        helper.make_node("Gemm", ["flat", "fc.weight", "fc.bias"], [OUTPUT_NAME], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        MODEL_NAME,
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, [1, len(vs.CHANNELS), vs.WINDOW])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, [1, len(vs.LABELS)])],
        initializer=inits,
    )
    out = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="edged/scripts/train_vibration.py"
    )
    out.ir_version = 8
    onnx.checker.check_model(out, full_check=True)
    onnx.save(out, str(path))


def predict(path: Path, x: Array) -> Array:
    """Logits of an ONNX model, one window per run (batch dimension 1, as in the daemon)."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    return np.concatenate([sess.run([OUTPUT_NAME], {INPUT_NAME: x[i : i + 1]})[0] for i in range(len(x))])


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-seed", type=int, default=1)
    p.add_argument("--train-size", type=int, default=12_000)
    p.add_argument("--calib-size", type=int, default=300)
    p.add_argument("--eval-size", type=int, default=3_000)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Generate, train, export, quantize, evaluate; copy the models out when the targets hold."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    started = time.perf_counter()
    raw_train, y_train = vs.windows(args.seed, TRAIN_STREAM, args.train_size)
    raw_calib, _ = vs.windows(args.seed, CALIB_STREAM, args.calib_size)
    raw_eval, y_eval = vs.windows(args.eval_seed, EVAL_STREAM, args.eval_size)
    mean = raw_train.mean(axis=(0, 1)).astype(np.float32)
    std = raw_train.std(axis=(0, 1)).astype(np.float32)
    x_train, x_calib, x_eval = (to_inputs(r, mean, std) for r in (raw_train, raw_calib, raw_eval))
    print(f"data: {len(x_train)} train, {len(x_calib)} calibration, {len(x_eval)} held-out windows {x_train.shape[1:]}")
    model = train(x_train, y_train, epochs=args.epochs, seed=args.seed)
    print(f"trained {sum(p.numel() for p in model.parameters())} parameters")
    window_meta = {
        "channels": vs.CHANNELS,
        "window": vs.WINDOW,
        "hop": vs.WINDOW,
        "layout": "channels_first",
        "normalize": "fixed",
        "mean": [round(float(v), 6) for v in mean],
        "std": [round(float(v), 6) for v in std],
        "sample_rate_hz": vs.SAMPLE_RATE_HZ,
    }
    with tempfile.TemporaryDirectory(prefix="train_vibration-") as tmp:
        work = Path(tmp)
        fp32, int8 = work / FP32_FILE, work / INT8_FILE
        export_onnx(model, fp32)
        quantize(fp32, int8, INPUT_NAME, x_calib, work)
        with torch.no_grad():
            torch_logits = model(torch.from_numpy(x_eval)).numpy()
        logits32, logits8 = predict(fp32, x_eval), predict(int8, x_eval)
        pred32, pred8 = logits32.argmax(1), logits8.argmax(1)
        acc32, acc8 = float((pred32 == y_eval).mean()), float((pred8 == y_eval).mean())
        agreement = float((pred32 == pred8).mean())
        export_error = float(np.abs(logits32 - torch_logits).max())
        summary = {
            "fp32_accuracy": round(acc32, 4),
            "int8_accuracy": round(acc8, 4),
            "int8_fp32_agreement": round(agreement, 4),
            "eval_windows": len(x_eval),
            "eval_seed": args.eval_seed,
        }
        common = {
            "edged.name": MODEL_NAME,
            "edged.labels": json.dumps(vs.LABELS),
            "edged.window": json.dumps(window_meta, sort_keys=True),
            "edged.source": "scripts/train_vibration.py",
            "edged.train_seed": str(args.seed),
            "edged.train_windows": str(len(x_train)),
            "edged.created": dt.datetime.now(dt.timezone.utc).date().isoformat(),
            "edged.eval": json.dumps(summary, sort_keys=True),
        }
        set_metadata(fp32, {**common, "edged.precision": "fp32"})
        set_metadata(int8, {**common, "edged.precision": "int8"})
        size32, size8 = fp32.stat().st_size, int8.stat().st_size
        print(f"export max |torch - onnx| logit error: {export_error:.2e}")
        print(f"fp32 accuracy on {len(x_eval)} held-out windows: {acc32:.4f}")
        print(f"int8 accuracy on {len(x_eval)} held-out windows: {acc8:.4f}")
        print(f"int8 / fp32 agreement: {agreement:.4f}")
        print(f"sizes: fp32 {size32} B, int8 {size8} B")
        checks = {
            "fp32 accuracy": acc32 >= TARGET_ACCURACY,
            "int8 agreement": agreement >= TARGET_AGREEMENT,
            "export error": export_error <= TARGET_EXPORT_ERROR,
        }
        failed = [name for name, ok in checks.items() if not ok]
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
