"""Motion gating, tracking and events on a street scene with ground truth, side by side in one run.

The scene, its truth and the detector are made here (scripts/vision_scene.py: a still street, 40x40
cars and people that cross, some park; a small CNN with hand-set weights). The same video goes through
a real edged daemon (in this process, MQTT off, results kept in its spool) three times:

off     motion gating off, tracking on, publish every (the model runs on every frame)
gated   motion gating on (hold_frames 3, keepalive_s 3, background_alpha 0.1), tracking on (max_age_s 4),
        publish every
events  as gated, with `publish: {mode: events}`: what leaves the device is the events only

The camera source reads the file at model pace with `clock: video`, so the motion gate's keep-alive,
the tracker and the event times follow the recording. Reported, with the issue's targets:
- model runs: share of the video's frames that went to the model (gated; target <= 25%);
- CPU: process CPU seconds from the models being loaded to the end of the video, gated / off (<= 0.35);
- detected: truth objects found (IoU >= 0.5, right label) in at least one frame (gated; >= 98%);
- id switches: changes of track_id along each truth object's matched detections, per 20 tracks (<= 1);
- event timing: |enter - truth| and |leave - truth| (the first / last frame with half the object in
  view), worst case (<= 0.5 s);
- messages: spool rows of `events` against `every` (>= 50x fewer).

Then the two-stage demo: a 60 s scene with 8 objects, gating off, the detector alone and the detector with
the mark classifier on its crops (`secondary`, batched), interleaved `--repeat` times: median frames/s
of each (frames over the wall time from the models being loaded to the end) and the share of
detections on a truth object in full view whose attached mark is right.

A measurement, not a test: exits 0 whatever the figures are (`--check` exits 1 when a target is missed).

    python benchmarks/vision.py [--objects 24] [--seconds 360] [--json] [--check]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "scripts"))

import vision_scene  # noqa: E402

from edged.config import config_from_dict  # noqa: E402
from edged.daemon import Daemon  # noqa: E402
from edged.pipeline.tracking import iou  # noqa: E402

# background_alpha 0.1: a car that parks (or leaves its spot) is part of the background after ~1.5 s
GATE = {"enabled": True, "hold_frames": 3, "keepalive_s": 3, "background_alpha": 0.1}
MODES = {
    "off": {"motion": {"enabled": False}, "publish": {"mode": "every"}},
    "gated": {"motion": GATE, "publish": {"mode": "every"}},
    "events": {"motion": GATE, "publish": {"mode": "events"}},
}


def run_mode(
    name: str, video: Path, model: Path, work: Path, secondary: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """One pass of the video through a daemon; its spool rows and CPU seconds."""
    state = work / (name + ("-secondary" if secondary else ""))
    cfg = {
        "device_id": "bench",
        "state_dir": str(state),
        "mqtt": {"enabled": False},
        "pipelines": [
            {
                "name": "street",
                "source": {"type": "camera", "uri": str(video), "fps": 0, "stop_at_end": True, "clock": "video"},
                "model": {"path": str(model), "providers": ["CPUExecutionProvider"]},
                "postprocess": {"type": "detect"},
                "tracking": {"enabled": True, "min_hits": 2, "max_age_s": 4},
                **MODES[name],
                "secondary": secondary or [],
            }
        ],
    }
    daemon = Daemon(config_from_dict(cfg))
    daemon.start()
    cpu0, wall0 = time.process_time(), time.monotonic()
    daemon.wait()
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    stats = daemon.pipelines[0].stats.snapshot()
    daemon.stop()
    with sqlite3.connect(state / "spool.db") as conn:
        rows = [(k, json.loads(p)) for k, p in conn.execute("SELECT pipeline, payload FROM results ORDER BY id")]
    return {"cpu_s": cpu, "wall_s": wall, "frames": stats["frames"], "skipped": stats["motion_skipped"], "rows": rows}


def score(run: dict[str, Any], truth: dict[str, Any]) -> dict[str, Any]:
    """Detection, id switches and event timing against the truth."""
    import numpy as np

    fps = truth["fps"]
    results = [m for k, m in run["rows"] if k == "street"]
    events = [m["event"] for k, m in run["rows"] if k == "street/events"]
    t0 = results[0]["ts"] - results[0]["frame"] / fps  # the video clock's start
    found: set[int] = set()
    ids: dict[int, list[int]] = defaultdict(list)
    owner: dict[int, Counter[int]] = defaultdict(Counter)  # track id -> truth objects it was matched to
    for m in results:
        frame = str(m["frame"])
        for obj in truth["objects"]:
            box = obj["boxes"].get(frame)
            if box is None:
                continue
            dets = [d for d in m["result"]["detections"] if d["label"] == obj["label"]]
            if not dets:
                continue
            overlap = iou(np.asarray([box], float), np.asarray([d["box"] for d in dets], float))[0]
            best = int(np.argmax(overlap))
            if overlap[best] >= 0.5:
                found.add(obj["id"])
                track = dets[best].get("track_id")
                if track is not None:
                    if not ids[obj["id"]] or ids[obj["id"]][-1] != track:
                        ids[obj["id"]].append(track)
                    owner[track][obj["id"]] += 1
    switches = sum(max(0, len(v) - 1) for v in ids.values())
    errors: dict[str, list[float]] = {"enter": [], "leave": []}
    for event in events:
        if event["type"] in errors and owner.get(event["track_id"]):
            obj_id = owner[event["track_id"]].most_common(1)[0][0]
            obj = truth["objects"][obj_id - 1]
            errors[event["type"]].append(abs(event["ts"] - t0 - obj[f"{event['type']}_s"]))
    n = len(truth["objects"])
    return {
        "detected": len(found) / n,
        "id_switches": switches,
        "id_switches_per_20": switches * 20 / n,
        "enter_err_max_s": max(errors["enter"], default=float("nan")),
        "leave_err_max_s": max(errors["leave"], default=float("nan")),
        "enters": len(errors["enter"]),
        "leaves": len(errors["leave"]),
        "events": Counter(e["type"] for e in events),
    }


def mark_accuracy(run: dict[str, Any], truth: dict[str, Any]) -> float:
    """Share of detections on a truth object in full view (IoU >= 0.5) whose `secondary.mark` is the
    object's mark (an object half out of the picture has no mark drawn)."""
    import numpy as np

    right = total = 0
    for k, m in run["rows"]:
        if k != "street":
            continue
        for obj in truth["objects"]:
            box = obj["boxes"].get(str(m["frame"]))
            in_view = box is not None and box[0] >= 0 and box[2] <= vision_scene.WIDTH
            for d in m["result"]["detections"] if in_view else []:
                if iou(np.asarray([box], float), np.asarray([d["box"]], float))[0, 0] >= 0.5:
                    total += 1
                    right += d.get("secondary", {}).get("mark", {}).get("top", [{}])[0].get("label") == obj["mark"]
    return right / max(1, total)


def two_stage(work: Path, repeat: int) -> dict[str, Any]:
    """The detector alone and with the mark model on its crops, on a short scene."""
    short = work / "two-stage"
    short.mkdir()
    video, truth_path = vision_scene.write_scene(short, 8, 60)
    detector = vision_scene.make_detector(short / "scene-detector.onnx")
    marks = vision_scene.make_mark_model(short / "scene-marks.onnx")
    truth = json.loads(truth_path.read_text(encoding="utf-8"))
    second = [{"name": "mark", "model": {"path": str(marks), "providers": ["CPUExecutionProvider"]}, "min_score": 0.3}]
    fps: dict[str, list[float]] = {"alone": [], "both": []}
    both: dict[str, Any] = {}
    for i in range(repeat):  # interleaved: the machine's noise falls on both
        alone = run_mode("off", video, detector, short / f"alone-{i}")
        both = run_mode("off", video, detector, short / f"both-{i}", second)
        fps["alone"].append(alone["frames"] / alone["wall_s"])
        fps["both"].append(both["frames"] / both["wall_s"])
    return {
        "frames": truth["frames"],
        "fps_detector": statistics.median(fps["alone"]),
        "fps_with_secondary": statistics.median(fps["both"]),
        "mark_accuracy": mark_accuracy(both, truth),
    }


def main(argv: list[str] | None = None) -> int:
    """Make the scene, run the three modes, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=24)
    parser.add_argument("--seconds", type=float, default=360.0)
    parser.add_argument("--repeat", type=int, default=3, help="two-stage runs of each kind (median)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="edged-vision-") as tmp:
        work = Path(tmp)
        video, truth_path = vision_scene.write_scene(work, args.objects, args.seconds)
        model = vision_scene.make_detector(work / "scene-detector.onnx")
        truth = json.loads(truth_path.read_text(encoding="utf-8"))
        runs = {name: run_mode(name, video, model, work) for name in MODES}
        stages = two_stage(work, args.repeat)
    total = truth["frames"]
    gated = score(runs["gated"], truth)
    report = {
        "frames": total,
        "objects": len(truth["objects"]),
        "model_runs": {k: r["frames"] for k, r in runs.items()},
        "model_run_share": runs["gated"]["frames"] / total,
        "cpu_s": {k: round(r["cpu_s"], 2) for k, r in runs.items()},
        "cpu_ratio": runs["gated"]["cpu_s"] / runs["off"]["cpu_s"],
        "off": score(runs["off"], truth),
        "gated": gated,
        "messages": {k: len(r["rows"]) for k, r in runs.items()},
    }
    report["message_ratio"] = len(runs["off"]["rows"]) / max(1, len(runs["events"]["rows"]))
    report["two_stage"] = stages
    targets = {
        "model runs <= 25% of frames": report["model_run_share"] <= 0.25,
        "CPU gated/off <= 0.35": report["cpu_ratio"] <= 0.35,
        "detected >= 98%": gated["detected"] >= 0.98,
        "id switches <= 1 per 20 tracks": gated["id_switches_per_20"] <= 1,
        "events within 0.5 s": max(gated["enter_err_max_s"], gated["leave_err_max_s"]) <= 0.5,
        "events-only >= 50x fewer messages than every": report["message_ratio"] >= 50,
    }
    report["targets"] = targets
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print(f"video: {total} frames, {report['objects']} objects (scripts/vision_scene.py)")
        print(f"model runs: off {runs['off']['frames']}, gated {runs['gated']['frames']} "
              f"({report['model_run_share']:.1%} of frames)")  # fmt: skip
        print(f"CPU s: off {runs['off']['cpu_s']:.1f}, gated {runs['gated']['cpu_s']:.1f} "
              f"(ratio {report['cpu_ratio']:.2f})")  # fmt: skip
        for name in ("off", "gated"):
            s = report[name]
            print(f"{name}: detected {s['detected']:.1%}, id switches {s['id_switches']} "
                  f"({s['id_switches_per_20']:.2f} per 20 tracks), enter err max {s['enter_err_max_s']:.2f} s, "
                  f"leave err max {s['leave_err_max_s']:.2f} s, events {dict(s['events'])}")  # fmt: skip
        print(f"messages: every (off) {report['messages']['off']}, every (gated) {report['messages']['gated']}, "
              f"events {report['messages']['events']} ({report['message_ratio']:.0f}x fewer)")  # fmt: skip
        print(f"two-stage ({stages['frames']} frames): detector {stages['fps_detector']:.1f} frames/s, with the mark "
              f"model on its crops {stages['fps_with_secondary']:.1f} frames/s, marks right "
              f"{stages['mark_accuracy']:.1%}")  # fmt: skip
        for what, ok in targets.items():
            print(f"  {'met ' if ok else 'MISS'} {what}")
    return 1 if args.check and not all(targets.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
