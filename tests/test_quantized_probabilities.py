"""A model's probabilities are still probabilities when they come out a rounding step past 1. ONNX Runtime's
own Sigmoid gives 1.0000001 for some logits near 17.8, and a quantized model calibrated on that range
dequantizes its top step to it. The decoders used to take any value past 1.0 for a logit and put the whole map
through a second sigmoid: every pixel above 0.5. An int8 PP-OCR text detector lost every box that way (recall
0 with minmax calibration), and an fp32 one could lose a frame's. Both models here are run by ONNX Runtime,
and the int8 one is made by its own quantize_static, not faked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static

from edged.model.detections import in_unit_range, probabilities, sigmoid
from edged.model.postprocess import POSTPROCESSORS, make_postprocessor

SIZE = 64
PAST_ONE = 17.844  # ONNX Runtime 1.2x-1.3x's Sigmoid(17.844) is 1.0000001 in float32


def _frame() -> np.ndarray[Any, Any]:
    """A [1, 1, 64, 64] input: two bright bars (text lines) on a dark page."""
    x = np.full((1, 1, SIZE, SIZE), -1.0, np.float32)
    x[0, 0, 10:18, 6:58] = 1.0
    x[0, 0, 36:44, 6:40] = 1.0
    return x


def _db_like_model(path: Path) -> Path:
    """x -> Conv 1x1 -> Sigmoid: a probability map that saturates, like a DB head's, with the logit at which
    ONNX Runtime's Sigmoid rounds past 1."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["logits"]), helper.make_node("Sigmoid", ["logits"], ["prob"])]
    graph = helper.make_graph(
        nodes,
        "db",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, SIZE, SIZE])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 1, SIZE, SIZE])],
        initializer=[numpy_helper.from_array(np.full((1, 1, 1, 1), PAST_ONE, np.float32), "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(model, str(path))
    return path


class _Once(CalibrationDataReader):  # type: ignore[misc]
    """ORT's calibration reader over one feed."""

    def __init__(self, feed: dict[str, Any]) -> None:
        self.left = [feed]

    def get_next(self) -> dict[str, Any] | None:
        return self.left.pop() if self.left else None


def _quantize(fp32: Path, int8: Path, feed: dict[str, Any]) -> None:
    """ORT's own static QDQ quantization, u8s8, MinMax ranges from the one feed."""
    quantize_static(str(fp32), str(int8), _Once(feed), quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax)  # fmt: skip


def _run(path: Path) -> np.ndarray[Any, Any]:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.asarray(sess.run(None, {"x": _frame()})[0])


def test_an_int8_sigmoid_output_past_one_is_decoded_as_the_probabilities_it_is(tmp_path: Path) -> None:
    fp32 = _db_like_model(tmp_path / "db.onnx")
    int8 = tmp_path / "db.int8.onnx"
    _quantize(fp32, int8, {"x": _frame()})
    ref, cand = _run(fp32), _run(int8)
    assert float(ref.max()) > 1.0  # ORT's rounding: the fault this guards against is really there
    assert float(cand.max()) > 1.0  # and the quantizer calibrated on it keeps it
    POSTPROCESSORS.load_builtins()
    post = POSTPROCESSORS.configs["text"](type="text")
    decode = make_postprocessor(post, ["prob"], [[1, 1, SIZE, SIZE]], {}, (SIZE, SIZE))
    want = [d["box"] for d in decode([np.clip(ref, 0.0, 1.0)])["detections"]]
    assert len(want) == 2
    for out in (ref, cand):
        got = decode([out])["detections"]
        assert [d["box"] for d in got] == want
        assert all(d["score"] <= 1.0 for d in got)  # clipped: published scores stay probabilities


TOP = np.nextafter(np.float32(1.0), np.float32(2.0))  # an 8-bit output's top step, as ORT's scale rounds it


def _centernet(heat: np.ndarray[Any, Any]) -> list[list[float]]:
    post = POSTPROCESSORS.configs["centernet"](type="centernet")
    shapes = [[1, 1, 16, 16], [1, 2, 16, 16], [1, 2, 16, 16]]
    decode = make_postprocessor(post, ["heatmap", "scale", "offset"], shapes, {}, (64, 64))
    size, offset = np.ones((1, 2, 16, 16), np.float32), np.zeros((1, 2, 16, 16), np.float32)
    return [d["box"] for d in decode([heat, size, offset])["detections"]]


def _segment(prob: np.ndarray[Any, Any]) -> list[float]:
    post = POSTPROCESSORS.configs["segment"](type="segment", labels=["person"])
    decode = make_postprocessor(post, ["mask"], [[1, 1, 16, 16]], {}, (64, 64))
    return [s["area"] for s in decode([prob])["segments"]]


def test_heatmaps_and_masks_keep_a_rounded_top_step_too() -> None:
    POSTPROCESSORS.load_builtins()
    heat = np.zeros((1, 1, 16, 16), np.float32)
    heat[0, 0, 5, 7] = 1.0
    rounded = np.where(heat == 1.0, TOP, heat).astype(np.float32)
    assert len(_centernet(heat)) == 1
    assert _centernet(rounded) == _centernet(heat)  # a second sigmoid made every cell a 0.5 centre
    mask = np.zeros((1, 1, 16, 16), np.float32)
    mask[0, 0, :4, :] = 1.0
    assert _segment(mask) == [0.25]
    assert _segment(np.where(mask == 1.0, TOP, mask).astype(np.float32)) == [0.25]


def test_logits_still_get_their_sigmoid() -> None:
    logits = np.array([-6.0, 0.0, 6.0], np.float32)
    assert np.allclose(probabilities(logits), sigmoid(logits))
    assert not in_unit_range(np.array([0.5, 1.01], np.float32))  # past rounding: a logit
    assert in_unit_range(np.array([], np.float32))


def test_a_nan_in_a_probability_map_does_not_make_it_logits() -> None:
    """A NaN pixel is no evidence either way: the rest of the map decides, and it decodes as without it."""
    POSTPROCESSORS.load_builtins()
    decode = make_postprocessor(POSTPROCESSORS.configs["text"](type="text"), ["prob"], [[1, 1, SIZE, SIZE]], {},
                                (SIZE, SIZE))  # fmt: skip
    prob = np.zeros((1, 1, SIZE, SIZE), np.float32)
    prob[0, 0, 10:18, 6:58] = 0.9
    holed = prob.copy()
    holed[0, 0, 40, 40] = np.nan
    assert [d["box"] for d in decode([holed])["detections"]] == [d["box"] for d in decode([prob])["detections"]]
    assert np.isnan(probabilities(holed)).sum() == 1
    assert float(np.nanmax(probabilities(holed))) == pytest.approx(0.9)  # kept, not squashed through a sigmoid
    assert in_unit_range(np.full(3, np.nan, np.float32))  # nothing to go by: left as it is
    assert not in_unit_range(np.array([np.nan, 4.0], np.float32))  # a logit beside it still decides


@settings(max_examples=60, deadline=None)
@given(
    arrays(np.float32, (4, 4), elements=st.floats(0.0, 1.0, width=32)),
    st.sampled_from([255, 127]),  # uint8 and symmetric int8 steps
)
def test_any_8_bit_probability_map_stays_a_probability_map(p: np.ndarray[Any, Any], steps: int) -> None:
    scale = np.nextafter(np.float32(1.0 / steps), np.float32(1.0))  # rounded up, as ORT's quantizer may
    dequantized = np.round(p / scale).astype(np.float32) * scale
    assert np.array_equal(probabilities(dequantized), np.clip(dequantized, 0.0, 1.0))


def _classifier(path: Path, classes: int) -> Path:
    """x [1, 8] -> MatMul -> Softmax over `classes`: one class far ahead, the rest a long tail of small ones."""
    rng = np.random.default_rng(2)
    w = rng.normal(0.0, 0.3, (8, classes)).astype(np.float32)
    w[:, 7] = 1.2  # class 7 wins on the all-ones input
    nodes = [helper.make_node("MatMul", ["x", "w"], ["logits"]), helper.make_node("Softmax", ["logits"], ["p"])]
    graph = helper.make_graph(
        nodes,
        "cls",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("p", TensorProto.FLOAT, [1, classes])],
        initializer=[numpy_helper.from_array(w, "w")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


def test_a_quantized_softmax_is_published_as_the_probabilities_it_gives(tmp_path: Path) -> None:
    classes = 1000
    feed = {"x": np.ones((1, 8), np.float32)}
    fp32 = _classifier(tmp_path / "cls.onnx", classes)
    int8 = tmp_path / "cls.int8.onnx"
    _quantize(fp32, int8, feed)
    ref = np.asarray(ort.InferenceSession(str(fp32), providers=["CPUExecutionProvider"]).run(None, feed)[0])
    out = np.asarray(ort.InferenceSession(str(int8), providers=["CPUExecutionProvider"]).run(None, feed)[0])
    assert abs(float(out.sum()) - 1.0) > 1e-3  # the tail rounds away: the sum is off by more than float rounding
    POSTPROCESSORS.load_builtins()
    post = POSTPROCESSORS.configs["classify"](type="classify", top_k=1)
    decode = make_postprocessor(post, ["p"], [[1, classes]], {}, (8, 1))
    top = decode([out])["top"][0]
    assert top["index"] == 7
    assert top["score"] == pytest.approx(float(out[0, 7]), abs=1e-4)  # not put through a second softmax
    assert top["score"] == pytest.approx(float(ref[0, 7]), abs=0.02)
    logits = np.linspace(-3.0, 3.0, classes, dtype=np.float32)[None]
    assert decode([logits])["top"][0]["score"] < 0.01  # logits still get their softmax
