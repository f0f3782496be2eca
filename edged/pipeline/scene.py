"""What a detection pipeline makes of each frame's detections, in capture order: masks drop detections
in areas that do not matter, zones count what is where, the tracker gives stable `track_id`s, and the
changes become events (`enter`, `leave`, `zone_enter`, `zone_leave`, `stationary`).

Masks and zones test one point of each box, the pipeline's `reference_point` (bottom-centre by default:
where a person stands or a car touches the road). Zone counts are per frame and count every detection;
zone events follow confirmed tracks. The best-scoring frame of each track is kept (a reference to the
frame the source already made, no copy; at most MAX_BEST tracks) for the `leave` event's snapshot.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy.typing as npt
from pydantic import Field

from edged.core.geometry import Point, Points, Polygon, reference_point
from edged.core.settings import NAME_PATTERN, Strict
from edged.pipeline.tracking import Tracker, TrackingConfig

BEST_IMAGE = "_best_image"  # a `leave` event's best frame, taken out before the event is sent
MAX_BEST = 64  # tracks whose best frame is kept for a snapshot (the oldest tracks' pictures go first)
ReferencePoint = Literal["bottom_center", "center", "top_center"]


class ZoneConfig(Strict):
    """A named area of the image: per-frame counts, and zone events for tracked objects."""

    name: str = Field(pattern=NAME_PATTERN, description="Zone name (a key in results and events).")
    points: Points = Field(description="The polygon: at least 3 points in frame pixels or fractions 0..1.")
    labels: list[str] = Field(default_factory=list, description="Labels that count in this zone (empty: all).")


@dataclass
class Best:
    """The best sighting of a track so far: its score, the frame and the box."""

    score: float
    image: npt.NDArray[Any]
    box: list[float]


class Scene:
    """Masks, zones, tracking and events for one pipeline. Not thread-safe: used inside the turn."""

    def __init__(
        self,
        *,
        masks: Sequence[Sequence[Point]],
        zones: Sequence[ZoneConfig],
        tracking: TrackingConfig,
        reference: str = "bottom_center",
        declared: tuple[int, int] | None = None,
    ) -> None:
        self.mask_points = [list(m) for m in masks]
        self.zone_cfgs = list(zones)
        self.reference = reference
        self.declared = declared
        self.tracker = Tracker(tracking) if tracking.enabled else None
        self._size: tuple[int, int] = (0, 0)
        self._masks: list[Polygon] = []
        self._zones: list[tuple[ZoneConfig, Polygon]] = []
        self._in_zones: dict[int, frozenset[str]] = {}  # confirmed track -> the zones it is in
        self.best: dict[int, Best] = {}

    @property
    def active_tracks(self) -> int:
        """Confirmed tracks right now (0 without tracking)."""
        return self.tracker.active if self.tracker is not None else 0

    def _setup(self, size: tuple[int, int]) -> None:
        if size != self._size:  # the first frame, or the source changed its resolution (set last: a
            self._masks = [Polygon(p, size, self.declared) for p in self.mask_points]  # worker at once
            self._zones = [(z, Polygon(z.points, size, self.declared)) for z in self.zone_cfgs]  # sees old
            self._size = size  # or new polygons, both whole)

    def mask(self, result: dict[str, Any], image: npt.NDArray[Any]) -> None:
        """Drop the detections in the masks (in place; `masked` counts them). Keeps no state but the
        polygons' scale, so the workers may call it at once, before their turn."""
        detections = result.get("detections")
        if not isinstance(detections, list) or not self.mask_points:
            return
        height, width = image.shape[:2]
        self._setup((width, height))
        kept = [d for d in detections if not self._masked(d)]
        if len(kept) != len(detections):
            result["masked"] = len(detections) - len(kept)
            result["detections"] = kept

    def update(self, result: dict[str, Any], ts: float, image: npt.NDArray[Any]) -> list[dict[str, Any]]:
        """Zones on `result` (in place, after `mask`), track, and return this frame's events (in capture order)."""
        detections = result.get("detections")
        if not isinstance(detections, list):
            return []
        height, width = image.shape[:2]
        self._setup((width, height))
        if self._zones:
            result["zones"] = self._count_zones(detections)
        if self.tracker is None:
            return []
        events: list[dict[str, Any]] = []
        for event in self.tracker.update(detections, ts):
            if event["type"] == "leave":
                events += self._left_zones(event)
                best = self.best.pop(event["track_id"], None)
                if best is not None:  # the worker takes the picture out for the snapshot
                    event["best_box"] = [round(float(v), 1) for v in best.box]
                    event[BEST_IMAGE] = best.image
            events.append(event)
        events += self._zone_changes(detections, ts, image)
        return events

    def _point(self, det: dict[str, Any]) -> tuple[float, float]:
        return reference_point([float(v) for v in det["box"][:4]], self.reference)

    def _masked(self, det: dict[str, Any]) -> bool:
        x, y = self._point(det)
        return any(m.contains(x, y) for m in self._masks)

    def _count_zones(self, detections: list[dict[str, Any]]) -> dict[str, Any]:
        counts: dict[str, Counter[str]] = {z.name: Counter() for z, _ in self._zones}
        for det in detections:
            x, y = self._point(det)
            label = str(det["label"])
            inside = [z.name for z, poly in self._zones if (not z.labels or label in z.labels) and poly.contains(x, y)]
            det["zones"] = inside
            for name in inside:
                counts[name][label] += 1
        return {name: {"count": sum(c.values()), "labels": dict(sorted(c.items()))} for name, c in counts.items()}

    def _zone_changes(
        self, detections: list[dict[str, Any]], ts: float, image: npt.NDArray[Any]
    ) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for det in detections:
            track_id = det.get("track_id")
            if track_id is None:
                continue
            self._keep_best(track_id, det, image)
            now = frozenset(det.get("zones", ()))
            before = self._in_zones.get(track_id, frozenset())
            self._in_zones[track_id] = now
            common = {"ts": round(ts, 3), "track_id": track_id, "label": str(det["label"])}
            events += [{"type": "zone_leave", **common, "zone": z} for z in sorted(before - now)]
            events += [{"type": "zone_enter", **common, "zone": z} for z in sorted(now - before)]
        return events

    def _left_zones(self, leave: dict[str, Any]) -> list[dict[str, Any]]:
        zones = self._in_zones.pop(leave["track_id"], frozenset())
        common = {"ts": leave["ts"], "track_id": leave["track_id"], "label": leave["label"]}
        return [{"type": "zone_leave", **common, "zone": z} for z in sorted(zones)]

    def _keep_best(self, track_id: int, det: dict[str, Any], image: npt.NDArray[Any]) -> None:
        score = float(det["score"])
        best = self.best.get(track_id)
        if best is None or score > best.score:
            self.best.pop(track_id, None)  # re-inserted last: the dict's order is the age of the picture
            self.best[track_id] = Best(score, image, [float(v) for v in det["box"][:4]])
            while len(self.best) > MAX_BEST:
                del self.best[next(iter(self.best))]
