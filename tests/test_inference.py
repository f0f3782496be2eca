"""Inference: real ONNX Runtime sessions on tiny real models; preprocessing and postprocessing."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import yaml
from conftest import base_config, make_tiny_model, make_video, write_config
from hostile import run_set_aside

from edged.core.errors import ModelError, ProviderError
from edged.model.decoders.classify import Classify, ClassifyConfig
from edged.model.decoders.raw import Raw, RawConfig
from edged.model.postprocess import make_postprocessor
from edged.model.preprocess import Preprocessor, PreprocessSpec
from edged.model.session import load_model, select_providers
from edged.model.settings import ModelConfig, PreprocessConfig
from edged.pipeline.model import prepare_model
from edged.pipeline.settings import PipelineConfig


def model_cfg(path: Path, **kw: object) -> ModelConfig:
    return ModelConfig.model_validate({"path": str(path), **kw})


# -- providers -------------------------------------------------------------------------------------------


def test_select_providers_keeps_config_order_and_drops_missing() -> None:
    available = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    wanted = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    assert select_providers(wanted, available) == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert select_providers(["TensorrtExecutionProvider"], ["CPUExecutionProvider"]) == ["CPUExecutionProvider"]


def test_fallback_to_cpu_warns_only_when_the_config_asked_for_the_provider(
    tiny_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # This machine has no GPU: the runtime offers no TensorRT/CUDA provider, so the session falls back.
    # The default list (TensorRT, CUDA, CPU) falling back on a Pi is expected: an INFO line, no warning
    # forever. A config that names a GPU provider and gets the CPU is worth a warning.
    assert "CUDAExecutionProvider" not in ort.get_available_providers()
    with caplog.at_level(logging.INFO):
        model = load_model(model_cfg(tiny_model), tmp_path)
    assert model.providers == ["CPUExecutionProvider"]
    assert model.provider == "CPUExecutionProvider"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "runs on CPUExecutionProvider (the default provider list" in caplog.text
    caplog.clear()
    explicit = model_cfg(tiny_model, providers=["TensorrtExecutionProvider", "CPUExecutionProvider"])
    with caplog.at_level(logging.INFO):
        load_model(explicit, tmp_path)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        "asked for TensorrtExecutionProvider but the session runs on CPUExecutionProvider" in w for w in warnings
    )


def test_require_provider_turns_the_fallback_into_an_error(tiny_model: Path, tmp_path: Path) -> None:
    cfg = model_cfg(tiny_model, providers=["CUDAExecutionProvider", "CPUExecutionProvider"], require_provider=True)
    with pytest.raises(ProviderError, match="require_provider is true"):
        load_model(cfg, tmp_path)


def test_tensorrt_options_are_passed_through(tiny_model: Path, tmp_path: Path) -> None:
    from edged.model.session import provider_options

    cfg = model_cfg(
        tiny_model,
        trt_fp16=False,
        cuda_device_id=1,
        provider_options={"TensorrtExecutionProvider": {"trt_max_workspace_size": 1 << 30}},
    )
    opts = provider_options(cfg, "TensorrtExecutionProvider", tmp_path, "ab" * 32)
    assert opts["trt_engine_cache_enable"] is True
    cache = Path(opts["trt_engine_cache_path"])  # keyed by model sha256 + TensorRT version + precision
    assert cache.parent == tmp_path / "trt-cache"
    assert cache.name.startswith("abababababababab-trt")
    assert cache.name.endswith("-int8")
    assert opts["trt_timing_cache_path"] == str(cache)
    assert opts["trt_fp16_enable"] is False
    assert opts["device_id"] == 1
    assert opts["trt_max_workspace_size"] == 1 << 30
    assert provider_options(cfg, "CUDAExecutionProvider", tmp_path, "ab" * 32) == {"device_id": 1}


# -- malformed models ------------------------------------------------------------------------------------


def test_malformed_onnx_is_a_clear_model_error(tmp_path: Path) -> None:
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(make_tiny_model(tmp_path / "ok.onnx").read_bytes()[:50])  # a truncated copy
    with pytest.raises(ModelError, match=r"cannot load model .*broken\.onnx.*copy or export it again"):
        load_model(model_cfg(bad), tmp_path)


@pytest.mark.integration
def test_a_malformed_model_sets_its_pipeline_aside_and_the_daemon_runs_on(tmp_path: Path) -> None:
    """It used to exit 1 after 8.5 s: with systemd's Restart=on-failure a loop, then a failed unit, the device off
    the fleet until someone logged in. Now the pipeline is set aside, named, with why, and the daemon runs on."""
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"this is not an onnx file")
    video = make_video(tmp_path / "v.mp4", 3)
    cfg = write_config(tmp_path / "c.yaml", base_config(tmp_path, bad, str(video)))
    code, reasons, err = run_set_aside(cfg)
    assert code == 0, err[-2000:]
    assert any(r.startswith(f"pipeline cam0 failed: set aside: its model cannot be loaded: pipeline cam0: cannot load "
                            f"model {bad}") for r in reasons), reasons  # fmt: skip
    assert "Traceback" not in err


def test_input_shape_mismatch_is_explained(tiny_model: Path, tmp_path: Path) -> None:
    cfg = PipelineConfig.model_validate(
        {
            "name": "p",
            "source": {"type": "camera", "uri": 0},
            "model": {"path": str(tiny_model)},
            "preprocess": {"size": [16, 16]},
        }
    )
    with pytest.raises(
        ModelError, match=r"model input shape is \[1, 3, 8, 8\] but preprocessing produces \[1, 3, 16, 16\]"
    ):
        prepare_model(cfg, tmp_path)


def test_wrong_label_count_is_refused(tiny_model: Path, tmp_path: Path) -> None:
    labels = tmp_path / "labels.txt"
    labels.write_text("a\nb\n", encoding="utf-8")
    with pytest.raises(ModelError, match="2 labels for a model with 4 classes"):
        make_postprocessor(ClassifyConfig(type="classify", labels=labels), ["logits"], [[1, 4]], {})


# -- preprocessing ---------------------------------------------------------------------------------------


def test_spec_comes_from_metadata_and_config_overrides_it(tmp_path: Path) -> None:
    model = make_tiny_model(tmp_path / "m.onnx")
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    meta = sess.get_modelmeta().custom_metadata_map
    inp = sess.get_inputs()[0]
    spec = PreprocessSpec.resolve(None, meta, inp.shape, inp.type)
    assert spec.size == (8, 8)
    assert spec.resize == "stretch"
    spec2 = PreprocessSpec.resolve(PreprocessConfig(resize="letterbox", mean=[0.5]), meta, inp.shape, inp.type)
    assert (spec2.resize, spec2.mean, spec2.size) == ("letterbox", (0.5,), (8, 8))


def test_spec_is_inferred_from_the_input_when_there_is_no_metadata(tmp_path: Path) -> None:
    model = make_tiny_model(tmp_path / "m.onnx", with_metadata=False, size=12)
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    spec = PreprocessSpec.resolve(None, {}, inp.shape, inp.type)
    assert (spec.size, spec.layout, spec.dtype, spec.color) == ((12, 12), "nchw", "float32", "rgb")


def test_letterbox_keeps_aspect_and_pads() -> None:
    spec = PreprocessSpec(size=(8, 8), resize="letterbox", color="bgr", layout="nhwc", dtype="uint8", pad_value=0)
    frame = np.full((4, 8, 3), 200, np.uint8)  # 2:1 frame into a square
    out = Preprocessor(spec)(frame)
    assert out.shape == (1, 8, 8, 3)
    assert (out[0, :2] == 0).all()
    assert (out[0, 6:] == 0).all()
    assert (out[0, 2:6] == 200).all()


def test_rgb_nchw_float_normalisation() -> None:
    spec = PreprocessSpec(size=(2, 2), color="rgb", layout="nchw", scale=1 / 255, mean=(0.5, 0.5, 0.5), std=(0.5,))
    frame = np.zeros((2, 2, 3), np.uint8)
    frame[..., 2] = 255  # red in BGR
    out = Preprocessor(spec)(frame)
    assert out.dtype == np.float32
    assert out.shape == (1, 3, 2, 2)
    np.testing.assert_allclose(out[0, 0], 1.0)  # R channel first after BGR->RGB
    np.testing.assert_allclose(out[0, 1], -1.0)


def test_gray_and_int8() -> None:
    spec = PreprocessSpec(size=(4, 4), color="gray", layout="nchw", dtype="int8")
    out = Preprocessor(spec)(np.full((4, 4, 3), 255, np.uint8))
    assert out.shape == (1, 1, 4, 4)
    assert out.dtype == np.int8
    assert (out == 127).all()


# -- postprocessing --------------------------------------------------------------------------------------


def test_classify_softmax_topk_labels() -> None:
    post = Classify(ClassifyConfig(type="classify", top_k=2), ["a", "b", "c"])
    top = post([np.array([[1.0, 3.0, 2.0]], np.float32)])["top"]
    assert [t["label"] for t in top] == ["b", "c"]
    assert top[0]["score"] == pytest.approx(np.exp(3) / np.exp([1, 2, 3]).sum(), abs=1e-5)


def test_classify_keeps_probabilities_as_they_are() -> None:
    post = Classify(ClassifyConfig(type="classify", top_k=1), None)
    (top,) = post([np.array([0.1, 0.7, 0.2], np.float32)])["top"]
    assert top == {"index": 1, "label": "1", "score": pytest.approx(0.7)}


def test_raw_caps_values_and_summarises() -> None:
    post = Raw(RawConfig(type="raw", max_values=3), ["out"])
    (item,) = post([np.arange(10, dtype=np.float32).reshape(2, 5)])["outputs"]
    assert item["shape"] == [2, 5]
    assert item["values"] == [0.0, 1.0, 2.0]
    assert item["truncated"] is True
    assert (item["min"], item["max"], item["mean"]) == (0.0, 9.0, 4.5)
    json.dumps(item)  # message-safe


def test_prepared_model_classifies_real_frames(tiny_model: Path, tmp_path: Path) -> None:
    cfg = PipelineConfig.model_validate(
        {"name": "p", "source": {"type": "camera", "uri": 0}, "model": {"path": str(tiny_model)}}
    )
    model = prepare_model(cfg, tmp_path)
    green = np.zeros((30, 40, 3), np.uint8)
    green[..., 1] = 255
    result = model.post(model.loaded.run(model.pre(green)))
    assert result["top"][0]["label"] == "green"
    assert yaml.safe_dump(result)  # plain types only


@pytest.mark.parametrize(
    ("meta", "message"),
    [
        ('{"color": "RGB"}', r"color: Input should be 'rgb', 'bgr' or 'gray'"),
        ('{"dtype": "float64"}', "dtype: Input should be"),
        ("[1, 2]", "must be a JSON object"),
        ("{not json", "is not valid JSON"),
    ],
)
def test_bad_preprocess_metadata_is_a_model_error(meta: str, message: str) -> None:
    with pytest.raises(ModelError, match=message):
        PreprocessSpec.resolve(None, {"edged.preprocess": meta}, [1, 3, 8, 8], "tensor(float)")


def test_scalar_mean_in_metadata_applies_to_every_channel() -> None:
    spec = PreprocessSpec.resolve(
        None, {"edged.preprocess": '{"mean": 0.5, "std": 0.25}'}, [1, 3, 8, 8], "tensor(float)"
    )
    assert (spec.mean, spec.std) == ((0.5,), (0.25,))


@pytest.mark.parametrize("channels", [1, 4])
def test_single_channel_and_bgra_frames(channels: int) -> None:
    spec = PreprocessSpec(size=(4, 4), color="rgb", layout="nchw")
    out = Preprocessor(spec)(np.full((4, 4, channels), 255, np.uint8))
    assert out.shape == (1, 3, 4, 4)
    np.testing.assert_allclose(out, 1.0)


def test_thread_plan(tiny_model: Path) -> None:
    from edged.model.session import thread_plan

    auto = model_cfg(tiny_model)
    assert thread_plan(auto, "CPUExecutionProvider", 2) == (2, 1)  # one single-threaded run per core
    assert thread_plan(auto, "CPUExecutionProvider", 8) == (4, 2)  # at most 4 runs at once
    assert thread_plan(auto, "CPUExecutionProvider", 1) == (1, 1)
    assert thread_plan(auto, "CUDAExecutionProvider", 8) == (1, 0)  # a GPU runs one frame at a time
    latency = model_cfg(tiny_model, threads=4, concurrency=1)
    assert thread_plan(latency, "CPUExecutionProvider", 4) == (1, 4)
    assert thread_plan(model_cfg(tiny_model, threads=2), "CPUExecutionProvider", 4) == (2, 2)


def test_interpolation_is_configurable_and_defaults_to_linear() -> None:
    frame = np.zeros((8, 8, 3), np.uint8)
    frame[:, ::2] = 255  # one-pixel stripes: area averages them, nearest picks one
    assert PreprocessSpec(size=(4, 4)).interpolation == "linear"
    area = Preprocessor(PreprocessSpec(size=(4, 4), interpolation="area", layout="nhwc", dtype="uint8"))(frame)
    nearest = Preprocessor(PreprocessSpec(size=(4, 4), interpolation="nearest", layout="nhwc", dtype="uint8"))(frame)
    assert (area == 128).all() or (area == 127).all()
    assert set(np.unique(nearest)) <= {0, 255}
