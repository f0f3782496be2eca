"""`edged quantize` fits a Pi: its memory does not grow with the number of calibration frames, it leaves no
file outside its output, keeps ORT's chatter out of the terminal, and refuses a model already quantized.

On a real third-party model: PaddleOCR's PP-OCRv4 text detector (tests/third_party.py), whose histogram
calibration used to hold every intermediate tensor of every frame (22.9 GB for 64 frames of 640x480).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import cv2
import pytest
import third_party as tp

DET = ("rapidocr_onnxruntime", "models/ch_PP-OCRv4_det_infer.onnx")
PRE = {"size": [320, 256], "color": "rgb", "scale": 1 / 255, "mean": [0.5], "std": [0.5]}
PEAK = (
    "import resource, subprocess, sys\n"
    "rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=open(sys.argv[0] + '.err', 'w')).returncode\n"
    "print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
)


@pytest.fixture(scope="module")
def calib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("calib")
    for i in range(12):
        page = tp.document_page(i % 4) if i % 2 == 0 else tp.face_frames()[i % 7]
        cv2.imwrite(str(folder / f"{i:03d}.png"), cv2.resize(page, (320, 256)))
    return folder


def quantize(model: Path, out: Path, calib: Path, frames: int, cwd: Path) -> tuple[int, int, str]:
    """(exit code, peak RSS in KiB, stderr) of `edged quantize` with one histogram recipe."""
    script = cwd.parent / f"peak-{frames}.py"
    script.write_text(PEAK, encoding="utf-8")
    cmd = [sys.executable, "-m", "edged", "quantize", str(model), "-o", str(out), "--calib", str(calib),
           "--calib-limit", str(frames), "--recipe", "u8s8-entropy", "--preprocess", json.dumps(PRE)]  # fmt: skip
    res = subprocess.run(
        [sys.executable, str(script), *cmd], cwd=cwd, capture_output=True, text=True, timeout=600, check=True
    )
    rc, peak = (int(x) for x in res.stdout.split())
    return rc, peak, Path(f"{script}.err").read_text(encoding="utf-8")


@pytest.mark.timeout(900)
def test_quantize_memory_does_not_grow_with_the_frames(tmp_path: Path, calib: Path) -> None:
    model = tp.package_dir(DET[0]) / DET[1]
    work = tmp_path / "cwd"
    work.mkdir()
    rc4, few, _ = quantize(model, tmp_path / "a.int8.onnx", calib, 4, work)
    rc16, many, err = quantize(model, tmp_path / "b.int8.onnx", calib, 12, work)
    assert rc4 == rc16 == 0, err
    # three times the frames: the same memory (held at once, they would be ~3x the activations)
    assert many < few * 1.3, f"peak RSS {many} KiB with 12 frames vs {few} KiB with 4"
    assert many < 2 * 1024 * 1024, f"peak RSS {many} KiB"
    assert list(work.iterdir()) == [], "quantize left files in the working directory"
    assert len(err.splitlines()) < 40, f"ORT's chatter reached the terminal:\n{err[:2000]}"
    assert "Initializer" not in err


def test_quantize_refuses_a_model_already_quantized(tmp_path: Path) -> None:
    int8 = Path(__file__).resolve().parent.parent / "edged" / "assets" / "digits.int8.onnx"
    out = tmp_path / "x.onnx"
    cmd = [sys.executable, "-m", "edged", "quantize", str(int8), "-o", str(out), "--calib", str(tmp_path)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 1, res.stderr
    assert "is already quantized" in res.stderr
    assert "Traceback" not in res.stderr
    assert not out.exists()


def test_seeded_histograms_never_grow() -> None:
    """ORT's strided histogram calibration fixes each tensor's bin width on its first frames and adds bins
    for every wider range after (a tensor nearly zero on the first frame ends with millions of bins: 5.9 GB
    for 64 frames of the text detector). Seeded with the whole range from a MinMax pass, the histogram keeps
    its bins and counts what ORT counts seeing all the frames at once."""
    import numpy as np
    from onnxruntime.quantization import CalibrationMethod
    from onnxruntime.quantization.calibrate import HistogramCollector, TensorData, TensorsData

    from edged.tools.calibration import seed_histograms

    rng = np.random.default_rng(1)
    frames = [rng.normal(0, 1e-4, 1000).astype(np.float32)] + [
        rng.normal(0, s, 1000).astype(np.float32) for s in (1, 10)
    ]

    def collector() -> HistogramCollector:
        return HistogramCollector(method="entropy", symmetric=False, num_bins=128, num_quantized_bins=128,
                                  percentile=99.999, scenario="same")  # fmt: skip

    grown = collector()
    for f in frames:
        grown.collect({"t": [f]})
    assert len(grown.histogram_dict["t"][0]) > 100_000  # ORT's own merging: bins by the hundred thousand

    everything = np.concatenate(frames)
    low, high = np.float32(everything.min()), np.float32(everything.max())
    bounds = TensorsData(CalibrationMethod.MinMax, {"t": TensorData(lowest=low, highest=high)})

    class Calibrator:  # the attributes seed_histograms reads from ORT's histogram calibrators
        method, symmetric, num_bins, num_quantized_bins, percentile, scenario = (
            "entropy",
            False,
            128,
            128,
            99.999,
            "same",
        )
        collector: HistogramCollector | None = None

    calibrator = Calibrator()
    seed_histograms(calibrator, bounds)
    assert calibrator.collector is not None
    for f in frames:
        calibrator.collector.collect({"t": [f]})
    hist = calibrator.collector.histogram_dict["t"][0]
    at_once = collector()
    at_once.collect({"t": [everything]})
    assert len(hist) == 128
    assert hist.tolist() == at_once.histogram_dict["t"][0].tolist()


@pytest.mark.parametrize("symmetric", [False, True])
def test_the_min_max_pass_gives_the_ranges_of_orts_minmax_calibrator(tmp_path: Path, symmetric: bool) -> None:
    """edged reduces each tensor itself (one frame's activations at a time); the ranges must be those of
    ORT's own MinMaxCalibrater on the same model and frames, plain and symmetric."""
    import numpy as np
    from onnxruntime.quantization import CalibrationMethod
    from onnxruntime.quantization.calibrate import create_calibrator
    from tools_models import SIZE, make_conv_model

    from edged.tools.calibration import RangeCache

    model = make_conv_model(tmp_path / "m.onnx")
    rng = np.random.default_rng(3)
    frames = [rng.normal(0.2, 1.5, (1, 3, SIZE, SIZE)).astype(np.float32) for _ in range(5)]
    ours = RangeCache(model, "image", frames, tmp_path)._minmax_ranges(symmetric, lambda _n: None)  # noqa: SLF001
    theirs = create_calibrator(
        model,
        None,
        augmented_model_path=str(tmp_path / "aug.onnx"),
        calibrate_method=CalibrationMethod.MinMax,
        extra_options={"symmetric": symmetric},
    )
    for x in frames:
        theirs.collect_data(_Reader([{"image": x}]))  # one frame at a time, as edged feeds it
    expected = theirs.compute_data()
    assert set(ours.data) == set(expected.data)
    for name, data in expected.data.items():
        assert np.allclose(ours.data[name].range_value, data.range_value, rtol=1e-6), name


class _Reader:
    """ORT's CalibrationDataReader protocol over a list of feeds."""

    def __init__(self, feeds: list[dict[str, object]]) -> None:
        self.feeds = iter(feeds)

    def get_next(self) -> dict[str, object] | None:
        return next(self.feeds, None)


def test_histograms_collected_in_one_pass_equal_those_collected_one_method_at_a_time(tmp_path: Path) -> None:
    import numpy as np
    from tools_models import SIZE, make_conv_model

    from edged.tools.calibration import RangeCache

    model = make_conv_model(tmp_path / "m.onnx")
    rng = np.random.default_rng(5)
    frames = [rng.normal(0.1, 1.2, (1, 3, SIZE, SIZE)).astype(np.float32) for _ in range(6)]
    keys = [("percentile", False, 99.9), ("entropy", False, 99.999), ("entropy", True, 99.999)]
    reads: list[int] = []
    shared = RangeCache(model, "image", frames, tmp_path / "shared")
    (tmp_path / "shared").mkdir()
    shared.plan([("minmax", True, 99.999), *keys])
    together = {k: json.loads(shared.path(k, reads.append).read_text(encoding="utf-8")) for k in keys}
    assert sum(reads) == 2 * len(frames)  # the min/max pass, then one pass for all three histograms
    for k in keys:
        (tmp_path / k[0]).mkdir(exist_ok=True)
        alone = RangeCache(model, "image", frames, tmp_path / k[0])
        assert json.loads(alone.path(k, lambda _n: None).read_text(encoding="utf-8")) == together[k], k


@pytest.mark.parametrize(("method", "symmetric", "bins"), [("entropy", False, 128), ("percentile", False, 2048),
                                                         ("percentile", True, 2048)])  # fmt: skip
def test_edgeds_counting_gives_the_histograms_of_orts_collector(method: str, symmetric: bool, bins: int) -> None:
    """edged counts each seeded tensor once for every method (calibration.add_frame); the histograms must be
    ORT's, but for a value that falls on a bin's edge in float32 rounding (a few in a million)."""
    import numpy as np
    from onnxruntime.quantization import CalibrationMethod
    from onnxruntime.quantization.calibrate import HistogramCollector, TensorData, TensorsData

    from edged.tools.calibration import add_frame, seed_histograms

    rng = np.random.default_rng(11)
    frames = [rng.normal(0.3, 1.7, 200_000).astype(np.float32) for _ in range(4)]
    everything = np.concatenate(frames)
    bounds = TensorsData(CalibrationMethod.MinMax, {"t": TensorData(lowest=everything.min(), highest=everything.max())})

    def calibrator() -> Any:
        class Calibrator:  # the attributes seed_histograms and add_frame read from ORT's histogram calibrators
            num_quantized_bins, percentile, scenario = 128, 99.999, "same"
            tensors_to_calibrate = frozenset({"t"})
            collector: HistogramCollector | None = None

        made = Calibrator()
        made.method, made.symmetric, made.num_bins = method, symmetric, bins  # type: ignore[attr-defined]
        seed_histograms(made, bounds)
        return made

    ours, theirs = calibrator(), calibrator()
    for f in frames:
        add_frame([ours], {"t": f})
        theirs.collector.collect({"t": [f]})
    mine, orts = ours.collector.histogram_dict["t"][0], theirs.collector.histogram_dict["t"][0]
    assert mine.sum() == orts.sum() == everything.size
    assert np.abs(mine - orts).sum() <= everything.size * 1e-4


def test_entropy_calibration_chooses_its_own_ranges_not_the_whole_ones(tmp_path: Path) -> None:
    """With ORT's default 128 bins, the KL search has one threshold to try, the whole range: "entropy" was
    MinMax under another name. With ENTROPY_BINS it clips a long tail, and never widens a range."""
    import numpy as np
    from tools_models import SIZE, make_conv_model

    from edged.tools.calibration import RangeCache

    model = make_conv_model(tmp_path / "m.onnx")
    rng = np.random.default_rng(7)
    frames = [rng.standard_t(2, (1, 3, SIZE, SIZE)).astype(np.float32) for _ in range(4)]  # heavy tails
    cache = RangeCache(model, "image", frames, tmp_path)
    keys = [("minmax", False, 99.999), ("entropy", False, 99.999)]
    cache.plan(keys)
    whole, entropy = (json.loads(cache.path(k, lambda _n: None).read_text(encoding="utf-8"))["data"] for k in keys)

    def width(entry: dict[str, Any]) -> float:
        def value(v: Any) -> float:  # ORT writes a number, or an array as {"data": [...]}
            return float(np.asarray(v["data"] if isinstance(v, dict) else v).reshape(-1)[0])

        low, high = value(entry["lowest"]), value(entry["highest"])
        return high - low

    narrower = [name for name in whole if width(entropy[name]) < 0.9 * width(whole[name])]
    assert narrower, "entropy gave the min/max ranges"
    assert all(width(entropy[name]) <= width(whole[name]) * (1 + 1e-6) for name in whole)
