"""A model's other inputs: beside the frame (or sensor window), a model may take constants (a sample rate, a
threshold) and a recurrent state that it returns as an output and takes back at the next run (a voice
activity detector, a streaming audio model). `model.inputs` names them:

```yaml
model:
  path: silero_vad.onnx
  inputs:
    sr: {value: 16000}                 # a constant, in the input's own type and shape
    state: {state_from: stateN}        # starts at zeros, then each run's `stateN` output
```

The frame goes to the one input `model.inputs` does not name. A model with a recurrent state runs one
window at a time, in order (concurrency 1), and its state starts over when the model is loaded.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import Field, model_validator

from edged.core.errors import ModelError
from edged.core.settings import Strict

ORT_DTYPES: dict[str, type[np.generic]] = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


class InputsError(ModelError):
    """The model's inputs and `model.inputs` do not fit (check-config names `model.inputs` for it)."""


class ModelInput(Strict):
    """One of the model's other inputs: a constant, or a recurrent state carried from an output."""

    value: float | list[float] | None = Field(
        None, description="A constant fed at every run (a number, or a list filling the input's shape)."
    )
    state_from: str | None = Field(
        None, description="The output fed back into this input at the next run (a recurrent state; zeros first)."
    )
    shape: list[int] | None = Field(
        None, description="The input's shape where the model leaves dimensions open (default: 1 for each)."
    )

    @model_validator(mode="after")
    def _one_source(self) -> ModelInput:
        if (self.value is None) == (self.state_from is None):
            raise ValueError("give either value (a constant) or state_from (an output carried back)")
        return self


class Feeds:
    """The frame's input name and the feed of every run: the frame, the constants, the current state."""

    def __init__(self, inputs: list[Any], outputs: list[str], given: dict[str, ModelInput]) -> None:
        names = [i.name for i in inputs]
        unknown = [n for n in given if n not in names]
        if unknown:
            raise InputsError(f"model.inputs names {unknown}, which the model does not take; its inputs: {names}")
        free = [i for i in inputs if i.name not in given]
        if len(free) != 1:
            described = ", ".join(f"{i.name} {list(i.shape)}" for i in inputs)
            missing = [i.name for i in free[1:]] if free else []
            raise InputsError(
                f"the model has {len(inputs)} inputs ({described}); edged feeds the frame or sensor window to "
                f"one and needs model.inputs for the others ({', '.join(missing) or 'every input is named there'}): "
                "a constant (value) or a recurrent state (state_from: the output that carries it)"
            )
        self.frame = free[0]
        self.constants: dict[str, npt.NDArray[Any]] = {}
        self.carried: dict[str, str] = {}  # input <- output
        self._initial: dict[str, npt.NDArray[Any]] = {}
        for inp in inputs:
            spec = given.get(inp.name)
            if spec is None:
                continue
            array = _array(inp, spec)
            if spec.state_from is None:
                self.constants[inp.name] = array
                continue
            if spec.state_from not in outputs:
                raise InputsError(
                    f"model.inputs.{inp.name}.state_from: no output {spec.state_from!r}; outputs: {outputs}"
                )
            self.carried[inp.name] = spec.state_from
            self._initial[inp.name] = array
        self._lock = threading.Lock()
        self._state = dict(self._initial)

    @property
    def recurrent(self) -> bool:
        """Whether runs depend on the previous one (then they must go one at a time, in order)."""
        return bool(self.carried)

    def feed(self, tensor: npt.NDArray[Any]) -> dict[str, npt.NDArray[Any]]:
        """The inputs of one run."""
        with self._lock:
            return {self.frame.name: tensor, **self.constants, **self._state}

    def keep(self, named: dict[str, npt.NDArray[Any]]) -> None:
        """Carry this run's state outputs into the next run."""
        if self.carried:
            with self._lock:
                self._state = {inp: np.asarray(named[out]) for inp, out in self.carried.items()}

    def reset(self) -> None:
        """Start the state over (after warm-up runs on blank input)."""
        with self._lock:
            self._state = dict(self._initial)


def _array(inp: Any, spec: ModelInput) -> npt.NDArray[Any]:
    dtype = ORT_DTYPES.get(inp.type)
    if dtype is None:
        raise InputsError(f"model.inputs.{inp.name}: edged cannot feed an input of type {inp.type}")
    shape = spec.shape or [d if isinstance(d, int) and d > 0 else 1 for d in inp.shape]
    if spec.shape is not None and len(spec.shape) != len(inp.shape):
        raise InputsError(f"model.inputs.{inp.name}.shape {spec.shape} does not fit the input's {list(inp.shape)}")
    if spec.state_from is not None:
        return np.zeros(shape, dtype=dtype)
    value = np.asarray(spec.value, dtype=dtype)
    if value.size == 1:
        return np.full(shape, value.reshape(-1)[0], dtype=dtype) if shape else value.reshape(())
    if value.size != int(np.prod(shape)):
        raise InputsError(f"model.inputs.{inp.name}.value has {value.size} numbers for an input of shape {shape}")
    return value.reshape(shape)
