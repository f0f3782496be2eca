"""`raw`: every output summarised (name, shape, dtype, min/max/mean, the first values), for a model no
decoder reads."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field

from edged.core.settings import Strict
from edged.model.postprocess import POSTPROCESSORS, RAW, Postprocessor, with_reading
from edged.model.preprocess import Geometry


class RawConfig(Strict):
    """Raw outputs: shape, dtype and summary per output; values included up to a cap."""

    PRODUCES: ClassVar[str] = RAW

    type: Literal["raw"] = Field(description="Postprocessor type key.")
    max_values: int = Field(64, ge=0, description="Include at most this many values per output.")


class Raw:
    """Every output: name, shape, dtype, min/max/mean, and its first `max_values` values."""

    def __init__(self, cfg: RawConfig, names: list[str]) -> None:
        self.max_values = cfg.max_values
        self.names = names

    def __call__(self, outputs: list[npt.NDArray[Any]], geometry: Geometry | None = None) -> dict[str, Any]:  # noqa: ARG002
        """Return {"outputs": [...]} with values capped so a message stays small."""
        items = []
        for name, out in zip(self.names, outputs, strict=True):
            arr = np.asarray(out)
            flat = arr.reshape(-1)
            numeric = flat.astype(np.float64) if flat.size and np.issubdtype(flat.dtype, np.number) else None
            items.append(
                {
                    "name": name,
                    "shape": list(arr.shape),
                    "dtype": str(arr.dtype),
                    "min": float(numeric.min()) if numeric is not None else None,
                    "max": float(numeric.max()) if numeric is not None else None,
                    "mean": float(numeric.mean()) if numeric is not None else None,
                    "values": flat[: self.max_values].tolist(),
                    "truncated": bool(flat.size > self.max_values),
                }
            )
        return {"outputs": items}


@POSTPROCESSORS.register("raw", RawConfig)
def make_raw(
    cfg: RawConfig,
    output_names: list[str],
    output_shapes: list[list[Any]],  # noqa: ARG001  (every factory takes the same arguments)
    metadata: dict[str, str],  # noqa: ARG001
    input_size: tuple[int, int] | None,  # noqa: ARG001
) -> Postprocessor:
    """`raw`: every output summarised."""
    return with_reading(Raw(cfg, output_names), f"raw: every output ({', '.join(output_names)}), summarised")
