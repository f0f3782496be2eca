"""Multi-object tracking: stable `track_id`s across frames, and `enter` / `leave` events.

ByteTrack-style association, small enough to read: each track predicts its box with a constant-velocity
model (an alpha-beta filter on the box corners); detections of the same label are matched to the
predictions (or, when that overlaps more, to where the track was last seen: it stopped) by IoU,
greedily from the best overlap, the confident detections (score >= `high_score`) first and the weak
ones after, which may only keep an existing track alive (a person half hidden for a
few frames keeps their id). A track is confirmed after `min_hits` matches (`enter`, stamped with the
time it was first seen) and ends `max_age_s` after its last match (`leave`, stamped with the time it was
last seen, with its duration and best score). An unconfirmed track that misses a frame is dropped.
A confirmed track whose box stays put (IoU >= STILL_IOU with where it settled) for `stationary_s` gets
one `stationary` event; it may get another after it moved and settled again.

The pipeline's scene (edged/pipeline/scene.py) runs it after masks and adds the zone events.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import Field

from edged.core.settings import Strict

ALPHA = 0.8  # how much of a matched detection's offset from the prediction the box takes
BETA = 0.3  # how much of it goes into the velocity
STILL_IOU = 0.8  # a box overlapping where the track settled this much has not moved


class TrackingConfig(Strict):
    """Stable track ids for detections, and enter/leave events (detect pipelines only)."""

    enabled: bool = Field(False, description="Track detections across frames.")
    min_hits: int = Field(3, ge=1, le=100, description="Matches before a track is confirmed (and `enter` is sent).")
    max_age_s: float = Field(1.0, gt=0, description="A track unseen this long has left (`leave`).")
    iou_threshold: float = Field(0.3, gt=0, lt=1, description="Least overlap of prediction and detection to match.")
    high_score: float = Field(
        0.5, ge=0, le=1, description="Detections scoring this much start tracks; weaker ones only keep tracks alive."
    )
    stationary_s: float = Field(
        10.0, ge=0, description="A track that has not moved for this long gets a `stationary` event (0 = never)."
    )


def iou(a: npt.NDArray[np.float64], b: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """IoU of every box in `a` [N, 4] with every box in `b` [M, 4] (x1, y1, x2, y2): [N, M]."""
    x1 = np.maximum(a[:, None, 0], b[None, :, 0])
    y1 = np.maximum(a[:, None, 1], b[None, :, 1])
    x2 = np.minimum(a[:, None, 2], b[None, :, 2])
    y2 = np.minimum(a[:, None, 3], b[None, :, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    union = area_a[:, None] + area_b[None, :] - inter
    out: npt.NDArray[np.float64] = np.where(union > 0, inter / np.maximum(union, 1e-9), 0.0)
    return out


@dataclass
class Track:
    """One object followed over time."""

    track_id: int
    label: str
    box: npt.NDArray[np.float64]
    first_ts: float
    last_ts: float
    best_score: float
    hits: int = 1
    confirmed: bool = False
    velocity: npt.NDArray[np.float64] = field(default_factory=lambda: np.zeros(4))
    settled: npt.NDArray[np.float64] | None = None  # where it last came to rest (None: not yet)
    settled_ts: float = 0.0
    stationary: bool = False  # the `stationary` event of this rest was sent

    def predict(self, ts: float) -> npt.NDArray[np.float64]:
        """Where the box should be at `ts`."""
        return self.box + self.velocity * (ts - self.last_ts)

    def match(self, box: npt.NDArray[np.float64], score: float, ts: float, *, stopped: bool = False) -> None:
        """Take a detection: the alpha-beta update of box and velocity; `stopped`: it was found where it was
        last seen, not where it was heading (it stopped while unseen): it starts again from there, at rest."""
        dt = ts - self.last_ts
        predicted = self.predict(ts)
        residual = box - predicted
        if stopped:
            self.box, self.velocity = box.copy(), np.zeros(4)
        else:
            self.box = predicted + ALPHA * residual
            if dt > 0:
                self.velocity = self.velocity + BETA * residual / dt
        self.last_ts = ts
        self.hits += 1
        self.best_score = max(self.best_score, score)


class Tracker:
    """Feed it each frame's detections in capture order; it numbers them and says who came and went."""

    def __init__(self, cfg: TrackingConfig) -> None:
        self.cfg = cfg
        self.tracks: list[Track] = []
        self._next_id = 1

    @property
    def active(self) -> int:
        """Confirmed tracks right now."""
        return sum(t.confirmed for t in self.tracks)

    def update(self, detections: Sequence[dict[str, Any]], ts: float) -> list[dict[str, Any]]:
        """Set `track_id` on each detection that belongs to a confirmed track (None otherwise); return the
        events of this frame: `enter` and `leave` dicts."""
        for det in detections:
            det["track_id"] = None
        self._start_tracks(detections, self._associate(detections, ts), ts)
        events = [self._confirm(t) for t in self.tracks if not t.confirmed and t.hits >= self.cfg.min_hits]
        events += [self._event("stationary", t, ts) for t in self.tracks if self._still(t, ts)]
        events += self._expire(ts)
        for det in detections:
            track = det.pop("_track", None)
            if track is not None and track.confirmed:
                det["track_id"] = track.track_id
        return events

    def _start_tracks(self, detections: Sequence[dict[str, Any]], unmatched: list[int], ts: float) -> None:
        """A confident detection that matched no track starts one (tentative)."""
        for i in unmatched:
            det = detections[i]
            if float(det["score"]) >= self.cfg.high_score:
                box = np.asarray(det["box"][:4], np.float64)
                det["_track"] = Track(self._next_id, str(det["label"]), box, ts, ts, float(det["score"]))
                self.tracks.append(det["_track"])
                self._next_id += 1

    def _confirm(self, track: Track) -> dict[str, Any]:
        track.confirmed = True
        return self._event("enter", track, track.first_ts)

    def _still(self, track: Track, ts: float) -> bool:
        """Whether a confirmed track seen in this frame has now been still for `stationary_s` (once per rest)."""
        if not track.confirmed or track.last_ts != ts or not self.cfg.stationary_s:
            return False
        if track.settled is None or iou(track.settled[None, :], track.box[None, :])[0, 0] < STILL_IOU:
            track.settled, track.settled_ts, track.stationary = track.box.copy(), ts, False
            return False
        if track.stationary or ts - track.settled_ts < self.cfg.stationary_s:
            return False
        track.stationary = True
        return True

    def _expire(self, ts: float) -> list[dict[str, Any]]:
        """Drop tentative tracks that missed this frame and confirmed ones unseen for max_age_s (`leave`)."""
        events: list[dict[str, Any]] = []
        kept: list[Track] = []
        for track in self.tracks:
            if track.last_ts == ts or (track.confirmed and ts - track.last_ts <= self.cfg.max_age_s):
                kept.append(track)
            elif track.confirmed:
                events.append(self._event("leave", track, track.last_ts))
        self.tracks = kept
        return events

    def _associate(self, detections: Sequence[dict[str, Any]], ts: float) -> list[int]:
        """Match detections to tracks (confident ones first); the indices of the detections left over."""
        free = list(range(len(detections)))
        open_tracks = list(self.tracks)
        for confident in (True, False):
            chosen = [i for i in free if (float(detections[i]["score"]) >= self.cfg.high_score) == confident]
            if not chosen or not open_tracks:
                continue
            boxes = np.asarray([detections[i]["box"][:4] for i in chosen], np.float64)
            predicted = np.asarray([t.predict(ts) for t in open_tracks], np.float64)
            # where it was last seen too: after a long gap (a motion-gated pipeline sees a parked car only at
            # each keep-alive) the velocity of its arrival would carry the prediction far past it
            ahead, still = iou(predicted, boxes), iou(np.asarray([t.box for t in open_tracks], np.float64), boxes)
            overlap = np.maximum(ahead, still)
            for ti, di in zip(*np.unravel_index(np.argsort(-overlap, axis=None), overlap.shape), strict=True):
                if overlap[ti, di] < self.cfg.iou_threshold:
                    break
                track, det_index = open_tracks[ti], chosen[di]
                det = detections[det_index]
                if track.last_ts == ts or det_index not in free or str(det["label"]) != track.label:
                    continue
                track.match(boxes[di], float(det["score"]), ts, stopped=bool(still[ti, di] > ahead[ti, di]))
                det["_track"] = track
                free.remove(det_index)
            open_tracks = [t for t in open_tracks if t.last_ts != ts]
        return free

    @staticmethod
    def _event(kind: str, track: Track, ts: float) -> dict[str, Any]:
        event: dict[str, Any] = {
            "type": kind,
            "ts": round(ts, 3),
            "track_id": track.track_id,
            "label": track.label,
            "box": [round(float(v), 1) for v in track.box],
        }
        if kind == "stationary":
            event["since"] = round(track.settled_ts, 3)
        if kind == "leave":
            event["duration_s"] = round(track.last_ts - track.first_ts, 3)
            event["best_score"] = round(track.best_score, 4)
        return event
