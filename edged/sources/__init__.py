"""Frame sources, one module per type, registered by their config `type` key."""

from edged.sources import camera as camera
from edged.sources.base import SOURCES, Frame, FrameSlot, Source, make_source

__all__ = ["SOURCES", "Frame", "FrameSlot", "Source", "make_source"]
