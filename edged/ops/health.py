"""What the daemon says about itself: the status JSON (docs/status.md), its health and the reasons, the one
line for systemd and the journal, the latency histograms for /metrics. A pure read of the parts the daemon
owns (it changes nothing, so any thread may ask); the daemon does the wiring, this does the reporting."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any, Protocol

from edged import __version__
from edged.config import Config
from edged.control.controller import Controller
from edged.core.clock import ClockWatch
from edged.core.histogram import Histogram
from edged.core.threads import Supervised
from edged.ops import reasons
from edged.ops.metrics import MetricsServer, TextfileWriter
from edged.ops.reload import Reloader
from edged.ops.status import StatusServer
from edged.pipeline.runner import PipelineRunner
from edged.store.capacity import describe
from edged.store.spool import Spool
from edged.uplink.mqttstats import MqttStats
from edged.uplink.replay import ReplayRequests


class Parts(Protocol):
    """What a report reads: the daemon's parts, some of them only once started."""

    @property
    def config(self) -> Config: ...
    @property
    def state(self) -> str: ...
    @property
    def started(self) -> float: ...
    @property
    def pipelines(self) -> Sequence[PipelineRunner]: ...
    @property
    def mqtt_stats(self) -> MqttStats: ...
    @property
    def reloader(self) -> Reloader: ...
    @property
    def spool(self) -> Spool | None: ...
    @property
    def publisher(self) -> Supervised | None: ...
    @property
    def status_server(self) -> StatusServer | None: ...
    @property
    def controller(self) -> Controller | None: ...
    @property
    def replay(self) -> ReplayRequests | None: ...
    @property
    def metrics(self) -> Sequence[MetricsServer | TextfileWriter]: ...
    @property
    def clock(self) -> ClockWatch: ...


class Report:
    """The daemon's health, read from its parts."""

    def __init__(self, parts: Parts) -> None:
        self.parts = parts

    def health(self) -> str:
        """running, or degraded when anything in `reasons()` is wrong (else the lifecycle state)."""
        if self.parts.state != "running":
            return self.parts.state
        return "degraded" if self.reasons() else "running"

    def reasons(self, spool: dict[str, Any] | None = None) -> list[str]:
        """Why the daemon is not fully working, one line each (ops/reasons.py); empty when everything works."""
        d = self.parts
        owned: list[Supervised | None] = [d.publisher, d.status_server, d.reloader, d.controller, *d.metrics]
        if d.spool is not None:
            owned += [d.spool.writer.thread, d.spool.seqs.renewer]
        if spool is None:
            spool = d.spool.stats() if d.spool is not None else {}
        return [
            *reasons.pipeline_reasons(d.pipelines),
            *reasons.thread_reasons(owned),
            *(reasons.broker_reasons(d.mqtt_stats) if d.config.mqtt.enabled else []),
            *reasons.spool_reasons(spool, d.mqtt_stats),
        ]

    def histograms(self) -> dict[str, dict[str, Histogram]]:
        """Latency histograms per pipeline: its stages, and `e2e` (capture to PUBACK), for /metrics."""
        d = self.parts
        out = {runner.name: runner.stats.histograms() for runner in d.pipelines}
        for name, hist in d.mqtt_stats.e2e_histograms().items():
            out.setdefault(name, {})["e2e"] = hist
        return out

    def snapshot(self) -> dict[str, Any]:
        """The status JSON (the contract in docs/status.md; other programs read it)."""
        d = self.parts
        spool = d.spool.stats() if d.spool is not None else {}
        running = d.state == "running"
        found = self.reasons(spool) if running else []
        pipelines = []
        for runner in d.pipelines:
            entry = runner.stats.snapshot()
            entry["latency_ms"]["e2e"] = d.mqtt_stats.e2e(runner.name)  # capture -> PUBACK
            pipelines.append(entry)
        return {
            "state": ("degraded" if found else "running") if running else d.state,
            "reasons": found,
            "version": __version__,
            "device_id": d.config.device_id,
            "pid": os.getpid(),
            "uptime_s": round(time.monotonic() - d.started, 1),
            "pipelines": pipelines,
            "spool": spool,
            "mqtt": d.mqtt_stats.snapshot() | {"replay": d.replay.snapshot() if d.replay is not None else None},
            "reload": d.reloader.status(),
            "control": d.controller.snapshot() if d.controller is not None else None,
            "clock": d.clock.describe(),
        }

    def status_line(self) -> str:
        """One line for sd_notify STATUS= and periodic logs."""
        d = self.parts
        fps = " ".join(f"{runner.name}={runner.stats.fps():.1f}fps" for runner in d.pipelines)
        depth = d.spool.depth if d.spool is not None else 0
        broker = "connected" if d.mqtt_stats.connected else "disconnected"
        if not d.config.mqtt.enabled:
            broker = "disabled"
        seconds = d.spool.stats().get("capacity_s") if d.spool is not None else None
        capacity = describe(seconds if isinstance(seconds, int | float) else None)  # `3 d 4 h`, `unknown`
        clock = "synchronized" if d.clock.synced else "unsynchronized"
        return f"{self.health()}: {fps} spool={depth} capacity={capacity.replace(' ', '')} mqtt={broker} clock={clock}"
