"""The type of a `postprocess` key: at run time the union of every registered decoder's config model (the
built-ins of edged/model/decoders/ and the plugins), told apart by `type`; mypy sees what they all have."""

from __future__ import annotations

from typing import TYPE_CHECKING

from edged.model.postprocess import POSTPROCESSORS

if TYPE_CHECKING:
    from edged.model.postprocess import DecoderSettings as PostprocessConfig
else:
    PostprocessConfig = POSTPROCESSORS.config_union()

__all__ = ["PostprocessConfig"]
