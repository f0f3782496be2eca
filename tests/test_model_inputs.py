"""Models with more than one input: constants from the config, a recurrent state carried from window to
window, a [1, samples] input from the sensor source. On a real third-party model: silero-vad's voice activity
detector (tests/third_party.py), inputs `input` [batch, samples], `state` [2, batch, 128], `sr` (int64)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import third_party as tp
from conftest import write_config

from edged.config import load_config
from edged.core.errors import ConfigError
from edged.ops.checkconfig import check_config
from edged.pipeline.model import prepare_model

VAD = ("silero_vad", "data/silero_vad.onnx")
INPUTS = {"sr": {"value": 16000}, "state": {"state_from": "stateN"}}


def vad_config(tmp: Path, inputs: dict[str, Any] | None) -> Path:
    model: dict[str, Any] = {"path": str(tp.package_dir(VAD[0]) / VAD[1]), "providers": ["CPUExecutionProvider"]}
    if inputs is not None:
        model["inputs"] = inputs
    return write_config(
        tmp / "edged.yaml",
        {
            "device_id": "vad-test",
            "state_dir": str(tmp / "state"),
            "mqtt": {"enabled": False},
            "pipelines": [
                {
                    "name": "mic0",
                    "source": {
                        "type": "sensor",
                        "transport": "fifo",
                        "path": str(tmp / "mic.fifo"),
                        "format": "csv",
                        "channels": ["audio"],
                        "window": 512,
                    },
                    "model": model,
                    "postprocess": {"type": "raw"},
                }
            ],
        },
    )


def audio(seconds: float, seed: int = 1) -> np.ndarray[Any, Any]:
    """16 kHz: a voiced-like harmonic tone with a syllable envelope, then silence, then the tone again."""
    t = np.arange(int(16000 * seconds)) / 16000
    tone = sum(np.sin(2 * np.pi * f * t) / k for k, f in enumerate((140, 280, 420, 700, 1100), start=1))
    envelope = (np.sin(2 * np.pi * 3 * t) > -0.3) * (np.abs(t - seconds / 2) > seconds / 6)
    noise = np.random.default_rng(seed).normal(0, 0.01, t.size)
    return (0.3 * tone * envelope + noise).astype(np.float32)


def test_check_config_names_the_inputs_edged_cannot_fill(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        check_config(vad_config(tmp_path, None))
    text = str(err.value)
    assert "model.inputs" in text
    assert "state [2, None, 128]" in text
    assert "sr" in text


def test_a_misnamed_state_output_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no output 'state_out'"):
        check_config(vad_config(tmp_path, {**INPUTS, "state": {"state_from": "state_out"}}))


def test_constants_and_the_recurrent_state_are_fed_window_after_window(tmp_path: Path) -> None:
    """check-config accepts the model with its inputs named; the pipeline's model then gives, window after
    window, what ONNX Runtime gives when the state is carried by hand; and the carrying matters."""
    config = vad_config(tmp_path, INPUTS)
    check_config(config)
    pipeline = load_config(config).pipelines[0]
    model = prepare_model(pipeline, tmp_path / "state", cores=1)
    assert model.loaded.concurrency == 1  # a state carried run to run: one window at a time, in order
    windows = audio(2.048).reshape(-1, 512, 1)  # 64 windows of 32 ms
    ours = [float(model.loaded.run(model.pre(w))[0].reshape(-1)[0]) for w in windows]

    sess = ort.InferenceSession(str(tp.package_dir(VAD[0]) / VAD[1]), providers=["CPUExecutionProvider"])
    state, by_hand, fresh = np.zeros((2, 1, 128), np.float32), [], []
    for w in windows:
        x = w.reshape(1, 512)
        out, state = sess.run(None, {"input": x, "state": state, "sr": np.array(16000, np.int64)})
        by_hand.append(float(out.reshape(-1)[0]))
        zero = np.zeros((2, 1, 128), np.float32)
        fresh.append(float(sess.run(None, {"input": x, "state": zero, "sr": np.array(16000, np.int64)})[0][0, 0]))
    np.testing.assert_allclose(ours, by_hand, rtol=1e-4, atol=1e-5)
    assert max(abs(a - b) for a, b in zip(by_hand, fresh, strict=True)) > 0.05  # the state changes the answer
