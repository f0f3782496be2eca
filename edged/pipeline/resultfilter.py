"""Edge filtering: which results leave the device (`publish.mode`: every | on_change | interval | events).

What is kept and what is not: every frame is run through the model and counted in the pipeline status
(`frames`, latencies, `fps`); a result the filter holds back is counted in `suppressed` and then
discarded: it is not stored in the spool, takes no `seq` (so `seq` counts published results and a gap
still means a lost result) and is never sent.

Each mode is a filter class with its config model, registered in PUBLISH_FILTERS under its `mode` key
(`publish` without a mode is `every`).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, Literal, Protocol

from pydantic import Field

from edged.core.registry import Registry
from edged.core.settings import Strict

Clock = Callable[[], float]


class PublishFilter(Protocol):
    """Decides, frame by frame in capture order, whether a result is published. Not thread-safe: the
    pipeline calls it inside its Turnstile turn."""

    def decide(self, result: dict[str, Any]) -> tuple[bool, bool]:
        """(publish, changed): `changed` when the result's signature differs from the previous frame's."""
        ...


FilterFactory = Callable[[Any, Clock], PublishFilter]
# mode -> (config model, filter class); `publish` without a `mode` key is `every`
PUBLISH_FILTERS: Registry[FilterFactory] = Registry(
    "publish filter", "mode", ("edged.pipeline.resultfilter",), default_key="every"
)


def signature(result: dict[str, Any]) -> object:
    """What `on_change` compares: per-label counts of detections, the labels a segmenter sees, a classifier's
    top-1 label, else everything."""
    if "detections" in result:
        return tuple(sorted(Counter(str(d["label"]) for d in result["detections"]).items()))
    if "segments" in result:
        return tuple(sorted(str(s["label"]) for s in result["segments"]))
    top = result.get("top")
    if isinstance(top, list):
        return top[0]["label"] if top else None
    return json.dumps(result, sort_keys=True)


class EveryConfig(Strict):
    """Publish every result."""

    mode: Literal["every"] = Field("every", description="every: each result is published.")


class OnChangeConfig(Strict):
    """Publish when the set of labels or a per-label count changes (a classifier: its top-1 label)."""

    mode: Literal["on_change"] = Field(description="on_change: when the result's signature changes.")
    interval_s: float = Field(
        0.0, ge=0, description="on_change: also publish an unchanged result this often (a heartbeat; 0 = never)."
    )


class IntervalConfig(Strict):
    """Publish at most one result every `interval_s`."""

    mode: Literal["interval"] = Field(description="interval: at most one result every interval_s.")
    interval_s: float = Field(gt=0, description="interval: the minimum spacing between published results.")


class _Changes:
    """The signature of the previous frame (every filter reports `changed`, for snapshots)."""

    def __init__(self) -> None:
        self._last: object = _NOTHING

    def changed(self, result: dict[str, Any]) -> bool:
        sig = signature(result)
        changed, self._last = sig != self._last, sig
        return changed


@PUBLISH_FILTERS.register("every", EveryConfig)
class Every:
    """Every result leaves."""

    def __init__(self, cfg: EveryConfig, clock: Clock = time.monotonic) -> None:  # noqa: ARG002
        self._changes = _Changes()

    def decide(self, result: dict[str, Any]) -> tuple[bool, bool]:
        """Always published."""
        return True, self._changes.changed(result)


class _Paced:
    """A filter with a period: `interval_s` and when a result was last published."""

    def __init__(self, cfg: OnChangeConfig | IntervalConfig, clock: Clock = time.monotonic) -> None:
        self.interval_s = cfg.interval_s
        self.clock = clock
        self._changes = _Changes()
        self._last_publish: float | None = None

    def _publish_if(self, publish: bool, changed: bool) -> tuple[bool, bool]:
        if publish:
            self._last_publish = self.clock()
        return publish, changed

    def _due(self) -> bool:
        """The first result, or `interval_s` (> 0) since the last published one."""
        last = self._last_publish
        return last is None or (self.interval_s > 0 and self.clock() - last >= self.interval_s)


@PUBLISH_FILTERS.register("on_change", OnChangeConfig)
class OnChange(_Paced):
    """A result leaves when its signature changed, or as a heartbeat every `interval_s` (when > 0)."""

    def decide(self, result: dict[str, Any]) -> tuple[bool, bool]:
        """Changed, or the heartbeat is due."""
        changed = self._changes.changed(result)
        return self._publish_if(changed or self._due(), changed)


@PUBLISH_FILTERS.register("interval", IntervalConfig)
class Interval(_Paced):
    """At most one result every `interval_s` (the first one at once)."""

    def decide(self, result: dict[str, Any]) -> tuple[bool, bool]:
        """Published when the interval since the last published result has passed."""
        changed = self._changes.changed(result)
        return self._publish_if(self._due(), changed)


class EventsConfig(Strict):
    """Publish the tracker's events only (they go to the events topic in every mode), and optionally a
    summary result every `summary_s`."""

    mode: Literal["events"] = Field(description="events: per-frame results are not published, only events.")
    summary_s: float = Field(
        0.0, ge=0, description="events: also publish the current result this often (a summary; 0 = never)."
    )


@PUBLISH_FILTERS.register("events", EventsConfig)
class EventsOnly(_Paced):
    """No per-frame results; a summary every `summary_s` (when > 0), the first one at once."""

    def __init__(self, cfg: EventsConfig, clock: Clock = time.monotonic) -> None:
        self.interval_s = cfg.summary_s
        self.clock = clock
        self._changes = _Changes()
        self._last_publish: float | None = None if cfg.summary_s else clock()

    def decide(self, result: dict[str, Any]) -> tuple[bool, bool]:
        """Published only as the periodic summary."""
        changed = self._changes.changed(result)
        return self._publish_if(self._due(), changed)


def make_filter(cfg: Any, clock: Clock = time.monotonic) -> PublishFilter:
    """The publish filter for a pipeline's `publish` section (by its `mode`)."""
    return PUBLISH_FILTERS.factory(cfg.mode)(cfg, clock)


_NOTHING = object()
