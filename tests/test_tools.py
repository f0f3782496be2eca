"""The model toolchain on tiny real models with real ONNX Runtime: inspect, quantize, validate, bench."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from tools_models import SIZE, make_conv_model, make_frames

from edged.core.errors import ToolError
from edged.model.session import file_sha256
from edged.model.settings import PreprocessConfig
from edged.tools.bench import BenchOptions, bench_models
from edged.tools.common import require_onnx
from edged.tools.frames import iter_frames, load_inputs
from edged.tools.inspect import inspect_model
from edged.tools.quantize import QuantizeOptions, quantize_model
from edged.tools.validate import Thresholds, ValidateOptions, validate_models


def edged(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """`python -m edged ARGS`, as an operator runs it."""
    return subprocess.run(
        [sys.executable, "-m", "edged", *map(str, args)], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tools")


@pytest.fixture(scope="module")
def calib(work: Path) -> Path:
    return make_frames(work / "calib.npz", 40, seed=1)


@pytest.fixture(scope="module")
def held_out(work: Path) -> Path:
    return make_frames(work / "held_out.npz", 60, seed=2)


@pytest.fixture(scope="module")
def fp32(work: Path) -> Path:
    return make_conv_model(work / "conv.fp32.onnx")


@pytest.fixture(scope="module")
def int8(work: Path, fp32: Path, calib: Path) -> Path:
    out = work / "conv.int8.onnx"
    quantize_model(fp32, out, QuantizeOptions(calib=calib, progress=False, search=False))
    return out


def run_once(path: Path, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.asarray(sess.run(None, {sess.get_inputs()[0].name: x})[0])


# -- frame sources -----------------------------------------------------------------------------------------


def test_frames_come_from_a_folder_a_video_and_a_saved_set(tmp_path: Path) -> None:
    from conftest import make_video

    folder = tmp_path / "imgs"
    folder.mkdir()
    for i in range(3):
        cv2.imwrite(str(folder / f"{i}.png"), np.full((10, 12, 3), i * 50, np.uint8))
    (folder / "notes.txt").write_text("not an image")
    video = make_video(tmp_path / "v.mp4", 5)
    saved = make_frames(tmp_path / "f.npz", 4)
    assert [f.shape for f in iter_frames(folder)] == [(10, 12, 3)] * 3
    assert len(list(iter_frames(video))) == 5
    assert len(list(iter_frames(saved, limit=2))) == 2


def test_saved_tensors_are_used_as_they_are(tmp_path: Path) -> None:
    tensors = np.random.default_rng(0).random((5, 3, SIZE, SIZE)).astype(np.float32)
    np.savez(tmp_path / "t.npz", tensors=tensors)
    inputs = load_inputs(tmp_path / "t.npz", None, [1, 3, SIZE, SIZE])
    assert len(inputs) == 5
    assert inputs[0].shape == (1, 3, SIZE, SIZE)
    np.testing.assert_array_equal(inputs[4][0], tensors[4])


def test_a_missing_source_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ToolError, match="frame source not found"):
        list(iter_frames(tmp_path / "nope.mp4"))


# -- quantize -----------------------------------------------------------------------------------------------


@pytest.mark.integration
def test_quantize_writes_a_qdq_model_that_runs_and_keeps_metadata(fp32: Path, int8: Path, calib: Path) -> None:
    model = onnx.load(str(int8))
    ops = {n.op_type for n in model.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    props = {p.key: p.value for p in model.metadata_props}
    assert props["edged.quantized_from"] == file_sha256(fp32)
    provenance = json.loads(props["edged.quantization"])
    assert provenance["calibration_frames"] == 40
    assert provenance["method"] == "minmax"
    assert "date" in provenance
    assert json.loads(props["edged.labels"])[0] == "class0"  # the fp32 model's metadata survives
    assert "edged.preprocess" in props
    x = np.random.default_rng(3).random((1, 3, SIZE, SIZE)).astype(np.float32)
    assert run_once(int8, x).shape == (1, 6)


@pytest.mark.integration
def test_quantize_upgrades_an_old_opset_and_says_so(tmp_path: Path, calib: Path) -> None:
    old = make_conv_model(tmp_path / "old.onnx", opset=11)
    report = quantize_model(old, tmp_path / "old.int8.onnx", QuantizeOptions(calib=calib, progress=False, search=False))
    assert any("from opset 11 to 13" in n for n in report["notes"])
    out = onnx.load(str(tmp_path / "old.int8.onnx"))
    assert next(op.version for op in out.opset_import if op.domain in ("", "ai.onnx")) >= 13
    assert inspect_model(tmp_path / "old.int8.onnx")["quantization"]["granularity"] == "per-channel"
    x = np.zeros((1, 3, SIZE, SIZE), np.float32)
    assert run_once(tmp_path / "old.int8.onnx", x).shape == (1, 6)


@pytest.mark.integration
def test_quantize_cli_pins_dynamic_axes_from_shape(tmp_path: Path, calib: Path) -> None:
    dyn = make_conv_model(tmp_path / "dyn.onnx", dynamic=True, metadata=False)
    out = tmp_path / "dyn.int8.onnx"
    pre = json.dumps({"size": [SIZE, SIZE], "mean": [0.5], "std": [0.25]})
    proc = edged(
        "quantize",
        dyn,
        "-o",
        out,
        "--calib",
        calib,
        "--shape",
        f"1,3,{SIZE},{SIZE}",
        "--preprocess",
        pre,
        "--json",
        "--recipe",
        "s8-sym",
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert {"fp32_bytes", "int8_bytes", "size_ratio", "notes", "quantization", "input_shape"} <= report.keys()
    assert report["input_shape"] == [1, 3, SIZE, SIZE]
    assert any("pinned the dynamic input axes" in n for n in report["notes"])
    dims = onnx.load(str(out)).graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_value for d in dims] == [1, 3, SIZE, SIZE]


def test_one_shape_rule_a_dynamic_model_takes_its_size_from_the_frames_in_every_tool(
    tmp_path: Path, calib: Path
) -> None:
    # quantize asked for --shape, bench and budget too, where validate found the size itself
    dyn = make_conv_model(tmp_path / "dyn.onnx", dynamic=True, metadata=False)
    out = tmp_path / "o.onnx"
    report = quantize_model(dyn, out, QuantizeOptions(calib=calib, progress=False, search=False))
    assert report["input_shape"] == [1, 3, 20, 24]  # the calibration frames are 24 x 20
    from edged.tools.bench import BenchOptions, bench_models

    rows = bench_models([dyn, out], BenchOptions(runs=2, warmup=0, progress=False))["results"]
    assert [r["input_shape"] for r in rows] == [[1, 3, 20, 24]] * 2  # the parent takes its child's metadata
    alone = bench_models([dyn], BenchOptions(runs=2, warmup=0, progress=False, data=calib))["results"]
    assert alone[0]["input_shape"] == [1, 3, 20, 24]  # or the frames' size
    with pytest.raises(ToolError, match="give --shape"):
        bench_models([dyn], BenchOptions(runs=2, warmup=0, progress=False))


@pytest.mark.integration
def test_quantize_refuses_to_overwrite_its_input(fp32: Path, calib: Path) -> None:
    before = file_sha256(fp32)
    proc = edged("quantize", fp32, "-o", fp32, "--calib", calib)
    assert proc.returncode == 1
    assert "edged: error: refusing to overwrite the input model" in proc.stderr
    assert file_sha256(fp32) == before


@pytest.mark.parametrize("method", ["entropy", "percentile"])
def test_other_calibration_methods_and_uint8_activations(tmp_path: Path, fp32: Path, calib: Path, method: str) -> None:
    opts = QuantizeOptions(
        calib=calib, method=method, activation_type="uint8", per_channel=False, progress=False, search=False
    )
    report = quantize_model(fp32, tmp_path / "q.onnx", opts)
    assert report["quantization"]["activation_symmetric"] is False  # uint8 activations keep their zero points
    assert inspect_model(tmp_path / "q.onnx")["quantization"]["granularity"] == "per-tensor"


def test_without_onnx_the_tools_say_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnx", None)  # what an install without the extra looks like
    with pytest.raises(ToolError, match=r"pip install 'edged\[tools\]'"):
        require_onnx()


# -- validate -----------------------------------------------------------------------------------------------


@pytest.mark.integration
def test_validate_passes_a_good_int8_model(fp32: Path, int8: Path, held_out: Path) -> None:
    proc = edged("validate", fp32, int8, "--data", held_out, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["passed"] is True
    assert report["classification"]["top1_agreement"] >= 0.95
    out = report["outputs"][0]
    assert {"max_abs_error", "mean_abs_error", "cosine_mean", "allclose", "max_error_at"} <= out.keys()
    assert out["max_abs_error"] > 0  # int8 is never bit-identical to fp32 ...
    assert "never give bit-identical" in report["note"]  # ... and the report says so


@pytest.mark.integration
def test_validate_fails_a_damaged_model_with_exit_1(tmp_path: Path, fp32: Path, held_out: Path) -> None:
    damaged = make_conv_model(tmp_path / "damaged.onnx", damage=True)
    proc = edged("validate", fp32, damaged, "--data", held_out)
    assert proc.returncode == 1
    assert "FAIL top-1 agreement" in proc.stdout
    assert "FAILED" in proc.stdout


def test_validate_thresholds_and_allclose(fp32: Path, int8: Path, held_out: Path) -> None:
    opts = ValidateOptions(data=held_out, limit=20, progress=False, rtol=0.0, atol=1e-9)
    strict = validate_models(fp32, int8, opts, Thresholds(require_allclose=True))
    assert strict["outputs"][0]["allclose"] is False
    assert strict["passed"] is False
    same = validate_models(fp32, fp32, opts, Thresholds(require_allclose=True, max_abs=0.0))
    assert same["passed"] is True
    assert same["classification"]["top1_agreement"] == 1.0
    assert same["data"]["frames"] == 20


# -- inspect ------------------------------------------------------------------------------------------------


@pytest.mark.integration
def test_inspect_reports_dynamic_axes_and_opset(tmp_path: Path) -> None:
    dyn = make_conv_model(tmp_path / "dyn11.onnx", dynamic=True, opset=11)
    proc = edged("inspect", dyn, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["opsets"] == {"ai.onnx": 11}
    assert report["inputs"][0]["shape"] == ["N", 3, "H", "W"]
    assert report["inputs"][0]["dynamic_axes"] == [0, 2, 3]
    assert report["dynamic"] is True
    assert report["onnxruntime"]["loads"] is True
    assert report["quantization"]["quantized"] is False
    assert report["sha256"] == file_sha256(dyn)
    assert "CPUExecutionProvider" in report["providers_available"]
    assert any("opset 11" in w for w in report["warnings"])


@pytest.mark.integration
def test_inspect_table_names_the_quantization_in_80_columns(int8: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")  # piped output follows $COLUMNS (80 without it)
    proc = edged("inspect", int8)
    assert proc.returncode == 0, proc.stderr
    assert "QDQ, per-channel" in proc.stdout
    assert "edged.quantized_from" in proc.stdout
    assert max(len(line) for line in proc.stdout.splitlines()) <= 80, proc.stdout


# -- bench --------------------------------------------------------------------------------------------------


@pytest.mark.integration
def test_bench_json_has_percentiles_per_model_provider_and_threads(fp32: Path, int8: Path, tmp_path: Path) -> None:
    proc = edged("bench", fp32, int8, "--runs", "5", "--warmup", "1", "--threads", "1,2", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert {"machine", "runs", "warmup", "results", "comparison"} <= report.keys()
    rows = report["results"]
    assert [(Path(r["path"]).name, r["threads"]) for r in rows] == [
        ("conv.fp32.onnx", 1),
        ("conv.fp32.onnx", 2),
        ("conv.int8.onnx", 1),
        ("conv.int8.onnx", 2),
    ]
    for r in rows:
        assert {"p50_ms", "p95_ms", "p99_ms", "throughput_fps", "provider", "size_bytes"} <= r.keys()
        assert 0 < r["p50_ms"] <= r["p95_ms"] <= r["p99_ms"]
        assert len(r["samples_ms"]) == 5
    assert [c["model"] for c in report["comparison"]] == ["conv.int8.onnx", "conv.int8.onnx"]
    assert {"p50_speedup", "size_ratio", "throughput_ratio"} <= report["comparison"][0].keys()


@pytest.mark.integration
def test_bench_plot_is_skipped_with_a_message_without_matplotlib(fp32: Path, tmp_path: Path) -> None:
    # matplotlib is hidden from this one process (None in sys.modules makes its import fail), as on a
    # device without the `plot` extra
    args = ["bench", str(fp32), "--runs", "2", "--warmup", "0", "--plot", str(tmp_path / "p.png")]
    code = f"import sys; sys.modules['matplotlib'] = None; from edged.cli import main; sys.exit(main({args!r}))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "pip install 'edged[plot]'" in proc.stderr
    assert not (tmp_path / "p.png").exists()


def test_bench_needs_a_shape_for_dynamic_axes(tmp_path: Path) -> None:
    dyn = make_conv_model(tmp_path / "dyn.onnx", dynamic=True, metadata=False)
    with pytest.raises(ToolError, match="--shape"):
        bench_models([dyn], BenchOptions(runs=1, warmup=0, progress=False))
    report = bench_models([dyn], BenchOptions(runs=2, warmup=0, shape=(1, 3, 8, 8), progress=False))
    assert report["results"][0]["p50_ms"] > 0


def test_bench_refuses_a_provider_this_machine_lacks(fp32: Path) -> None:
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ToolError, match="not offered"):
        bench_models([fp32], BenchOptions(providers=["CUDAExecutionProvider"], runs=1, progress=False))


def test_bench_runs_on_a_real_frame_with_config_preprocessing(fp32: Path, held_out: Path) -> None:
    opts = BenchOptions(runs=2, warmup=0, data=held_out, preprocess=PreprocessConfig(color="bgr"), progress=False)
    assert bench_models([fp32], opts)["results"][0]["p50_ms"] > 0


def test_quantize_survives_a_failing_quant_pre_process(
    tmp_path: Path, fp32: Path, calib: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from onnxruntime.quantization import shape_inference

    calls: list[dict[str, Any]] = []

    def broken(*_args: Any, **kwargs: Any) -> None:
        calls.append(kwargs)
        raise RuntimeError("symbolic shape inference failed on a Reshape")

    monkeypatch.setattr(shape_inference, "quant_pre_process", broken)
    report = quantize_model(fp32, tmp_path / "q.onnx", QuantizeOptions(calib=calib, progress=False, search=False))
    assert len(calls) == 3  # full, without symbolic shape inference, shape inference only
    assert "quant_pre_process failed; quantized the model without pre-processing" in report["notes"]
    assert run_once(tmp_path / "q.onnx", np.zeros((1, 3, SIZE, SIZE), np.float32)).shape == (1, 6)


@pytest.mark.integration
def test_budget_measures_the_edge_latency_of_a_model(fp32: Path) -> None:
    proc = edged("budget", "--model", fp32, "--preset", "wifi", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["edge"]["source"].startswith("measured here: p50 of conv.fp32.onnx on CPUExecutionProvider")
    assert report["edge"]["total_ms"] > 0


def test_preprocessing_comes_from_a_pipeline_config_then_the_flag(tmp_path: Path, fp32: Path) -> None:
    from conftest import write_config

    from edged.tools.common import preprocess_overrides

    cfg = write_config(
        tmp_path / "edged.yaml",
        {
            "pipelines": [
                {
                    "name": "cam0",
                    "source": {"type": "camera", "uri": "0"},
                    "model": {"path": str(fp32)},
                    "preprocess": {"color": "bgr", "scale": 0.5},
                }
            ]
        },
    )
    merged = preprocess_overrides(cfg, None, '{"scale": 1.0}')
    assert merged is not None
    assert (merged.color, merged.scale) == ("bgr", 1.0)  # the flag wins over the config
    assert preprocess_overrides(None, None, None) is None
    with pytest.raises(ToolError, match="not valid JSON"):
        preprocess_overrides(None, None, "{size: 3}")
    with pytest.raises(ToolError, match="no pipeline 'cam9'"):
        preprocess_overrides(cfg, "cam9", None)


@pytest.mark.integration
def test_bench_plot_writes_a_png_with_matplotlib(fp32: Path, tmp_path: Path) -> None:
    from edged.tools.bench import plot_bench  # matplotlib: the optional `plot` extra, installed by `dev`

    report = bench_models([fp32], BenchOptions(threads=[1, 2], runs=3, warmup=0, progress=False))
    assert plot_bench(report, tmp_path / "p.png") == f"plot written to {tmp_path / 'p.png'}"
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.integration
def test_record_saves_frames_from_a_pipeline_source_for_calibration(tmp_path: Path) -> None:
    import numpy as np
    from conftest import base_config, make_tiny_model, make_video, write_config

    model = make_tiny_model(tmp_path / "tiny.onnx")
    video = make_video(tmp_path / "v.mp4", 30)
    cfg = write_config(tmp_path / "edged.yaml", base_config(tmp_path, model, str(video)))
    out = tmp_path / "calib.npz"
    res = subprocess.run(
        [sys.executable, "-m", "edged", "record", "--config", str(cfg), "-o", str(out),
         "--frames", "10", "--every", "2"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    frames = np.load(out)["frames"]
    assert frames.shape == (10, 48, 64, 3)
    assert frames[1, 0, 0, 0] > 200  # frame 2 of the video (every second one kept) is blue (BGR)
    q = subprocess.run(
        [sys.executable, "-m", "edged", "quantize", str(model), "-o", str(tmp_path / "q.onnx"), "--calib", str(out),
         "--recipe", "s8-sym"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert q.returncode == 0, q.stderr


def test_inspect_counts_weights_held_in_constant_nodes(tmp_path: Path) -> None:
    # PaddlePaddle's exporter writes every weight as a Constant node: inspect said 0 parameters
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((4, 3), np.float32), "w")
    nodes = [
        helper.make_node("Constant", [], ["W"], value=w),
        helper.make_node("MatMul", ["x", "W"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "const",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
        initializer=[],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 7
    path = tmp_path / "const.onnx"
    onnx.save(model, str(path))
    from edged.tools.inspect import inspect_model

    assert inspect_model(path)["parameters"] == 12
