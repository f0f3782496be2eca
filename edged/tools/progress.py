"""Progress bars (rich, on stderr) and a calibration data reader that advances one."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from edged.tools.common import stderr_console
from edged.tools.frames import Tensor


@contextmanager
def progress_bar(label: str, total: int, *, enabled: bool = True) -> Iterator[Callable[[int], None]]:
    """Yield `advance(n)`; shows a bar on stderr while the body runs (nothing when disabled)."""
    if not enabled:
        yield lambda _n: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: PLC0415

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=stderr_console(), transient=False) as progress:
        task = progress.add_task(label, total=total)
        yield lambda n: progress.advance(task, n)


class CountingReader:
    """onnxruntime.quantization CalibrationDataReader over ready inputs, advancing a progress bar per input."""

    def __init__(self, input_name: str, inputs: list[Tensor], advance: Callable[[int], None]) -> None:
        self._name = input_name
        self._inputs = inputs
        self._advance = advance
        self._i = 0
        self._end = len(inputs)

    def get_next(self) -> dict[str, Tensor] | None:
        """The next input feed, or None at the end (of the range `set_range` chose)."""
        if self._i >= self._end:
            return None
        self._i += 1
        self._advance(1)
        return {self._name: self._inputs[self._i - 1]}

    def rewind(self) -> None:
        """Start over (a calibrator may read the data twice)."""
        self._i = 0
        self._end = len(self._inputs)

    def set_range(self, start_index: int, end_index: int) -> None:
        """Read only inputs [start_index, end_index): ORT's strided calibration collects (and then drops the
        activations of) one such slice at a time, which is what bounds quantize's memory."""
        self._i = start_index
        self._end = min(end_index, len(self._inputs))

    def __iter__(self) -> Iterator[dict[str, Tensor]]:
        """Iterate the feeds (some ORT versions iterate instead of calling get_next)."""
        while (item := self.get_next()) is not None:
            yield item

    def __len__(self) -> int:
        """How many inputs."""
        return len(self._inputs)
