"""Frame sources, one module per type, registered by their config `type` key.

The source modules (camera.py, sensor.py) are imported by `make_source` when a pipeline needs them.
"""

from edged.sources.base import SOURCES, Frame, FrameSlot, Source, make_source, source_factory

__all__ = ["SOURCES", "Frame", "FrameSlot", "Source", "make_source", "source_factory"]
