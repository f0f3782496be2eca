"""A pipeline's config section, put together from the stages' own sections: the source (a union of
every registered source type), the model and its preprocessing, the postprocessor (a union of every
registered one), the publish filter (a union of every registered mode) and snapshots."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field, ValidationInfo, field_validator, model_validator

from edged.capture.base import SOURCES
from edged.capture.motion import MotionConfig
from edged.capture.sensor import SensorSourceConfig
from edged.core.geometry import polygon_problem
from edged.core.settings import NAME_PATTERN, Strict
from edged.model.postprocess import POSTPROCESSORS, ClassifyConfig
from edged.model.settings import ModelConfig, PreprocessConfig
from edged.pipeline.publish import PUBLISH_FILTERS, EveryConfig
from edged.pipeline.snapshots import SnapshotConfig

if TYPE_CHECKING:  # mypy sees the built-in parts; at run time the unions hold whatever is registered
    from edged.capture.camera import CameraSourceConfig
    from edged.model.detect import DetectConfig
    from edged.model.postprocess import RawConfig
    from edged.pipeline.publish import IntervalConfig, OnChangeConfig

    SourceConfig = CameraSourceConfig | SensorSourceConfig
    PostprocessConfig = ClassifyConfig | RawConfig | DetectConfig
    PublishConfig = EveryConfig | OnChangeConfig | IntervalConfig
else:
    SourceConfig = SOURCES.config_union()
    PostprocessConfig = POSTPROCESSORS.config_union()
    PublishConfig = PUBLISH_FILTERS.config_union()


class PipelineConfig(Strict):
    """One source -> one model -> results on one topic."""

    name: str = Field(pattern=NAME_PATTERN, description="Pipeline name; part of the topic and `seq` key.")
    source: SourceConfig = Field(description="Where frames come from; `type` picks the source (see edged/capture/).")
    frame_size: tuple[int, int] | None = Field(
        None,
        description="The source's frame size [width, height] in pixels, for polygons given in pixels (default: "
        "source width and height). Polygons are scaled when the frames come in another size.",
    )
    motion: MotionConfig = Field(default_factory=MotionConfig)
    model: ModelConfig
    preprocess: PreprocessConfig = Field(default_factory=PreprocessConfig)
    postprocess: PostprocessConfig = Field(default_factory=lambda: ClassifyConfig(type="classify"))
    publish: PublishConfig = Field(default_factory=EveryConfig)
    snapshot: SnapshotConfig = Field(default_factory=SnapshotConfig)

    @field_validator("motion")
    @classmethod
    def _motion_fits(cls, value: MotionConfig, info: ValidationInfo) -> MotionConfig:
        source = info.data.get("source")
        if value.enabled and isinstance(source, SensorSourceConfig):
            raise ValueError("motion gating needs images; a sensor source has none")
        frame = declared_frame(info.data.get("frame_size"), source)
        for i, points in enumerate(value.mask):
            problem = polygon_problem(points, frame)
            if problem:
                raise ValueError(f"mask {i + 1}: {problem}")
        return value

    @model_validator(mode="after")
    def _preprocess_is_for_images(self) -> PipelineConfig:
        if isinstance(self.source, SensorSourceConfig) and self.preprocess.model_fields_set:
            raise ValueError(
                "preprocess applies to images; a sensor source shapes its windows with source.window, hop, "
                "channels, layout, normalize, mean and std"
            )
        return self


def declared_frame(frame_size: tuple[int, int] | None, source: object) -> tuple[int, int] | None:
    """The frame size polygons in pixels refer to: `frame_size`, else the camera's width and height."""
    if frame_size is not None:
        return frame_size
    width, height = getattr(source, "width", None), getattr(source, "height", None)
    return (width, height) if width and height else None
