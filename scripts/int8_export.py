"""What the demo-model training scripts share: symmetric int8 QDQ quantization and metadata writing.

Imported by train_digits.py and train_vibration.py (scripts/ is on their sys.path).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnx
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quant_pre_process,
    quantize_static,
)

Array = npt.NDArray[np.float32]


class Calibration(CalibrationDataReader):  # type: ignore[misc]  # onnxruntime ships no type hints
    """Feeds model inputs one at a time to the int8 calibrator."""

    def __init__(self, input_name: str, x: Array) -> None:
        self._name = input_name
        self._x = x
        self._i = 0

    def get_next(self) -> dict[str, Array] | None:
        if self._i >= len(self._x):
            return None
        self._i += 1
        return {self._name: self._x[self._i - 1 : self._i]}

    def rewind(self) -> None:
        self._i = 0


def quantize(fp32: Path, int8: Path, input_name: str, calib: Array, workdir: Path) -> None:
    """Static int8 quantization: QDQ, per-channel weights, min/max calibration.

    Weights and activations are both signed int8 and symmetric (every zero point is 0): that is the
    only QDQ form TensorRT accepts, and TensorRT comes first in edged's default provider list. The CPU
    provider runs it as well.

    Weights use 7 bits (`reduce_range`): on x86 CPUs without VNNI (AVX2 only, e.g. many AMD EPYC and older
    Intel parts) ONNX Runtime's int8 kernels add pairs of u8 x s8 products in 16 bits, which saturates
    with full-range weights; the demo model lost 4.5 points of held-out accuracy that way (95.5% vs
    100% with 7-bit weights, same machine). ARM (the Pi) and VNNI CPUs are unaffected either way.
    """
    prepared = workdir / "prepared.onnx"
    quant_pre_process(str(fp32), str(prepared), skip_symbolic_shape=True)
    quantize_static(
        str(prepared),
        str(int8),
        Calibration(input_name, calib),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        reduce_range=True,
        weight_type=QuantType.QInt8,
        activation_type=QuantType.QInt8,
        calibrate_method=CalibrationMethod.MinMax,
        extra_options={"ActivationSymmetric": True, "WeightSymmetric": True},
    )
    # the pre-processing optimizer declares every domain ONNX Runtime knows; keep the ones in use
    model = onnx.load(str(int8))
    used = {n.domain for n in model.graph.node} | {""}
    kept = [op for op in model.opset_import if op.domain in used]
    del model.opset_import[:]
    model.opset_import.extend(kept)
    onnx.checker.check_model(model)
    onnx.save(model, str(int8))


def set_metadata(path: Path, props: dict[str, str]) -> None:
    """Replace the model's metadata_props with `props`."""
    model = onnx.load(str(path))
    del model.metadata_props[:]
    onnx.helper.set_model_props(model, props)
    onnx.save(model, str(path))
