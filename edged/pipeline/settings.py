"""A pipeline's config section, put together from the stages' own sections: the source (a union of
every registered source type), the model and its preprocessing, the postprocessor (a union of every
registered one), the publish filter (a union of every registered mode) and snapshots."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field, ValidationInfo, field_validator, model_validator

from edged.capture.base import SOURCES
from edged.capture.motion import MotionConfig
from edged.capture.sensor import SensorSourceConfig
from edged.core.geometry import Point, Points, polygon_problem
from edged.core.settings import NAME_PATTERN, Strict
from edged.model.decoders.classify import ClassifyConfig
from edged.model.decoderunion import PostprocessConfig
from edged.model.postprocess import DETECTIONS, produces, producing
from edged.model.settings import ModelConfig, PreprocessConfig
from edged.pipeline.resultfilter import PUBLISH_FILTERS, EveryConfig
from edged.pipeline.scene import ReferencePoint, ZoneConfig
from edged.pipeline.secondary import SecondaryConfig
from edged.pipeline.snapshots import SnapshotConfig
from edged.pipeline.tracking import TrackingConfig

if TYPE_CHECKING:  # mypy sees the built-in parts; at run time the unions hold whatever is registered
    from edged.capture.camera import CameraSourceConfig
    from edged.pipeline.resultfilter import EventsConfig, IntervalConfig, OnChangeConfig

    SourceConfig = CameraSourceConfig | SensorSourceConfig
    PublishConfig = EveryConfig | OnChangeConfig | IntervalConfig | EventsConfig
else:
    SourceConfig = SOURCES.config_union()
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
    masks: list[Points] = Field(
        default_factory=list,
        description="Polygons whose detections are dropped (their reference point inside), and where motion is "
        "ignored too. Points in frame pixels or fractions 0..1.",
    )
    zones: list[ZoneConfig] = Field(default_factory=list, description="Named areas: per-zone counts and events.")
    reference_point: ReferencePoint = Field(
        "bottom_center", description="The point of a box that masks and zones test: bottom_center, center, top_center."
    )
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    secondary: list[SecondaryConfig] = Field(
        default_factory=list, description="Models run on the crops of selected detections (see docs/models.md)."
    )
    publish: PublishConfig = Field(default_factory=EveryConfig)
    snapshot: SnapshotConfig = Field(default_factory=SnapshotConfig)

    @field_validator("motion")
    @classmethod
    def _motion_fits(cls, value: MotionConfig, info: ValidationInfo) -> MotionConfig:
        source = info.data.get("source")
        if value.enabled and isinstance(source, SensorSourceConfig):
            raise ValueError("motion gating needs images; a sensor source has none")
        check_masks(value.mask, declared_frame(info.data.get("frame_size"), source))
        return value

    @field_validator("masks")
    @classmethod
    def _masks_fit(cls, value: list[list[Point]], info: ValidationInfo) -> list[list[Point]]:
        check_masks(value, declared_frame(info.data.get("frame_size"), info.data.get("source")))
        return value

    @field_validator("zones")
    @classmethod
    def _zones_fit(cls, value: list[ZoneConfig], info: ValidationInfo) -> list[ZoneConfig]:
        frame = declared_frame(info.data.get("frame_size"), info.data.get("source"))
        names = [z.name for z in value]
        for zone in value:
            if names.count(zone.name) > 1:
                raise ValueError(f"zone {zone.name!r} is named twice")
            problem = polygon_problem(zone.points, frame)
            if problem:
                raise ValueError(f"zone {zone.name!r}: {problem}")
        return value

    @model_validator(mode="after")
    def _scene_needs_detections(self) -> PipelineConfig:
        used = [k for k in ("masks", "zones", "secondary") if getattr(self, k)]
        used += ["tracking"] if self.tracking.enabled else []
        if used and produces(self.postprocess) != DETECTIONS:
            raise ValueError(
                f"{', '.join(used)} work on detections: set a postprocess type that gives them "
                f"({', '.join(producing(DETECTIONS))})"
            )
        names = [s.name for s in self.secondary]
        if len(set(names)) != len(names):
            raise ValueError(f"secondary model names must be unique: {names}")
        if self.publish.mode == "events" and not self.tracking.enabled:
            raise ValueError("publish mode events sends the tracker's events: enable tracking")
        gap = self.motion.keepalive_s
        if self.tracking.enabled and self.motion.enabled and gap and self.tracking.max_age_s <= gap:
            raise ValueError(
                f"tracking.max_age_s ({self.tracking.max_age_s:g}) must exceed motion.keepalive_s ({gap:g}): "
                "a still object is seen only every keepalive_s and would leave and enter again"
            )
        return self

    @model_validator(mode="after")
    def _preprocess_is_for_images(self) -> PipelineConfig:
        if isinstance(self.source, SensorSourceConfig) and self.preprocess.model_fields_set:
            raise ValueError(
                "preprocess applies to images; a sensor source shapes its windows with source.window, hop, "
                "channels, layout, normalize, mean and std"
            )
        return self


def check_masks(masks: list[list[Point]], frame: tuple[int, int] | None) -> None:
    """ValueError naming the first mask polygon that does not fit the frame."""
    for i, points in enumerate(masks):
        problem = polygon_problem(points, frame)
        if problem:
            raise ValueError(f"mask {i + 1}: {problem}")


def declared_frame(frame_size: tuple[int, int] | None, source: object) -> tuple[int, int] | None:
    """The frame size polygons in pixels refer to: `frame_size`, else the camera's width and height."""
    if frame_size is not None:
        return frame_size
    width, height = getattr(source, "width", None), getattr(source, "height", None)
    return (width, height) if width and height else None
