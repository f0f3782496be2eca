"""Does `edged quantize` pick an int8 recipe that pays off? One command, every model, side by side.

For each model, `edged quantize`'s search (the default) quantizes it with every candidate recipe for the
CPU, judges each against the fp32 outputs on held-out frames (the `edged validate` gates: top-1 for a
classifier, mask IoU and pixel error for a dense map) and times each beside fp32 on this machine (one
thread, interleaved rounds), tries the fastest again with its noisiest stretch in float when it fails the
gates, then keeps the fastest that passes, or says int8 cannot win here. The table: model, candidates tried,
chosen, speed-up over fp32, agreement, whether it was written, what `edged bench --threads 1` then measures
for the written file beside its parent (sequential runs, so noisier than the search's interleaved rounds),
time taken.

Models (none trained here except the last):
- `ppocr-cls`: PaddleOCR's text-direction classifier `ch_ppocr_mobile_v2.0_cls_infer.onnx` (opset 11,
  dynamic H/W, 0.6 MB, labels 0 / 180), as shipped inside the `rapidocr-onnxruntime` package on PyPI;
- `ppocr-det`: PaddleOCR's PP-OCRv4 text detector `ch_PP-OCRv4_det_infer.onnx` (DB head: a 1 x 1 x H x W
  probability map), from the same package;
- `mobilenetv2`: the repository's MobileNetV2-sized bench model (scripts/make_bench_model.py).

Calibration and held-out frames are generated (text lines and pages drawn with OpenCV, camera-like images),
like the frames a device would record. Install the models' package without its dependencies (it wants
the GUI build of OpenCV; edged needs only the files): `scripts/setup bench`, or
`.venv/bin/pip install --no-deps 'rapidocr-onnxruntime==1.4.*'`.

    .venv/bin/python benchmarks/quantize.py                 # all three
    .venv/bin/python benchmarks/quantize.py --models ppocr-cls --frames 80 --json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

from edged.model.session import CPU  # noqa: E402
from edged.model.settings import PreprocessConfig  # noqa: E402
from edged.tools.bench import BenchOptions, bench_models  # noqa: E402
from edged.tools.frames import save_frames  # noqa: E402
from edged.tools.quantize import Int8SlowerError, QuantizeOptions, describe_candidate, quantize_model  # noqa: E402

OCR_PACKAGE = "rapidocr_onnxruntime"
WORDS = [
    "edged",
    "int8",
    "device",
    "frames",
    "result",
    "broker",
    "spool",
    "model",
    "quantize",
    "camera",
    "sensor",
    "pipeline",
    "2026",
    "OK",
]


def package_model(name: str) -> Path:
    """A model file shipped inside the OCR package (found without importing it)."""
    spec = importlib.util.find_spec(OCR_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            f"{OCR_PACKAGE} is not installed: .venv/bin/pip install --no-deps 'rapidocr-onnxruntime==1.4.*'"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "models" / name


def text_line(rng: np.random.Generator, width: int = 192, height: int = 48) -> np.ndarray:
    """A cropped text line, upright or upside down (what the direction classifier sees)."""
    img: np.ndarray = np.full((height, width, 3), int(rng.integers(170, 256)), np.uint8)
    text = " ".join(rng.choice(WORDS, size=int(rng.integers(1, 3))))
    scale = float(rng.uniform(0.7, 1.0))
    colour = tuple(int(c) for c in rng.integers(0, 80, 3))
    cv2.putText(img, text, (4, int(height * 0.7)), cv2.FONT_HERSHEY_SIMPLEX, scale, colour, 2, cv2.LINE_AA)
    if rng.random() < 0.5:
        img = cv2.rotate(img, cv2.ROTATE_180)
    noise = rng.normal(0, 6, img.shape)
    return np.clip(img.astype(np.float64) + noise, 0, 255).astype(np.uint8)


def text_page(rng: np.random.Generator, size: int = 320) -> np.ndarray:
    """A page region with a few lines of text (what the detector sees)."""
    img = np.full((size, size, 3), int(rng.integers(190, 256)), np.uint8)
    for _ in range(int(rng.integers(3, 7))):
        text = " ".join(rng.choice(WORDS, size=int(rng.integers(1, 4))))
        org = (int(rng.integers(0, size // 3)), int(rng.integers(20, size - 10)))
        scale = float(rng.uniform(0.5, 1.1))
        colour = tuple(int(c) for c in rng.integers(0, 90, 3))
        cv2.putText(img, text, org, cv2.FONT_HERSHEY_SIMPLEX, scale, colour, 2, cv2.LINE_AA)
    noise = rng.normal(0, 5, img.shape)
    return np.clip(img.astype(np.float64) + noise, 0, 255).astype(np.uint8)


def bench_images(rng: np.random.Generator, n: int) -> list[np.ndarray]:
    """Camera-like synthetic images (scripts/make_bench_model.py's calibration images)."""
    from make_bench_model import synthetic_image  # scripts/

    return [synthetic_image(rng) for _ in range(n)]


def mobilenet(out: Path) -> Path:
    """The MobileNetV2-sized bench model, fp32, with its preprocessing metadata."""
    import onnx
    from make_bench_model import build_mobilenetv2, set_metadata  # scripts/

    model = build_mobilenetv2()
    set_metadata(model)
    onnx.save(model, str(out))
    return out


def ocr_preprocess(size: tuple[int, int]) -> PreprocessConfig:
    """PaddleOCR's input: BGR as OpenCV reads it, (x / 255 - 0.5) / 0.5."""
    return PreprocessConfig(
        size=size, resize="stretch", color="bgr", layout="nchw", dtype="float32",
        scale=1 / 255, mean=[0.5, 0.5, 0.5], std=[0.5, 0.5, 0.5],
    )  # fmt: skip


def models(work: Path, frames: int) -> dict[str, tuple[Path, Callable[[], list[np.ndarray]], PreprocessConfig | None]]:
    rng = np.random.default_rng(7)
    return {
        "ppocr-cls": (
            package_model("ch_ppocr_mobile_v2.0_cls_infer.onnx"),
            lambda: [text_line(rng) for _ in range(frames)],
            ocr_preprocess((192, 48)),
        ),
        "ppocr-det": (
            package_model("ch_PP-OCRv4_det_infer.onnx"),
            lambda: [text_page(rng) for _ in range(frames)],
            ocr_preprocess((320, 320)),
        ),
        "mobilenetv2": (work / "mobilenetv2.fp32.onnx", lambda: bench_images(rng, frames), None),
    }


def run_one(name: str, src: Path, frames: list[np.ndarray], pre: PreprocessConfig | None, work: Path) -> dict[str, Any]:
    calib = save_frames(work / f"{name}.calib.npz", np.stack(frames))
    opts = QuantizeOptions(calib=calib, preprocess=pre, progress=False, target="cpu", calib_limit=len(frames))
    started = time.monotonic()
    try:
        report = quantize_model(src, work / f"{name}.int8.onnx", opts)
        search, written = report["search"], True
    except Int8SlowerError as exc:
        search, written = exc.search, False
    chosen = next(r for r in search["table"] if r["recipe"] == search["chosen"])
    bench = None
    if written:  # what `edged bench --threads 1` says of the written file beside its parent
        report = bench_models(
            [src, work / f"{name}.int8.onnx"],
            BenchOptions(providers=[CPU], threads=[1], runs=200, preprocess=pre, progress=False),
        )
        bench = report["comparison"][0]["p50_speedup"]
    return {
        "model": name,
        "file": src.name,
        "fp32_ms": search["fp32_ms"],
        "candidates": len(search["table"]),
        "chosen": search["chosen"],
        "int8_ms": search["int8_ms"],
        "speedup": search["speedup"],
        "agreement": chosen["agreement"],
        "written": written,
        "seconds": round(time.monotonic() - started, 1),
        "bench_speedup": bench,
        "table": search["table"],
    }


def render(rows: list[dict[str, Any]]) -> str:
    out = [
        "| model | fp32 ms | candidates | chosen | int8 ms | speed-up | agreement | written | edged bench | time |",
        "| --- | ---: | ---: | --- | ---: | ---: | --- | --- | ---: | ---: |",
    ]
    for r in rows:
        agree = f"{r['agreement']['check']} {r['agreement']['value']:.4f}"
        out.append(
            f"| {r['model']} (`{r['file']}`) | {r['fp32_ms']:.2f} | {r['candidates']} | {r['chosen']} | "
            f"{r['int8_ms']:.2f} | {r['speedup']:.2f}x | {agree} | {'yes' if r['written'] else 'no: slower'} | "
            f"{f'{b:.2f}x' if (b := r['bench_speedup']) else '-'} | {r['seconds']:.0f} s |"
        )
    out.extend(f"\n{r['model']}: " + ", ".join(describe_candidate(c) for c in r["table"]) for r in rows)
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="ppocr-cls,ppocr-det,mobilenetv2", help="comma-separated")
    parser.add_argument("--frames", type=int, default=120, help="calibration + held-out frames per model")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="edged-bench-quantize-") as tmp:
        work = Path(tmp)
        table = models(work, args.frames)
        rows = []
        for name in args.models.split(","):
            src, make_frames, pre = table[name]
            if name == "mobilenetv2":
                src = mobilenet(src)
            print(f"[{time.strftime('%H:%M:%S')}] {name}: searching", file=sys.stderr, flush=True)
            rows.append(run_one(name, src, make_frames(), pre, work))
    print(json.dumps(rows, indent=2) if args.json else render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
