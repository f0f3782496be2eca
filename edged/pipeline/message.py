"""The result message (the contract in docs/mqtt.md; version MESSAGE_VERSION) one published result becomes."""

from __future__ import annotations

from typing import Any, NamedTuple

from edged import MESSAGE_VERSION
from edged.capture.base import Frame
from edged.core.streams import EVENTS, RESULTS
from edged.model.session import LoadedModel


class Timings(NamedTuple):
    """Milliseconds spent on one frame: preprocessing, the model run, postprocessing."""

    pre_ms: float
    infer_ms: float
    post_ms: float
    secondary_ms: float | None = None  # models on the crops (None: the pipeline has none)


def event_message(  # noqa: PLR0917  (the message's parts)
    device_id: str,
    pipeline: str,
    seq: int,
    frame: Frame,
    model: LoadedModel,
    event: dict[str, Any],
) -> dict[str, Any]:
    """`{"v", "device", "pipeline", "stream": "events", "seq", "ts", "frame", "model", "event"}`: `ts` is when
    the event happened (an `enter` is stamped with the first sighting), `frame` the frame that told."""
    return {
        "v": MESSAGE_VERSION,
        "device": device_id,
        "pipeline": pipeline,
        "stream": EVENTS,
        "seq": seq,
        "ts": event["ts"],
        "frame": frame.index,
        "model": {"name": model.name, "sha256": model.sha256},
        "event": event,
        **({} if frame.clock is None else {"clock": frame.clock.shifted(event["ts"] - frame.ts).fields()}),
    }


def gap_message(device_id: str, key: str, *, first: int, last: int, used_to: int, ts: float) -> dict[str, Any]:
    """`{"v", "device", "pipeline", "stream", "ts", "gap"}`: seqs `first`..`last` of the seq stream `key`
    (a pipeline's results, or `<pipeline>/events`) were skipped after an unclean stop. Each was delivered
    before the stop, lost with it, or never used; `first`..`used_to` were certainly handed out."""
    pipeline, _, stream = key.partition("/")
    return {
        "v": MESSAGE_VERSION,
        "device": device_id,
        "pipeline": pipeline,
        "stream": stream or RESULTS,
        "ts": round(ts, 3),
        "gap": {"first": first, "last": last, "used_to": used_to, "reason": "unclean_stop"},
    }


def result_message(  # noqa: PLR0917  (the message's parts)
    device_id: str,
    pipeline: str,
    seq: int,
    frame: Frame,
    model: LoadedModel,
    timings: Timings,
    result: dict[str, Any],
) -> dict[str, Any]:
    """`{"v", "device", "pipeline", "seq", "ts", "frame", "model", "provider", "latency_ms", "result"}`, and
    `"clock": {"synced": false, "boot", "mono"}` when the wall clock was not trusted at capture (core/clock.py)."""
    return {
        "v": MESSAGE_VERSION,
        "device": device_id,
        "pipeline": pipeline,
        "seq": seq,
        "ts": round(frame.ts, 3),
        "frame": frame.index,
        "model": {"name": model.name, "sha256": model.sha256},
        "provider": model.provider,
        "latency_ms": {
            "pre": round(timings.pre_ms, 3),
            "infer": round(timings.infer_ms, 3),
            "post": round(timings.post_ms, 3),
            **({} if timings.secondary_ms is None else {"secondary": round(timings.secondary_ms, 3)}),
        },
        "result": result,
        **({} if frame.clock is None else {"clock": frame.clock.fields()}),
    }
