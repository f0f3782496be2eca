"""The tracker: stable ids, weak detections keeping tracks, noise never confirmed, enter/leave timing."""

from __future__ import annotations

from typing import Any

from edged.pipeline.tracking import Tracker, TrackingConfig


def det(x: float, y: float, label: str = "car", score: float = 0.9, size: float = 40) -> dict[str, Any]:
    return {"label": label, "score": score, "box": [x, y, x + size, y + size]}


def run(tracker: Tracker, frames: list[list[dict[str, Any]]], dt: float = 0.1) -> tuple[list[list[Any]], list[Any]]:
    ids, events = [], []
    for i, dets in enumerate(frames):
        events += tracker.update(dets, i * dt)
        ids.append([d["track_id"] for d in dets])
    return ids, events


def test_two_objects_passing_each_other_keep_their_ids() -> None:
    tracker = Tracker(TrackingConfig(enabled=True, min_hits=2))
    frames = [[det(10 + 15 * i, 100), det(300 - 15 * i, 120)] for i in range(20)]  # they cross at frame ~10
    ids, events = run(tracker, frames)
    assert ids[0] == [None, None]  # not confirmed yet
    assert all(frame == [1, 2] for frame in ids[1:])
    assert [(e["type"], e["track_id"], e["ts"]) for e in events] == [("enter", 1, 0.0), ("enter", 2, 0.0)]


def test_a_weak_detection_keeps_a_track_and_a_short_gap_keeps_its_id() -> None:
    tracker = Tracker(TrackingConfig(enabled=True, min_hits=2, max_age_s=0.5))
    frames = [[det(10 + 5 * i, 50)] for i in range(5)]
    frames += [[det(35, 50, score=0.3)], [], [], [det(50, 50)]]  # weak, then unseen for 0.2 s
    ids, events = run(tracker, frames)
    assert {i for frame in ids[1:] for i in frame} == {1}
    assert [e["type"] for e in events] == ["enter"]


def test_a_one_frame_false_positive_is_never_confirmed() -> None:
    tracker = Tracker(TrackingConfig(enabled=True, min_hits=3))
    frames: list[list[dict[str, Any]]] = [[det(10, 10)], [], [], [det(200, 10, score=0.3)], []]
    _ids, events = run(tracker, frames)
    assert events == []
    assert tracker.tracks == []


def test_leave_is_stamped_with_the_last_sighting_and_carries_duration_and_best_score() -> None:
    tracker = Tracker(TrackingConfig(enabled=True, min_hits=3, max_age_s=0.5))
    frames = [[det(10 + 5 * i, 50, score=0.6 + 0.01 * i)] for i in range(10)] + [[] for _ in range(10)]
    _, events = run(tracker, frames)
    assert [e["type"] for e in events] == ["enter", "leave"]
    leave = events[1]
    assert leave["ts"] == 0.9
    assert leave["duration_s"] == 0.9
    assert leave["best_score"] == 0.69
    assert tracker.active == 0


def test_labels_do_not_mix() -> None:
    tracker = Tracker(TrackingConfig(enabled=True, min_hits=1))
    ids, _ = run(tracker, [[det(10, 10, "car")], [det(12, 10, "person")], [det(14, 10, "car")]])
    assert ids == [[1], [2], [1]]


def test_a_parked_object_gets_one_stationary_event_per_rest() -> None:
    tracker = Tracker(TrackingConfig(enabled=True, min_hits=2, stationary_s=1.0, max_age_s=5))
    frames = [[det(10 + 10 * i, 50)] for i in range(5)]  # drives in
    frames += [[det(50, 50)] for _ in range(20)]  # parks for 2 s
    frames += [[det(50 + 20 * i, 50)] for i in range(1, 6)]  # drives off
    frames += [[det(150, 50)] for _ in range(15)]  # parks again
    _, events = run(tracker, frames)
    still = [e for e in events if e["type"] == "stationary"]
    assert [e["since"] for e in still] == [0.4, 2.9]  # at rest from frame 4 and from frame 29
    assert [e["ts"] for e in still] == [1.4, 3.9]  # stationary_s later


def test_a_car_that_parks_while_unseen_keeps_its_id_at_the_next_keep_alive() -> None:
    tracker = Tracker(TrackingConfig(enabled=True, min_hits=2, max_age_s=4))
    frames = [[det(10 + 16 * i, 50)] for i in range(8)]  # 160 px/s, then it stops at x 122 ...
    ids, _ = run(tracker, frames)
    later = tracker.update([det(122, 50)], 0.7 + 3.0)  # ... and a motion gate shows it 3 s later
    assert later == []  # no leave, no new enter
    assert tracker.tracks[0].track_id == ids[-1][0] == 1
    assert tracker.update([det(122, 50)], 0.7 + 6.0) == []  # and again: it is at rest now
