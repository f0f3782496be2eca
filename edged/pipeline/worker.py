"""The inference workers of one pipeline: a frame from the slot enters, the model runs, and the
published result leaves as a numbered message for the pipeline's sink (the store)."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from edged.capture.base import Frame, FrameSlot
from edged.core.errors import ModelError, RefusedResultError
from edged.core.osthread import INFERENCE_NICE
from edged.core.stats import PipelineStats
from edged.core.streams import events_key
from edged.core.threads import Supervised
from edged.model.preprocess import Preprocessor
from edged.pipeline.frametap import FrameTap
from edged.pipeline.message import Timings, event_message, result_message
from edged.pipeline.model import Model, ModelRef
from edged.pipeline.resultfilter import PublishFilter
from edged.pipeline.scene import BEST_IMAGE, Scene
from edged.pipeline.secondary import run_secondaries
from edged.pipeline.snapshots import Snapshots

log = logging.getLogger(__name__)

ResultHook = Callable[[dict[str, Any]], None]


class ResultSink(Protocol):
    """Where a pipeline's messages go: the store (edged/store/spool.py), which numbers and keeps them."""

    def next_seq(self, pipeline: str) -> int:
        """The pipeline's next sequence number (never reused)."""
        ...

    def append(self, pipeline: str, seq: int, ts: float, topic: str, payload: bytes) -> None:
        """Take one message."""
        ...


@dataclass
class Outlet:
    """What a pipeline does with a result, shared by its workers and used only inside a turn; the runner
    replaces `publish`, `snapshots` and `scene` on reload (the next frame takes them)."""

    sink: ResultSink
    device_id: str
    topic: str
    publish: PublishFilter
    snapshots: Snapshots | None = None
    scene: Scene | None = None  # masks, zones, tracking (detect pipelines that configure them)
    events_topic: str = ""
    on_result: ResultHook | None = None
    tap: FrameTap = field(default_factory=FrameTap)  # remote `record`, a rollout's validation frames


class Turnstile:
    """Keeps results in capture order when several workers run frames at once.

    A worker takes a frame and a ticket together; after its model run it waits for its ticket's turn
    before it numbers (`seq`) and stores the result. A worker that fails still passes its turn on.
    """

    def __init__(self, slot: FrameSlot) -> None:
        self.slot = slot
        self._take = threading.Lock()
        self._turn = threading.Condition()
        self._next_ticket = 0
        self._serving = 0

    def take(self, timeout: float | None) -> tuple[Frame, int] | None:
        """The next frame and its ticket, or None on timeout / when the source is done (`timeout` None:
        asleep until one of the two)."""
        with self._take:
            frame = self.slot.get(timeout)
            if frame is None:
                return None
            ticket = self._next_ticket
            self._next_ticket += 1
            return frame, ticket

    @contextmanager
    def turn(self, ticket: int) -> Iterator[None]:
        """Wait until every earlier ticket was served, run the body, then let the next one in."""
        with self._turn:
            while self._serving != ticket:
                self._turn.wait()
        try:
            yield
        finally:
            with self._turn:
                self._serving += 1
                self._turn.notify_all()


class InferenceWorker(Supervised):
    """Takes the latest frame, runs the model, builds the message, hands it to the sink.

    A pipeline runs `model.concurrency` of these on one session; a Turnstile keeps their results in
    capture order, so `seq` follows the frames. A frame whose outputs the decoder refuses (RefusedResultError:
    a shape, a label, boxes that are not boxes) is counted and reported, not published, and the next frame goes
    on; any other failure marks the pipeline failed and closes its slot (its other workers end too).
    """

    def __init__(
        self,
        pipeline: str,
        ref: ModelRef,
        *,
        turnstile: Turnstile,
        outlet: Outlet,
        stats: PipelineStats,
        index: int = 0,
    ) -> None:
        suffix = f"-{index}" if index else ""
        super().__init__(f"edged-infer-{pipeline}{suffix}", nice=INFERENCE_NICE, on_death=self._died)
        self.pipeline = pipeline
        self.ref = ref
        self.turnstile = turnstile
        self.outlet = outlet
        self.stats = stats
        self.finished = False

    def body(self) -> None:
        """Until the source closes its slot: the frame in flight is always finished and stored."""
        try:
            self._loop()
        finally:
            self.finished = True  # before on_exit: whoever it wakes must see this thread as done

    def _died(self, why: str) -> None:
        self.stats.set_state("failed", f"inference worker died: {why}")
        self.turnstile.slot.close()

    def _loop(self) -> None:
        while True:
            taken = self.turnstile.take(timeout=None)  # idle means asleep: the slot wakes us, also on close
            if taken is None:
                if self.turnstile.slot.closed:
                    return
                continue
            frame, ticket = taken
            try:
                model, result, timings = self._infer(frame)
            except RefusedResultError as exc:
                with self.turnstile.turn(ticket):
                    self._refuse(exc)
                continue
            except Exception as exc:  # noqa: BLE001  (one pipeline's failure must not stop the others; _fail logs it)
                with self.turnstile.turn(ticket):
                    self._fail("inference failed", exc)
                return
            with self.turnstile.turn(ticket):
                try:
                    self._store(frame, model, result, timings)
                except Exception as exc:  # noqa: BLE001  (a raising result hook, a broken spool: _fail logs it)
                    self._fail("storing the result failed", exc)
                    return

    def _fail(self, what: str, exc: Exception) -> None:
        """Mark the pipeline failed (status shows why), log the cause once, stop its other workers too."""
        self.stats.set_state("failed", f"{what}: {exc}")
        log.error(
            "pipeline %s: %s; this pipeline stops",
            self.pipeline,
            what,
            exc_info=exc,
            extra={"PIPELINE": self.pipeline, "PROVIDER": self.ref.current.loaded.provider, "SEQ": ""},
        )
        self.turnstile.slot.close()  # the other workers of this pipeline stop too

    def _refuse(self, exc: RefusedResultError) -> None:
        """Not published: counted, and status is degraded while refusals keep coming (ops/reasons.py)."""
        self.stats.count_refused(str(exc))
        log.warning(  # the log's rate limit keeps a refusal on every frame to a few lines a minute
            "pipeline %s: result refused, not published: %s",
            self.pipeline,
            exc,
            extra={"PIPELINE": self.pipeline, "PROVIDER": self.ref.current.loaded.provider, "SEQ": ""},
        )

    def _infer(self, frame: Frame) -> tuple[Model, dict[str, Any], Timings]:
        model = self.ref.current  # one model for the whole frame, even if a swap happens meanwhile
        tensor, pre_ms = frame.tensor, frame.pre_ms
        if tensor is None or frame.pre_token != model.pre.spec:
            t0 = time.perf_counter()
            tensor = model.pre(frame.image)
            pre_ms = (time.perf_counter() - t0) * 1e3
        t1 = time.perf_counter()
        outputs = model.loaded.run(tensor)
        t2 = time.perf_counter()
        height, width = frame.image.shape[:2]
        geometry = model.pre.geometry(width, height) if isinstance(model.pre, Preprocessor) else None
        result = decode(model, outputs, geometry)
        t3 = time.perf_counter()
        scene = self.outlet.scene
        if scene is not None:
            scene.mask(result, frame.image)  # before the crops: a masked detection is not classified
        second = run_secondaries(model.secondary, frame.image, result) if model.secondary else None
        return model, result, Timings(pre_ms, (t2 - t1) * 1e3, (t3 - t2) * 1e3, second)

    def _store(self, frame: Frame, model: Model, result: dict[str, Any], timings: Timings) -> None:
        out = self.outlet
        out.tap.offer(frame.image)
        self.stats.record_result(timings.pre_ms, timings.infer_ms, timings.post_ms, timings.secondary_ms)
        if out.scene is not None:
            events = out.scene.update(result, frame.ts, frame.image)
            for event in events:
                self._store_event(frame, model, event)
            self.stats.count_events(len(events), out.scene.active_tracks)
        publish, changed = out.publish.decide(result)
        if not publish:
            self.stats.count_suppressed()  # counted, then dropped: no spool row, no seq (see resultfilter.py)
            return
        seq = out.sink.next_seq(self.pipeline)
        message = result_message(out.device_id, self.pipeline, seq, frame, model.loaded, timings, result)
        snapshots = out.snapshots
        if snapshots is not None and snapshots.wanted(result, changed=changed):
            path = snapshots.write(frame.image, result, seq)
            if path is not None:
                message["snapshot"] = path  # relative to state_dir; the picture itself stays on the device
        payload = json.dumps(message, separators=(",", ":")).encode("utf-8")
        out.sink.append(self.pipeline, seq, frame.ts, out.topic, payload)
        if log.isEnabledFor(logging.DEBUG):  # one line per result: journal fields make them searchable
            fields = {"PIPELINE": self.pipeline, "SEQ": seq, "PROVIDER": model.loaded.provider}
            log.debug("pipeline %s seq %d: %s", self.pipeline, seq, json.dumps(result)[:200], extra=fields)
        if out.on_result is not None:
            out.on_result(message)

    def _store_event(self, frame: Frame, model: Model, event: dict[str, Any]) -> None:
        """One event: its own seq stream and topic, through the spool like any result."""
        out = self.outlet
        image = event.pop(BEST_IMAGE, None)
        key = events_key(self.pipeline)
        seq = out.sink.next_seq(key)
        message = event_message(out.device_id, self.pipeline, seq, frame, model.loaded, event)
        if out.snapshots is not None and event["type"] in ("enter", "leave"):
            picture = image if image is not None else frame.image  # leave: the track's best frame
            box = event.get("best_box", event["box"])
            path = out.snapshots.write(picture, {"detections": [{"box": box}]}, seq, stream="events")
            if path is not None:
                message["snapshot"] = path
        payload = json.dumps(message, separators=(",", ":")).encode("utf-8")
        out.sink.append(key, seq, event["ts"], out.events_topic, payload)
        if out.on_result is not None:
            out.on_result(message)


def decode(model: Model, outputs: list[Any], geometry: Any) -> dict[str, Any]:
    """The decoder's result, after the frame's output shapes were checked against the model's; a ModelError of
    the decoder (its own per-frame checks: labels, boxes, layout) refuses this frame's result, the same way."""
    if model.shapes is not None:
        model.shapes.check(outputs)
    try:
        return model.post(outputs, geometry)
    except RefusedResultError:
        raise
    except ModelError as exc:
        raise RefusedResultError(str(exc)) from exc
