"""Prometheus metrics (`metrics:` in the config; off unless set): `/metrics` over HTTP and/or a
node_exporter textfile-collector file, both in the official `prometheus-client` exposition format.

Nothing is counted twice: a collector reads the status snapshot (the same counters `edged status`
shows) and the latency histograms the stats keep beside their percentile windows, at scrape time.
Names follow Prometheus conventions: `edged_` prefix, base units (`_seconds`, `_bytes`), `_total` for
counters, the provider and model as labels of `edged_model_info`.

The HTTP server is one supervised thread, asleep in select() until a scraper connects or `stop` pokes
it; it answers `GET /metrics` (and `/`), one request at a time, each within CLIENT_TIMEOUT_S.
"""

from __future__ import annotations

import http.server
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest, write_to_textfile
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from edged import __version__
from edged.config import MetricsConfig
from edged.core.errors import EdgedError
from edged.core.histogram import Histogram
from edged.core.threads import Restart, Supervised
from edged.core.waker import Waker
from edged.ops.status import accept_until_halted

log = logging.getLogger(__name__)

CLIENT_TIMEOUT_S = 5.0
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
Snapshot = Callable[[], dict[str, Any]]
Histograms = Callable[[], dict[str, dict[str, Histogram]]]  # pipeline -> stage (or "e2e") -> histogram

# per-pipeline counters: (metric, status key, help)
PIPELINE_COUNTERS = (
    ("edged_frames_total", "frames", "Frames the model ran on (with a result, published or not)."),
    ("edged_frames_captured_total", "frames_captured", "Frames the source delivered."),
    ("edged_dropped_frames_total", "dropped_frames", "Frames overwritten unseen (the model was busy)."),
    ("edged_motion_skipped_frames_total", "motion_skipped", "Frames the motion gate kept from the model."),
    ("edged_suppressed_results_total", "suppressed", "Results the publish filter held back (never stored)."),
    ("edged_source_reconnects_total", "reconnects", "Times the source was reopened."),
    ("edged_malformed_records_total", "malformed", "Sensor input lines/records skipped as malformed."),
    ("edged_events_total", "events", "Track and zone events stored."),
    (
        "edged_refused_results_total",
        "refused",
        "Results the decoder refused (outputs that do not fit it): not published.",
    ),
)


def _histogram(name: str, doc: str, labels: list[str], rows: Iterator[tuple[list[str], Histogram]]) -> Metric:
    family = HistogramMetricFamily(name, doc, labels=labels)
    for values, hist in rows:
        family.add_metric(values, hist.cumulative(), hist.total)
    return family


def _pipelines(snapshot: dict[str, Any]) -> Iterator[Metric]:
    pipelines = snapshot.get("pipelines", [])
    for metric, key, doc in PIPELINE_COUNTERS:
        family = CounterMetricFamily(metric, doc, labels=["pipeline"])
        for p in pipelines:
            family.add_metric([p["name"]], float(p.get(key) or 0))
        yield family
    fps = GaugeMetricFamily("edged_fps", "Results per second over the recent window.", labels=["pipeline"])
    up = GaugeMetricFamily("edged_pipeline_up", "1 while the pipeline runs normally.", labels=["pipeline", "state"])
    tracks = GaugeMetricFamily("edged_tracks", "Confirmed tracks right now.", labels=["pipeline"])
    info = GaugeMetricFamily(
        "edged_model_info",
        "The model a pipeline runs (always 1).",
        labels=["pipeline", "name", "sha256", "provider", "int8"],
    )
    for p in pipelines:
        fps.add_metric([p["name"]], float(p.get("fps") or 0.0))
        up.add_metric([p["name"], str(p.get("state"))], 1.0 if p.get("state") == "running" else 0.0)
        if p.get("tracks") is not None:
            tracks.add_metric([p["name"]], float(p["tracks"]))
        model = p.get("model") or {}
        info.add_metric(
            [
                p["name"],
                str(model.get("name")),
                str(model.get("sha256")),
                str(p.get("provider")),
                str(model.get("int8")),
            ],
            1.0,
        )
    yield from (fps, up, tracks, info)


def _spool(spool: dict[str, Any]) -> Iterator[Metric]:
    yield GaugeMetricFamily("edged_spool_depth", "Results waiting for the broker.", value=float(spool.get("depth", 0)))
    yield GaugeMetricFamily("edged_spool_bytes", "Bytes of results in the spool.", value=float(spool.get("bytes", 0)))
    yield GaugeMetricFamily(
        "edged_spool_oldest_age_seconds", "Age of the oldest waiting result.", value=float(spool.get("oldest_age_s", 0))
    )
    dropped = CounterMetricFamily(
        "edged_spool_dropped_total", "Results the spool dropped, by reason.", labels=["reason"]
    )
    for reason, n in sorted((spool.get("dropped_by_reason") or {}).items()):
        dropped.add_metric([reason], float(n))
    yield dropped
    yield CounterMetricFamily(
        "edged_spool_uncertain_seqs_total",
        "Seqs skipped after unclean stops: each delivered before the stop, lost with it, or never used.",
        value=float(spool.get("uncertain", 0)),
    )
    yield CounterMetricFamily(
        "edged_dead_letters_total",
        "Results the broker refused for good, set aside.",
        value=float(spool.get("dead_letters", 0)),
    )
    if spool.get("capacity_s") is not None:
        yield GaugeMetricFamily(
            "edged_spool_capacity_seconds",
            "Outage the spool could hold at the current rate (spool.capacity_s).",
            value=float(spool["capacity_s"]),
        )
    if spool.get("disk_free_bytes") is not None:
        yield GaugeMetricFamily(
            "edged_disk_free_bytes", "Free space where the spool is.", value=float(spool["disk_free_bytes"])
        )


def _clock(clock: dict[str, Any]) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "edged_clock_synchronized",
        "1 while a time service says the wall clock is synchronized (results stamped otherwise are flagged).",
        value=1.0 if clock.get("state") == "synchronized" else 0.0,
    )
    yield CounterMetricFamily(
        "edged_clock_steps_total", "Steps of the wall clock seen.", value=float(clock.get("steps", 0))
    )
    yield CounterMetricFamily(
        "edged_clock_unsynchronized_results_total",
        "Frames stamped while the clock was not synchronized (their results carry what corrects them).",
        value=float(clock.get("flagged", 0)),
    )


def _uplink(snapshot: dict[str, Any]) -> Iterator[Metric]:
    mqtt = snapshot.get("mqtt") or {}
    yield GaugeMetricFamily(
        "edged_mqtt_connected", "1 while connected to the broker.", value=float(bool(mqtt.get("connected")))
    )
    yield CounterMetricFamily(
        "edged_published_total", "Results the broker acknowledged.", value=float(mqtt.get("published", 0))
    )
    yield CounterMetricFamily(
        "edged_publish_refused_total",
        "Publishes the broker refused (failure reason codes).",
        value=float(mqtt.get("failed", 0)),
    )
    yield CounterMetricFamily(
        "edged_mqtt_connects_total", "Connections made to the broker.", value=float(mqtt.get("connects", 0))
    )
    control = snapshot.get("control")
    if control:
        yield CounterMetricFamily(
            "edged_commands_accepted_total", "Signed commands taken.", value=float(control.get("accepted", 0))
        )
        refused = CounterMetricFamily("edged_commands_refused_total", "Commands refused, by reason.", labels=["reason"])
        for reason, n in sorted((control.get("refused") or {}).items()):
            refused.add_metric([reason], float(n))
        yield refused


class EdgedCollector(Collector):
    """Builds every metric family from the status snapshot and the histograms, at scrape time."""

    def __init__(self, snapshot: Snapshot, histograms: Histograms) -> None:
        self.snapshot = snapshot
        self.histograms = histograms

    def collect(self) -> Iterator[Metric]:
        """The metric families, now."""
        snap = self.snapshot()
        yield _info(snap)
        yield GaugeMetricFamily(
            "edged_healthy", "1 when `edged status` says running.", value=float(snap.get("state") == "running")
        )
        yield GaugeMetricFamily(
            "edged_uptime_seconds", "Seconds since edged started.", value=float(snap.get("uptime_s", 0))
        )
        yield from _pipelines(snap)
        yield from _spool(snap.get("spool") or {})
        yield from _uplink(snap)
        yield from _clock(snap.get("clock") or {})
        hists = self.histograms()
        stages = ((p, s, h) for p, by in sorted(hists.items()) for s, h in sorted(by.items()) if s != "e2e")
        yield _histogram(
            "edged_stage_latency_seconds", "Time per frame in each stage (pre, infer, post, secondary).",
            ["pipeline", "stage"], (([p, s], h) for p, s, h in stages),
        )  # fmt: skip
        yield _histogram(
            "edged_capture_to_ack_seconds", "From capture to the broker's acknowledgement.", ["pipeline"],
            (([p], by["e2e"]) for p, by in sorted(hists.items()) if "e2e" in by),
        )  # fmt: skip


def _info(snap: dict[str, Any]) -> Metric:
    family = GaugeMetricFamily("edged_info", "edged's version and device (always 1).", labels=["version", "device"])
    family.add_metric([__version__, str(snap.get("device_id"))], 1.0)
    return family


def make_registry(snapshot: Snapshot, histograms: Histograms) -> CollectorRegistry:
    """A registry of its own (not the library's global one, which also holds the process's default metrics)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EdgedCollector(snapshot, histograms))
    return registry


def parse_listen(listen: str) -> tuple[str, int]:
    """`host:port` (IPv6 as `[::1]:9108`; checked with the config) -> (host, port)."""
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)


class _Handler(http.server.BaseHTTPRequestHandler):
    registry: CollectorRegistry

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] not in ("/metrics", "/"):
            self.send_error(404, "only /metrics is here")
            return
        try:
            body = generate_latest(self.registry)
        except Exception:  # a bug in a collector must not end the metrics thread
            log.exception("metrics: building the exposition failed")
            self.send_error(500)
            return
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  (the library's signature)
        log.debug("metrics: %s", format % args)


class MetricsServer(Supervised):
    """`/metrics` on `listen`; bound when made (a port in use fails the start, with the reason)."""

    def __init__(self, listen: str, registry: CollectorRegistry) -> None:
        super().__init__("edged-metrics", restart=Restart())  # the socket outlives the body
        host, port = parse_listen(listen)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
        except OSError as exc:
            self._sock.close()
            raise EdgedError(f"metrics: cannot listen on {listen}: {exc.strerror}") from exc
        self._sock.listen(16)
        self._sock.setblocking(False)
        self.address = self._sock.getsockname()[:2]
        self._handler = type("Handler", (_Handler,), {"registry": registry})
        self._halt = threading.Event()
        self._wake = Waker()

    def body(self) -> None:
        """Serve until stopped, asleep in select() between scrapes."""
        accept_until_halted(self._sock, self._wake, self._halt, self._serve)

    def _serve(self, conn: socket.socket, addr: Any) -> None:
        conn.settimeout(CLIENT_TIMEOUT_S)
        try:
            self._handler(conn, addr, self)
        except OSError as exc:  # a scraper that went away or stalled
            log.debug("metrics: client %s: %s", addr, exc)

    def stop(self, timeout: float = 5.0) -> None:
        """End the thread and close the socket."""
        self.end_restarts()
        self._halt.set()
        self._wake.poke()
        if self.ident is not None:
            self.join(timeout)
        self._sock.close()
        self._wake.close()


class TextfileWriter(Supervised):
    """Writes the metrics to `path` (atomically: the library writes a temporary file and renames it)
    every `interval_s`, and once more on stop; for node_exporter's textfile collector.

    Not fsync'd on purpose: after a power cut the file may be the previous one, or empty (node_exporter
    reads an empty file as no metrics), and it is written again within `interval_s`: its loss is harmless,
    and an fsync every few seconds would wear the flash for nothing."""

    def __init__(self, path: Path, registry: CollectorRegistry, interval_s: float) -> None:
        super().__init__("edged-metrics-textfile", restart=Restart())
        self.path = path
        self.registry = registry
        self.interval_s = interval_s
        self._halt = threading.Event()

    def body(self) -> None:
        """Write, then sleep until the next time or the stop."""
        while True:
            self._write()
            if self._halt.wait(self.interval_s):
                self._write()  # the last figures stay for node_exporter to read
                return

    def _write(self) -> None:
        try:
            write_to_textfile(str(self.path), self.registry)
        except OSError as exc:
            log.warning("metrics: cannot write %s: %s", self.path, exc.strerror)

    def stop(self, timeout: float = 5.0) -> None:
        """The last write, then end."""
        self.end_restarts()
        self._halt.set()
        if self.ident is not None:
            self.join(timeout)


def start_metrics(
    cfg: MetricsConfig, snapshot: Snapshot, histograms: Histograms
) -> list[MetricsServer | TextfileWriter]:
    """The configured metrics outputs, started (none when `metrics:` names neither)."""
    if cfg.listen is None and cfg.textfile is None:
        return []
    registry = make_registry(snapshot, histograms)
    parts: list[MetricsServer | TextfileWriter] = []
    if cfg.listen is not None:
        server = MetricsServer(cfg.listen, registry)
        parts.append(server)
        log.info("metrics on http://%s:%d/metrics", *server.address)
    if cfg.textfile is not None:
        parts.append(TextfileWriter(cfg.textfile, registry, cfg.textfile_interval_s))
    for part in parts:
        part.start()
    return parts
