"""Shared fixtures: a real Mosquitto broker, a subscriber, tiny real ONNX models, daemon processes."""

from __future__ import annotations

import getpass
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnx
import paho.mqtt.client as paho
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper
from paho.mqtt.enums import CallbackAPIVersion
from pgserver import PgServer, make_server
from reasons_seen import SEEN as REASONS_SEEN
from reasons_seen import install as record_reasons

from edged.control.envelope import new_command
from edged.core.signing import generate_key, load_private_key
from edged.fleet.send import BrokerOptions, FleetClient
from edged.model.preprocess import PreprocessSpec

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))  # tests import the repository's scripts (config_table, ...)
ASSETS = REPO / "edged" / "assets"
record_reasons()  # before the test modules import query: every reasons line seen is held to the catalog


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def answers(host: str, port: int) -> bool:
    """Whether something accepts TCP connections on host:port (a broker that has started)."""
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


# -- Mosquitto -------------------------------------------------------------------------------------------


@dataclass
class Broker:
    host: str
    port: int
    workdir: Path
    proc: subprocess.Popen[bytes] | None = None
    extra_conf: str = ""
    persistent: bool = False  # keep subscriber sessions across a broker restart

    def start(self) -> None:
        exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        if not Path(exe).exists():
            pytest.fail("mosquitto is not installed; the README's test command installs it (apt-get install mosquitto)")
        conf = self.workdir / "mosquitto.conf"
        persistence = f"persistence true\npersistence_location {self.workdir}/\n" if self.persistent else ""
        conf.write_text(
            # `user`: stay the user we are, so the broker can read files in pytest's private tmp dirs
            f"listener {self.port} 127.0.0.1\nallow_anonymous true\nuser {getpass.getuser()}\n{persistence}"
            "max_inflight_messages 0\nmax_queued_messages 100000\n" + self.extra_conf,
            encoding="utf-8",
        )
        with (self.workdir / "mosquitto.log").open("ab") as log:
            self.proc = subprocess.Popen([exe, "-c", str(conf)], stdout=log, stderr=log)
        wait_for(self._answers, 10, f"mosquitto on port {self.port}")

    def _answers(self) -> bool:
        return answers(self.host, self.port)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None


@pytest.fixture(scope="session")
def broker() -> Iterator[Broker]:
    """One broker for the session (tests use their own topics via distinct device ids)."""
    with tempfile.TemporaryDirectory(prefix="edged-mq-") as d:
        b = Broker("127.0.0.1", free_port(), Path(d))
        b.start()
        yield b
        b.stop()


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[Broker]:
    """A broker the test starts and stops itself (not started yet)."""
    b = Broker("127.0.0.1", free_port(), tmp_path)
    yield b
    b.stop()


@dataclass
class Subscriber:
    """Collects every message on a topic filter (paho's own thread; a test helper, not the code under test)."""

    host: str
    port: int
    topic: str
    persistent: bool = False  # a clean_session=False session: the broker queues for it while it is away
    username: str | None = None  # a broker that wants one (ejabberd: any name, any password)
    messages: list[tuple[str, bytes, bool]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.subscribed = threading.Event()
        self.client = paho.Client(
            callback_api_version=CallbackAPIVersion.VERSION2,
            client_id=f"sub-{os.getpid()}-{id(self)}",
            clean_session=not self.persistent,
        )
        self.client.reconnect_delay_set(0.05, 0.3)  # type: ignore[arg-type]  # paho hints int; float seconds work
        if self.username is not None:
            self.client.username_pw_set(self.username, "anything")
        self.client.on_connect = lambda c, *_: c.subscribe(self.topic, qos=1)
        self.client.on_subscribe = lambda *_: self.subscribed.set()
        self.client.on_message = self._on_message
        self.client.connect(self.host, self.port)
        self.client.loop_start()
        assert self.subscribed.wait(10), "subscriber could not subscribe"

    def _on_message(self, _c: Any, _u: Any, msg: paho.MQTTMessage) -> None:
        with self.lock:
            self.messages.append((msg.topic, bytes(msg.payload), bool(msg.retain)))

    def results(self) -> list[dict[str, Any]]:
        with self.lock:
            return [json.loads(p) for t, p, _ in self.messages if t.endswith("/results")]

    def payloads(self, topic: str) -> list[tuple[bytes, bool]]:
        with self.lock:
            return [(p, r) for t, p, r in self.messages if t == topic]

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


Subscribe = Callable[..., "Subscriber"]


@pytest.fixture
def subscribe() -> Iterator[Callable[..., Subscriber]]:
    subs: list[Subscriber] = []

    def make(b: Broker, topic: str, *, persistent: bool = False) -> Subscriber:
        s = Subscriber(b.host, b.port, topic, persistent, getattr(b, "username", None))
        subs.append(s)
        return s

    yield make
    for s in subs:
        s.close()


# -- tiny real models --------------------------------------------------------------------------------------


def make_tiny_model(
    path: Path,
    *,
    size: int = 8,
    classes: int = 4,
    with_metadata: bool = True,
    gain: float = 10.0,
    order: tuple[int, int, int] = (0, 1, 2),
    upsample: int = 0,
) -> Path:
    """A real ONNX classifier: mean colour per channel -> Gemm -> logits. Class = brightest channel (R,G,B).
    Variants: `gain` scales the logits (same answers), `order` permutes the classes (wrong answers),
    `upsample` resizes the image to that size before the mean (same answers, much slower)."""
    x = helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, size, size])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, classes])
    w = np.zeros((3, classes), dtype=np.float32)
    for i in range(min(3, classes)):
        w[i, order[i]] = gain
    init = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.zeros(classes, np.float32), "B")]
    nodes = [
        helper.make_node("GlobalAveragePool", ["big" if upsample else "image"], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["flat"]),
        helper.make_node("Gemm", ["flat", "W", "B"], ["logits"]),
    ]
    if upsample:
        init.append(numpy_helper.from_array(np.array([1, 3, upsample, upsample], np.int64), "sizes"))
        nodes.insert(0, helper.make_node("Resize", ["image", "", "", "sizes"], ["big"], mode="linear"))
    graph = helper.make_graph(nodes, "tiny", [x], [y], initializer=init)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    if with_metadata:
        spec = PreprocessSpec(size=(size, size), resize="stretch", color="rgb", layout="nchw", dtype="float32")
        helper.set_model_props(
            model,
            {
                "edged.preprocess": spec.to_metadata(),
                "edged.labels": json.dumps(["red", "green", "blue", "none"][:classes]),
                "edged.name": "tiny",
            },
        )
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


@pytest.fixture
def tiny_model(tmp_path: Path) -> Path:
    return make_tiny_model(tmp_path / "tiny.onnx")


def make_video(path: Path, frames: int, *, size: tuple[int, int] = (64, 48), fps: float = 20.0) -> Path:
    """A real mp4 whose frame i is pure red, green or blue (i % 3)."""
    import cv2

    fourcc = "MJPG" if path.suffix == ".avi" else "mp4v"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*fourcc), fps, size)
    assert writer.isOpened()
    colors = [(0, 0, 255), (0, 255, 0), (255, 0, 0)]  # BGR: red, green, blue
    for i in range(frames):
        img = np.zeros((size[1], size[0], 3), np.uint8)
        img[:] = colors[i % 3]
        writer.write(img)
    writer.release()
    return path


# -- configs and daemon processes ----------------------------------------------------------------------------


def write_config(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def base_config(
    tmp_path: Path, model: Path, uri: str, *, broker: Broker | None = None, **source: Any
) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "device_id": f"t{os.getpid()}-{tmp_path.name[-12:].replace('_', '-')}",
        "state_dir": str(tmp_path / "state"),
        "mqtt": {
            "enabled": broker is not None,
            "host": "127.0.0.1",
            "port": broker.port if broker else 1,
            "reconnect_min_s": 0.1,
            "reconnect_max_s": 0.5,
            "reconnect_spread_s": 0,  # tests wait for conditions; the spread has a test of its own
        },
        "spool": {"batch_ms": 50},
        "pipelines": [
            {
                "name": "cam0",
                "source": {
                    "type": "camera",
                    "uri": uri,
                    "fps": 0,
                    "stop_at_end": True,
                    "reconnect_min_s": 0.05,
                    "reconnect_max_s": 0.2,
                    **source,
                },
                "model": {"path": str(model), "providers": ["CPUExecutionProvider"], "warmup_runs": 1},
            }
        ],
    }
    return cfg


@dataclass
class DaemonProc:
    proc: subprocess.Popen[str]
    socket: Path
    state: Path | None = None  # its state_dir: a fatal signal's stacks go to last-crash.txt there (ops/crashlog.py)

    def status(self) -> dict[str, Any] | None:
        from edged.core.errors import StatusError
        from edged.ops.status import query

        try:
            return query(self.socket, timeout=1.0)
        except StatusError:
            return None

    def wait(self, timeout: float = 60) -> tuple[int, str]:
        """Wait for the daemon to exit by itself; (exit code, stderr)."""
        _, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, err

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> tuple[int, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            _, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            # a hang: SIGABRT makes faulthandler (PYTHONFAULTHANDLER=1) print every thread's stack
            self.proc.send_signal(signal.SIGABRT)
            _, err = self.proc.communicate(timeout=30)
            crash = self.state / "last-crash.txt" if self.state is not None else None
            stacks = crash.read_text(errors="replace") if crash is not None and crash.exists() else ""
            pytest.fail(f"the daemon did not stop within {timeout} s; its stderr and stacks:\n{err[-20000:]}\n{stacks}")
        return self.proc.returncode, err


class StartDaemon(Protocol):
    """Start `edged run --config config` (in `env`, else this process's environment)."""

    def __call__(self, config: Path, env: dict[str, str] | None = None) -> DaemonProc: ...


class NotifySocket:
    """Stands in for systemd's NOTIFY_SOCKET: collects the datagrams the daemon sends."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.messages: list[str] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._read, name="test-notify", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except TimeoutError:  # noqa: PERF203  (a poll loop, not a hot path)
                continue

    def count(self, prefix: str) -> int:
        return sum(m.startswith(prefix) for m in list(self.messages))

    def close(self) -> None:
        self._stop.set()
        self.thread.join(2)
        self.sock.close()


@pytest.fixture
def notify_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[NotifySocket]:
    path = tmp_path / "notify"
    ns = NotifySocket(path)  # a datagram socket standing in for systemd's
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    monkeypatch.setenv("WATCHDOG_USEC", "200000")  # WatchdogSec=0.2s: a ping every 0.1 s
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    yield ns
    ns.close()


@pytest.fixture
def start_daemon() -> Iterator[StartDaemon]:
    procs: list[DaemonProc] = []

    def start(config: Path, env: dict[str, str] | None = None) -> DaemonProc:
        state = yaml.safe_load(config.read_text())["state_dir"]
        proc = subprocess.Popen(
            [sys.executable, "-m", "edged", "run", "--config", str(config)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**(env or os.environ), "PYTHONFAULTHANDLER": "1"},
        )
        d = DaemonProc(proc, Path(state) / "status.sock", Path(state))
        procs.append(d)
        return d

    yield start
    for d in procs:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.communicate()


# -- remote control: a broker, daemons with control on, a fleet client with its key ---------------------------


@dataclass
class Rig:
    """A broker, a model, a way to start daemons and a fleet client with its key."""

    tmp_path: Path
    broker: Broker
    model: Path
    start_daemon: StartDaemon
    fleet: FleetClient
    key: Path
    public: str


@pytest.fixture
def rig(tmp_path: Path, broker: Broker, tiny_model: Path, start_daemon: StartDaemon) -> Iterator[Rig]:
    key = tmp_path / "fleet.key"
    public = generate_key(key)
    fleet = FleetClient(BrokerOptions(broker.host, broker.port), load_private_key(key))
    yield Rig(tmp_path, broker, tiny_model, start_daemon, fleet, key, public)
    fleet.close()


def control_daemon(
    rig: Rig,
    name: str = "d",
    groups: tuple[str, ...] = (),
    *,
    wait: bool = True,
    pipeline: dict[str, Any] | None = None,
    **control: Any,
) -> tuple[DaemonProc, dict[str, Any], Path]:
    """A daemon on a looping 20 fps video with `control:` on (plus `control` keys, and `pipeline` keys for
    its one pipeline), connected unless not `wait`."""
    home = rig.tmp_path / name
    home.mkdir()
    video = make_video(home / "v.mp4", 20)
    cfg = base_config(home, rig.model, str(video), broker=rig.broker, fps=20, loop=True, stop_at_end=False)
    cfg["control"] = {"public_keys": [rig.public], "groups": list(groups), **control}
    cfg["pipelines"][0].update(pipeline or {})
    path = write_config(home / "edged.yaml", cfg)
    daemon = rig.start_daemon(path)
    if wait:
        wait_connected(daemon)
    return daemon, cfg, path


def wait_connected(daemon: DaemonProc) -> None:
    """Connected, and with `control:` on, subscribed to its commands (a command sent before is not queued)."""

    def ready() -> bool:
        status = daemon.status() or {}
        control = status.get("control")
        return bool(status.get("mqtt", {}).get("connected")) and (control is None or control.get("listening"))

    wait_for(ready, 90, "the daemon connected")


def ask(fleet: FleetClient, cmd: str, target: str, args: dict[str, Any] | None = None, *,
        expect: int = 1, timeout: float = 60) -> dict[str, dict[str, Any]]:  # fmt: skip
    return fleet.wait(fleet.send(new_command(cmd, target, args)), expect=expect, timeout=timeout)


# -- PostgreSQL (Debian's package; skipped with the reason when it is not installed) ---------------------


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    workdir = Path(tempfile.mkdtemp(prefix="edged-pg-"))  # in /tmp: the postgres user can reach it
    server = make_server(workdir, free_port())
    server.init()
    server.start()
    yield server
    server.stop()
    shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def pg_url(pg_server: PgServer) -> str:
    """A fresh, empty database on the session's PostgreSQL server."""
    import psycopg

    name = f"t{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return pg_server.url.rsplit("/", 1)[0] + f"/{name}"


# a test that starts a broker or a daemon process is an integration test by definition; the others that
# take long (a whole pipeline in-process, quantization) carry the marker themselves
INTEGRATION_FIXTURES = {
    "rig",
    "broker",
    "own_broker",
    "subscribe",
    "start_daemon",
    "tls_broker",
    "pki",
    "pg_server",
    "pg_url",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if INTEGRATION_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


FILE_SECONDS: dict[str, float] = {}  # test file -> seconds of its tests (setup, call, teardown)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Add each phase's time to its test file's (EDGED_DURATIONS=FILE writes them: where the suite's time goes)."""
    name = report.nodeid.split("::", 1)[0]
    FILE_SECONDS[name] = FILE_SECONDS.get(name, 0.0) + report.duration


def pytest_configure(config: pytest.Config) -> None:
    """The run's own folder where pytest-xdist's workers leave the reasons lines they saw (the controller's
    sessionfinish holds them all to the catalog): set before the workers start, so they inherit it."""
    if not hasattr(config, "workerinput"):
        os.environ["EDGED_REASONS_SHARE"] = tempfile.mkdtemp(prefix="edged-reasons-")


def _gathered_reasons(session: pytest.Session) -> set[str] | None:
    """Every reasons line the run saw: a worker leaves its own in the share (and gets None), the controller
    (or a run without workers) gathers them all."""
    share = os.environ.get("EDGED_REASONS_SHARE")
    worker: dict[str, Any] | None = getattr(session.config, "workerinput", None)
    if worker is not None:
        if share:
            lines = "".join(f"{line}\n" for line in sorted(REASONS_SEEN))
            Path(share, f"{worker['workerid']}.txt").write_text(lines, encoding="utf-8")
        return None
    seen = set(REASONS_SEEN)
    if share:
        for part in Path(share).glob("*.txt"):
            seen.update(part.read_text(encoding="utf-8").splitlines())
        shutil.rmtree(share, ignore_errors=True)
    return seen


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Every reasons line the session saw must be one docs/status.md explains (edged/ops/reasons.py): a new
    line in the code without a catalog entry fails the run. EDGED_REASONS_SEEN=FILE writes them all;
    EDGED_DURATIONS=FILE the seconds per test file, the slowest first. Under pytest-xdist each worker hands its
    lines to the controller, which checks and writes (its logreport hook sees every worker's durations)."""
    from edged.ops.reasons import explain

    seen = _gathered_reasons(session)
    if seen is None:
        return
    durations = os.environ.get("EDGED_DURATIONS")
    if durations:
        ranked = dict(sorted(FILE_SECONDS.items(), key=lambda kv: -kv[1]))
        Path(durations).write_text(json.dumps({k: round(v, 1) for k, v in ranked.items()}, indent=1), encoding="utf-8")
    out = os.environ.get("EDGED_REASONS_SEEN")
    if out:
        Path(out).write_text("".join(f"{line}\n" for line in sorted(seen)), encoding="utf-8")
    unknown = sorted(line for line in seen if explain(line) is None)
    if unknown:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line("reasons lines docs/status.md does not explain (add them to edged/ops/reasons.py):")
            for line in unknown:
                reporter.write_line(f"  {line}")
        if exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
