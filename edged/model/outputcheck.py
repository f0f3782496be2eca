"""Each frame's real output shapes against what the model declared and the decoder was built for: a cheap
comparison (ranks and the declared fixed sizes) before the decoder reads them. A model whose outputs change
under it (a dynamic axis that grows a channel, an output that turns up with another rank) would otherwise be
read the way the first frame was, and published as garbage."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from edged.core.errors import RefusedResultError


class OutputShapes:
    """The declared output shapes (a dynamic axis: None); `check` raises RefusedResultError on a frame whose
    outputs differ in count, rank or a fixed size."""

    def __init__(self, names: list[str], declared: list[list[Any]]) -> None:
        self.names = names
        self.declared = [tuple(d if isinstance(d, int) and d >= 0 else None for d in shape) for shape in declared]

    def check(self, outputs: list[npt.NDArray[Any]]) -> None:
        """Nothing when each output has its declared rank and fixed sizes."""
        if len(outputs) != len(self.declared):
            raise RefusedResultError(f"the model gave {len(outputs)} outputs, not the {len(self.declared)} it declares")
        for name, want, out in zip(self.names, self.declared, outputs, strict=True):
            got = np.shape(out)
            if len(got) != len(want) or any(w is not None and w != g for w, g in zip(want, got, strict=True)):
                shown = [w if w is not None else "?" for w in want]
                raise RefusedResultError(
                    f"output {name} is {list(got)} on this frame, not {shown} as the model declares and the "
                    "decoder reads it"
                )
