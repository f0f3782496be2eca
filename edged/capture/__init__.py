"""Stage 1, capture: a camera, video file, stream or sensor enters; `Frame`s leave through a `FrameSlot`.

One module per source type (camera.py, sensor.py with its transports and formats), each registering its
type key, config model and class in `SOURCES`.
"""

from edged.capture.base import SOURCES, Frame, FrameSlot, Source, make_source

__all__ = ["SOURCES", "Frame", "FrameSlot", "Source", "make_source"]
