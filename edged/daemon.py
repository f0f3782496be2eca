"""Wiring and lifecycle: start (spool, models, publisher, sources), run, stop without losing results."""

from __future__ import annotations

import logging
import os
import select
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from edged import __version__
from edged.config import Config
from edged.control.controller import Controller
from edged.control.trial import Recovered, on_trial
from edged.core.clock import ClockWatch
from edged.core.durable import make_dirs
from edged.core.errors import EdgedError
from edged.core.waker import Waker
from edged.ops import crashlog
from edged.ops.checkconfig import check_config
from edged.ops.health import Report
from edged.ops.metrics import MetricsServer, TextfileWriter, start_metrics
from edged.ops.reload import Reloader
from edged.ops.statelock import StateLock
from edged.ops.status import StatusServer
from edged.ops.systemd import notify, watchdog_interval
from edged.pipeline.frametap import FrameTap
from edged.pipeline.lastgood import ModelGuard
from edged.pipeline.runner import PipelineRunner
from edged.pipeline.settings import PipelineConfig
from edged.pipeline.startup import child_probe, load_models, prove_models, stopped_cleanly
from edged.pipeline.worker import ResultHook
from edged.store.spool import Spool
from edged.uplink.clockmessage import ClockMessage
from edged.uplink.gapmessage import gap_announcer
from edged.uplink.homeassistant import STATE_FILE as HA_STATE_FILE
from edged.uplink.homeassistant import Discovery
from edged.uplink.hooks import Announce
from edged.uplink.mqttstats import MqttStats
from edged.uplink.publisher import Publisher
from edged.uplink.replay import ReplayRequests
from edged.uplink.sidechannel import SideChannel
from edged.uplink.statsmessage import StatsMessage
from edged.uplink.topics import Topics

log = logging.getLogger(__name__)

STATUS_EVERY_S = 5.0
PROVE_EVERY_S = 10.0  # how often a running model is looked at for having run cleanly (pipeline/lastgood.py)
LOG_EVERY_S = 60.0  # a one-line summary in the journal
STOP_DEADLINE_S = 25.0  # everything stop() does, below TimeoutStopSec=30 in systemd/edged.service
RELOAD_JOIN_S = 5.0  # a model swap in progress (a TensorRT build can take minutes: it is abandoned)
FLUSH_S = 10.0
PUBLISHER_CLOSE_S = 3.0  # after the grace: `offline`, DISCONNECT, paho's thread


class ControlPort:
    """What the control stage may ask of the daemon (control/context.py ControlTarget), and nothing else:
    the status, a reload, the config file and its check, a pipeline's frames and config, the model check."""

    def __init__(
        self,
        reloader: Reloader,
        pipelines: list[PipelineRunner],
        snapshot: Callable[[], dict[str, Any]],
        candidate_check: list[str],
        guard: ModelGuard,
    ) -> None:
        self.reloader = reloader
        self.pipelines = pipelines
        self._snapshot = snapshot
        self.candidate_check = candidate_check
        self.guard = guard

    def model_proved(self, pipeline: str, path: Path, sha256: str) -> None:
        """A rollout's watch kept the model: the pipeline's last good model now."""
        self.guard.proved(pipeline, path, sha256, self.pipeline_config(pipeline).model.custom_ops)

    def kept_models(self) -> set[Path]:
        """Model files kept as some pipeline's last good one (a rollout's tidying leaves them)."""
        return self.guard.kept()

    def snapshot(self) -> dict[str, Any]:
        """The status JSON."""
        return self._snapshot()

    def reload_and_wait(self, timeout: float) -> dict[str, Any]:
        """Reload the config file now and wait for the outcome."""
        return self.reloader.reload_and_wait(timeout)

    def config_file(self) -> Path | None:
        """The config file this daemon runs from."""
        return self.reloader.config_path

    def candidate_command(self) -> list[str]:
        """The command that judges a rollout's model (SPEC.json is appended); empty when none was given."""
        return self.candidate_check

    def check_config(self, path: Path) -> object:
        """Check a config file exactly as check-config does (schema, paths, each pipeline's model dry run), with
        the daemon's own rights to write the paths it names; ConfigError with every problem."""
        return check_config(path, as_daemon=True)

    def frame_tap(self, pipeline: str | None) -> tuple[str, FrameTap]:
        """A pipeline's frame tap (the first pipeline's for None)."""
        for runner in self.pipelines:
            if (pipeline is None or runner.name == pipeline) and runner.outlet is not None:
                return runner.name, runner.outlet.tap
        raise EdgedError(f"no running pipeline {pipeline!r}; this device has {[r.name for r in self.pipelines]}")

    def pipeline_config(self, name: str) -> PipelineConfig:
        """The running config of a pipeline."""
        for runner in self.pipelines:
            if runner.name == name:
                return runner.cfg
        raise EdgedError(f"no pipeline {name!r}")


def control_hooks(
    cfg: Config, publisher: Publisher, port: ControlPort, clock: ClockWatch, recovered: Recovered | None
) -> Controller | None:
    """Remote control (off unless `control:` is configured) rides on the publisher's connection: the controller
    and its side channel (replies, events and the reported state: not spooled, before the next results)."""
    if cfg.control is None:
        return None
    side = SideChannel()
    publisher.add_hook(side)
    controller = Controller(cfg.control, cfg.device_id, cfg.state_dir, target=port, side=side,
                            last_step=lambda: clock.last_step, recovered=recovered)  # fmt: skip
    publisher.add_hook(controller)  # its command topics ride on the connection
    return controller


def discovery_hook(cfg: Config, topics: Topics) -> Announce | None:
    """Home Assistant discovery on each connection; also when it was turned off, to remove the entities."""
    if not (cfg.homeassistant.enabled or (cfg.state_dir / HA_STATE_FILE).exists()):
        return None
    discovery = Discovery(
        cfg.homeassistant,
        device_id=cfg.device_id,
        pipelines=cfg.pipelines,
        results_topic={p.name: topics.results(p.name) for p in cfg.pipelines},
        stats_topic=topics.stats,
        availability_topic=topics.availability,
        stats_interval_s=cfg.mqtt.stats_interval_s,
    )
    return Announce(lambda: discovery.messages(cfg.state_dir))


def uplink(d: Daemon, cfg: Config, spool: Spool) -> tuple[Publisher, ReplayRequests | None, Controller | None]:
    """The publisher and what rides on it: the clock and stats messages, replay, remote control, discovery."""
    publisher = Publisher(cfg.mqtt, cfg.device_id, spool, d.mqtt_stats, on_death=d.fatal_death,
                          correct=d.clock.correct)  # fmt: skip
    if cfg.mqtt.clock_topic:
        publisher.add_hook(ClockMessage(d.topics.clock, cfg.device_id, d.clock))
    if cfg.mqtt.stats_interval_s:
        publisher.add_hook(StatsMessage(cfg.mqtt, cfg.device_id, d.report.snapshot))
    replay = None
    if cfg.mqtt.replay_topic and spool.window.enabled:
        replay = ReplayRequests(spool.replay, cfg.device_id, d.topics.replay, cfg.mqtt.replay_max_bytes_per_hour)
        publisher.add_hook(replay)
    guard = d.guard if d.guard is not None else ModelGuard(cfg.state_dir)
    port = ControlPort(d.reloader, d.pipelines, d.report.snapshot, d.candidate_check, guard)
    controller = control_hooks(cfg, publisher, port, d.clock, d.recovered)
    if (announce := discovery_hook(cfg, d.topics)) is not None:
        publisher.add_hook(announce)
    return publisher, replay, controller


def left_behind(count: int, *, mqtt: bool) -> str:
    """What a stop leaves in the spool, for its last log line."""
    if not count:
        return "nothing left to send"
    if mqtt:
        return f"{count} result(s) still in the spool go when it runs again"
    return f"{count} result(s) in the spool (mqtt is off)"


class Daemon:
    """Owns every thread. `start()` then `wait()` then `stop()`; `request_stop()` from anywhere."""

    def __init__(
        self,
        config: Config,
        *,
        config_path: Path | None = None,
        on_result: ResultHook | None = None,
        source_kwargs: dict[str, Any] | None = None,
        candidate_check: Sequence[str] = (),
        model_probe: Sequence[str] = (),
        recovered: Recovered | None = None,
    ) -> None:
        """`recovered`: a rollout's trial that a crash interrupted, rolled back before this start (control/trial.py):
        reported once connected."""
        # the command that judges a rollout's model in a child process (edged.tools.candidate, handed in by
        # the CLI: the daemon never names a later stage); empty: rollouts are refused
        self.candidate_check = list(candidate_check)
        self.model_probe = list(model_probe)  # loads a model in a child process (edged.tools.probe), from the CLI too
        self.recovered = recovered
        self.state = "starting"
        self.started = time.monotonic()
        # wait() sleeps on this; a stop request, a SIGHUP or an inference worker that ended pokes it (safe
        # from a signal handler: see edged/core/waker.py)
        self._stop_asked = False
        self._reload_asked = False
        self._wake: Waker | None = None  # made by start()
        self._stopped = False
        self.fatal: str | None = None  # a thread that does not restart in-process died: exit 1, systemd restarts
        self.watchdog_stopped = False
        self.mqtt_stats = MqttStats(enabled=config.mqtt.enabled)
        # whether the wall clock is trusted; frames stamped while it is not (core/clock.py)
        self.clock = ClockWatch(config.clock, config.state_dir)
        self.clock.on_change(self._poke)  # a step seen at a frame: wait() asks the time service at once
        self.topics = Topics(config.mqtt, config.device_id)  # the uplink names every topic (uplink/topics.py)
        self.pipelines = [
            PipelineRunner(
                p,
                state_dir=config.state_dir,
                device_id=config.device_id,
                topic=self.topics.results(p.name),
                events_topic=self.topics.events(p.name),
                on_result=on_result,
                on_worker_exit=self._poke,
                source_kwargs=source_kwargs,
                notify=notify,
                clock=self.clock,
            )
            for p in config.pipelines
        ]
        self.reloader = Reloader(config, self.pipelines, config_path)  # owns the running config from here on
        self.guard: ModelGuard | None = None  # last good models, models on trial (pipeline/lastgood.py): start()
        self._models_seen: dict[str, tuple[str, float, int]] = {}  # the model each runs, since when (prove_models)
        self._prove_models = lambda: prove_models(self.pipelines, self.guard, self._models_seen,
                                                  on_trial(self.config.state_dir))  # fmt: skip
        self.spool: Spool | None = None
        self.left_in_spool = 0  # results still waiting for the broker when stop() finished
        self.publisher: Publisher | None = None
        self.status_server: StatusServer | None = None
        self.state_lock: StateLock | None = None
        self.controller: Controller | None = None
        self.replay: ReplayRequests | None = None  # answers consumers' replay requests (uplink/replay.py)
        self.metrics: list[MetricsServer | TextfileWriter] = []
        self.report = Report(self)  # the status JSON, health and reasons: a pure read of the parts above

    @property
    def config(self) -> Config:
        """The running config (a reload replaces it: ops/reload.py owns it)."""
        return self.reloader.config

    # -- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> None:
        """Open the spool, load and warm up every model, then start the threads and report READY."""
        cfg = self.config
        make_dirs(cfg.state_dir, 0o750)  # durably: the spool's folder must outlive a cut at the first start
        self._wake = Waker()
        # a native crash from here on leaves its report; only a crash (not a power cut) counts against a model
        self.guard = guard = ModelGuard(cfg.state_dir, crashed=crashlog.arm(cfg.state_dir) is not None)
        try:
            self.state_lock = StateLock(cfg.state_dir)  # before anything is opened: one daemon per state_dir
            self.clock.check()  # before the first frame: is the wall clock to be trusted?
            self.spool = Spool(cfg.state_dir / "spool.db", cfg.spool, dead_letter_after=cfg.mqtt.dead_letter_after)
            self.spool.announce_gaps(gap_announcer(self.topics))
            self.spool.start(on_death=self.fatal_death)
            self.status_server = StatusServer(cfg.status_socket, self.report.snapshot, cfg.status.mode)
            self.status_server.start()
            self.metrics = start_metrics(cfg.metrics, self.report.snapshot, self.report.histograms)
            if cfg.mqtt.enabled:  # secrets are read here: a bad key file stops edged before the models load
                self.publisher, self.replay, self.controller = uplink(self, cfg, self.spool)
            models = load_models(self.pipelines, cfg.state_dir, guard,
                                 child_probe(self.model_probe, self.reloader.config_path))  # fmt: skip
        except EdgedError:
            self.publisher = None
            self._close_partial()
            raise
        # the pipelines first: the first stats message and discovery on the connection describe their models
        # (results made meanwhile wait in the spool)
        for runner, model in zip(self.pipelines, models, strict=True):
            if model is not None:  # else set aside: its reason in status, the rest runs on
                runner.start(model, self.spool)
        if self.controller is not None:
            self.controller.start()
        if self.publisher is not None:
            self.publisher.start()
        self.reloader.start()
        self.state = "running"
        notify("READY=1")
        log.info(
            "edged %s running: %d pipeline(s), status on %s",
            __version__,
            len(self.pipelines),
            cfg.status_socket,
        )

    def _close_partial(self, spool_timeout: float = 30.0) -> None:
        for part in self.metrics:
            part.stop()
        server, self.status_server = self.status_server, None
        if server is not None:
            server.stop()
        spool, self.spool = self.spool, None
        if spool is not None:
            spool.close(max(1.0, spool_timeout))
        lock, self.state_lock = self.state_lock, None
        if lock is not None:
            lock.release()
        wake, self._wake = self._wake, None
        if wake is not None:  # a late signal's poke finds nothing to write to
            wake.close()

    def request_reload(self) -> None:
        """Re-read the config file now (from code; a signal handler calls `signal_reload`)."""
        self.reloader.request_reload()

    def signal_reload(self) -> None:
        """SIGHUP: `wait()` passes the request on to the reloader (safe from a signal handler)."""
        self._reload_asked = True
        self._poke()

    def fatal_death(self, why: str) -> None:
        """A thread whose state cannot be resumed in-process died (the publisher, the spool's writer or its seq
        lease): stop, flushing what can be flushed, and exit 1 so that systemd starts edged afresh from the
        spool on disk (Restart=on-failure). Threads that heal in-process restart themselves (core/threads.py)."""
        if self.fatal is None:
            self.fatal = why
            log.critical(
                "a thread that does not restart in-process died (%s): stopping so that systemd restarts "
                "edged (results are safe in the spool)",
                why,
            )
        self.request_stop()

    def request_stop(self) -> None:
        """Ask `wait()` to return; safe from signal handlers and other threads."""
        self._stop_asked = True
        self._poke()

    def _stopping(self) -> bool:
        return self._stop_asked  # set by a signal handler or another thread (a method: not narrowed by mypy)

    def _poke(self) -> None:
        wake = self._wake
        if wake is not None:
            wake.poke()

    def wait(self) -> None:
        """Block until a stop is requested or every pipeline has ended; feed sd_notify STATUS= and WATCHDOG=.
        Asleep between its timers (status line, watchdog ping, journal summary): a worker that ends wakes it."""
        wake = self._wake
        if wake is None:
            raise RuntimeError("Daemon.wait() before start()")
        with wake.on_signals():
            self._wait(wake)

    def _wait(self, wake: Waker) -> None:
        timers = self._timers()
        while not self._stopping():
            select.select([wake], [], [], max(0.0, min(due for due, _, _ in timers) - time.monotonic()))
            wake.drain()
            if self._stopping():
                return
            if self.clock.check_wanted.is_set():  # a source saw the wall clock step
                self.clock.check()
            if self._reload_asked:
                self._reload_asked = False
                self.reloader.request_reload()
            now = time.monotonic()
            for i, (due, every, act) in enumerate(timers):
                if now >= due:
                    timers[i] = (now + every, every, act)
                    act()
            started = [runner for runner in self.pipelines if runner.aside is None]
            for runner in started:
                if not runner.running():
                    runner.stop_source()  # a failed pipeline's source has nobody to feed
            if started and not any(runner.running() for runner in started):
                log.info("every pipeline has ended; stopping")
                return

    def _timers(self) -> list[tuple[float, float, Callable[[], object]]]:
        """(next due, period, action) of wait()'s timers: the journal summary, the clock's check, and under
        systemd the STATUS= line and the watchdog ping."""
        now = time.monotonic()
        timers: list[tuple[float, float, Callable[[], object]]] = [
            (now + LOG_EVERY_S, LOG_EVERY_S, lambda: log.info("%s", self.report.status_line())),
            (now + self.config.clock.check_s, self.config.clock.check_s, self.clock.check),
            (now, PROVE_EVERY_S, self._prove_models),
        ]
        if self.controller is not None:  # the retained state follows health changes
            timers.append((now + STATUS_EVERY_S, STATUS_EVERY_S, self.controller.report_state))
        if os.environ.get("NOTIFY_SOCKET"):
            timers.append((now, STATUS_EVERY_S, lambda: notify("STATUS=" + self.report.status_line())))
        ping_every = watchdog_interval()
        if ping_every:
            timers.append((now, ping_every, self._watchdog))
        return timers

    def _watchdog(self) -> None:
        """WATCHDOG=1 only while every pipeline shows progress: a hung run stops the pings, systemd restarts us."""
        stalled = [runner.name for runner in self.pipelines if runner.stats.stalled(self.config.watchdog_stall_s)]
        if not stalled:
            notify("WATCHDOG=1")
        elif not self.watchdog_stopped:
            self.watchdog_stopped = True
            log.error(
                "pipeline(s) %s made no progress for %.0f s; not feeding the systemd watchdog",
                ", ".join(stalled), self.config.watchdog_stall_s,
            )  # fmt: skip

    def stop(self) -> None:
        """Stop sources, finish frames in flight, commit, publish within the grace period, say offline.

        One deadline for all of it, STOP_DEADLINE_S, below the unit's TimeoutStopSec (30 s) so that systemd
        never has to kill us mid-commit: a source stuck in a read (a camera that went silent: OpenCV blocks
        in FFmpeg) is abandoned at its share of the deadline with a log line, its slot closed so the
        workers finish; the publisher's grace shrinks to what is left. Committed results are safe whatever
        is abandoned.
        """
        if self._stopped:
            return
        self._stopped = True
        ran = self.state == "running"  # a refused start stops what it opened, and says nothing of a stop
        self.state = "stopping"
        notify("STOPPING=1")
        deadline = time.monotonic() + STOP_DEADLINE_S

        def left(cap: float) -> float:
            return max(0.0, min(cap, deadline - time.monotonic()))

        self.reloader.stop(left(RELOAD_JOIN_S))
        if self.controller is not None:
            self.controller.stop(left(RELOAD_JOIN_S))  # its last reply still goes before the publisher stops
        for runner in self.pipelines:
            runner.stop_source()  # every source is asked first, then each pipeline is waited for
        pipelines_done = deadline - FLUSH_S - self.config.mqtt.shutdown_grace_s - PUBLISHER_CLOSE_S
        for runner in self.pipelines:
            runner.finish(max(time.monotonic(), pipelines_done))
        if self.spool is not None and not self.spool.flush(left(FLUSH_S)):
            log.error("spool: could not commit every result before stopping")
        if self.publisher is not None:
            grace = left(self.config.mqtt.shutdown_grace_s)
            self.publisher.request_stop(grace)
            self.publisher.join(left(grace + PUBLISHER_CLOSE_S))
        if self.spool is not None:
            self.left_in_spool = self.spool.depth
        self._close_partial(left(STOP_DEADLINE_S))
        if ran:
            stopped_cleanly(self.guard, self.pipelines)
            crashlog.disarm()
            log.info("edged stopped; %s", left_behind(self.left_in_spool, mqtt=self.config.mqtt.enabled))


def run_daemon(daemon: Daemon) -> int:
    """Start, wait for SIGTERM/SIGINT (or the end of every pipeline), stop. A second signal exits at once."""
    signals = {"count": 0}

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        signals["count"] += 1
        if signals["count"] > 1:
            log.warning("second %s: exiting now (committed results are safe on disk)", signal.Signals(signum).name)
            os._exit(1)
        log.info("%s received: stopping", signal.Signals(signum).name)
        daemon.request_stop()

    def on_hup(_signum: int, _frame: FrameType | None) -> None:
        daemon.signal_reload()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, on_hup)
    try:
        daemon.start()
        daemon.wait()
    finally:
        daemon.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)
    # a pipeline set aside at start is no reason to exit: systemd would start edged on the same models again
    failed = [r.name for r in daemon.pipelines if r.stats.state == "failed" and r.aside is None]
    return 1 if failed or daemon.fatal else 0
