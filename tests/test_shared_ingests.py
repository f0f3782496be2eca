"""Several `edged ingest` in one shared group on one database (fleet/replayer.py, fleet/replaystate.py): each
sees only part of every stream, and none asks a device for a row another one wrote. Real Mosquitto, real
SQLite and PostgreSQL, real daemons for the broker crash."""

from __future__ import annotations

import os
import signal
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import (
    Broker,
    DaemonProc,
    StartDaemon,
    base_config,
    free_port,
    make_tiny_model,
    make_video,
    wait_for,
    write_config,
)
from test_ingest import Device

from edged.fleet.ingest import Ingest, IngestOptions
from edged.fleet.ingestdb import open_database
from edged.fleet.report import build_report

pytestmark = pytest.mark.integration

Start = Callable[..., Ingest]


@pytest.fixture
def ingests(broker: Broker) -> Iterator[Start]:
    started: list[Ingest] = []

    def start(url: str, name: str, group: str, *, host_port: tuple[str, int] | None = None) -> Ingest:
        host, port = host_port or (broker.host, broker.port)
        opts = IngestOptions(host=host, port=port, client_id=name, group=group, replay_after_s=0.5,
                             session_expiry_s=300)  # fmt: skip
        ingest = Ingest(opts, open_database(url))
        ingest.start(timeout=60)
        started.append(ingest)
        return ingest

    yield start
    for ingest in started:
        ingest.stop()
        ingest.db.close()


def _report(url: str) -> dict[str, dict[str, Any]]:
    db = open_database(url)
    try:
        return {d["device"]: d for d in build_report(db)["devices"]}
    finally:
        db.close()


def _settled(group: list[Ingest], rows: int) -> bool:
    """Every row read by one of them, and every seq each did not see checked against the database."""
    snaps = [i.snapshot() for i in group]
    return sum(s["inserted"] for s in snaps) >= rows and all(s["replay"]["unchecked"] == 0 for s in snaps)


@pytest.mark.parametrize(("backend", "count"), [("sqlite", 2), ("postgresql", 2), ("postgresql", 3)])
def test_shared_ingests_ask_for_nothing_when_nothing_is_lost(  # noqa: PLR0917
    request: pytest.FixtureRequest, tmp_path: Path, broker: Broker, ingests: Start, backend: str, count: int
) -> None:
    """The issue's measurement: 2 ingests in one group used to ask for ~2,000 seqs they had between them and
    call them recovered. Now each checks what it did not see against the database: 0 requests, 0 recovered."""
    url = str(tmp_path / "r.db") if backend == "sqlite" else str(request.getfixturevalue("pg_url"))
    group = f"g{uuid.uuid4().hex[:8]}"
    group_of = [ingests(url, f"ing-{i}-{group}", group) for i in range(count)]
    devices = [f"d{i}-{os.getpid()}-{group}" for i in range(3)]
    sender = Device(broker, group)
    try:
        for round_ in range(3):  # interleaved, as a fleet sends
            for dev in devices:
                sender.send_results(dev, "cam0", range(1 + 100 * round_, 101 + 100 * round_))
    finally:
        sender.close()
    wait_for(lambda: _settled(group_of, 900), 60, "every row in, every unseen seq checked")
    snaps = [i.snapshot()["replay"] for i in group_of]
    assert all(s["results"] > 0 for s in (i.snapshot() for i in group_of))  # the broker split the load
    assert [s["requests"] for s in snaps] == [0] * count, snaps
    assert sum(s["checked"] for s in snaps) > 0  # they did see holes, and found the rows in the database
    report = _report(url)
    for dev in devices:
        assert report[dev]["recovered"] == 0
        assert report[dev]["unexplained"] == 0
        assert report[dev]["pipelines"][0]["results"] == 300


def test_a_real_loss_is_asked_for_once_by_one_of_the_shared_ingests(
    pg_url: str, broker: Broker, ingests: Start
) -> None:
    """Seqs no ingest has are claimed in the database before they are asked for: whichever ingest finds them
    first asks, the other sees the claim, and the device gets one request."""
    group = f"g{uuid.uuid4().hex[:8]}"
    a, b = ingests(pg_url, f"a-{group}", group), ingests(pg_url, f"b-{group}", group)
    dev = f"lossy-{group}"
    sender = Device(broker, group)
    try:
        sender.send_results(dev, "cam0", [*range(1, 100), *range(105, 301)])  # 100..104 never sent
    finally:
        sender.close()
    wait_for(lambda: _settled([a, b], 295), 60, "every row in, every unseen seq checked")
    wait_for(lambda: a.snapshot()["replay"]["requests"] + b.snapshot()["replay"]["requests"] >= 1, 30, "a request")
    snaps = [a.snapshot()["replay"], b.snapshot()["replay"]]
    assert sum(s["requests"] for s in snaps) == 1, snaps
    assert sum(s["asked"] for s in snaps) == 5
    with psycopg.connect(pg_url) as conn:
        asked = conn.execute("SELECT first, last, client FROM replay_ranges WHERE outcome = 'asked'").fetchall()
    assert [(f, last) for f, last, _ in asked] == [(100, 104)]


def _published(daemon: DaemonProc) -> int:
    status = daemon.status()
    return int(status["mqtt"]["published"]) if status else 0


@pytest.fixture
def own(tmp_path: Path) -> Iterator[Broker]:
    """A Mosquitto of this test's own, to kill -9 (what it acknowledged and queued is lost)."""
    broker = Broker("127.0.0.1", free_port(), tmp_path)
    broker.start()
    yield broker
    broker.stop()


@pytest.mark.timeout(300)
def test_a_broker_crash_loses_nothing_through_shared_ingests(
    tmp_path: Path, own: Broker, pg_url: str, ingests: Start, start_daemon: StartDaemon
) -> None:
    """Two real daemons, two shared ingests on PostgreSQL: the ingests away, the broker acknowledges what it
    queues for them and is killed with -9; back, they find the loss in the database, and each lost seq is asked
    for by one ingest only: every seq lands once, the report counts exactly those recovered, none lost."""
    group = f"g{uuid.uuid4().hex[:8]}"
    where = (own.host, own.port)
    first = [ingests(pg_url, f"{n}-{group}", group, host_port=where) for n in ("a", "b")]
    model, video = make_tiny_model(tmp_path / "tiny.onnx"), make_video(tmp_path / "v.mp4", 30)
    daemons, names = [], []
    for i in range(2):
        cfg: dict[str, Any] = base_config(tmp_path / f"d{i}", model, str(video), fps=30, loop=True,
                                          stop_at_end=False)  # fmt: skip
        cfg["mqtt"] |= {"enabled": True, "port": own.port}
        names.append(cfg["device_id"])
        daemons.append(start_daemon(write_config(tmp_path / f"d{i}.yaml", cfg)))
    wait_for(lambda: sum(i.snapshot()["inserted"] for i in first) >= 60, 90, "rows through both ingests")
    for ingest in first:
        ingest.stop()  # away: the broker queues for their sessions
    published = [_published(d) for d in daemons]
    wait_for(lambda: all(_published(d) >= p + 60 for d, p in zip(daemons, published, strict=True)), 60,
             "60 more acknowledged by the broker from each")  # fmt: skip
    assert own.proc is not None
    own.proc.kill()
    own.proc.wait()
    own.proc = None
    own.start()
    back = [ingests(pg_url, f"{n}-{group}", group, host_port=where) for n in ("a", "b")]

    def whole() -> bool:
        report = _report(pg_url)
        return all(n in report and report[n]["missing"] == 0 and report[n]["recovered"] >= 1 for n in names)

    wait_for(whole, 180, "every seq of both devices, recovered by replay")
    for d in daemons:
        d.stop(signal.SIGTERM)
    report = _report(pg_url)
    with psycopg.connect(pg_url) as conn:
        asked = conn.execute("SELECT device, first, last, client FROM replay_ranges WHERE outcome = 'asked'").fetchall()
    for name in names:
        assert report[name]["pipelines"][0]["first_seq"] == 1
        assert report[name]["unexplained"] == 0
        assert report[name]["gone"] == 0
        mine = sorted((f, last, c) for dev, f, last, c in asked if dev == name)
        seqs = [s for f, last, _ in mine for s in range(f, last + 1)]
        assert len(seqs) == len(set(seqs)), f"a seq asked for twice: {mine}"  # one ingest per loss
        assert report[name]["recovered"] == len(seqs)  # recovered: exactly what was asked for and came
    assert sum(i.snapshot()["replay"]["requests"] for i in back) >= 1


def test_two_ingests_starting_together_on_a_fresh_postgresql_both_start(pg_url: str) -> None:
    """CREATE TABLE IF NOT EXISTS is not safe against itself in PostgreSQL (one start in 8 crashed on
    pg_type_typname_nsp_index): the schema is created under an advisory lock, so every start succeeds."""
    errors: list[BaseException] = []
    opened: list[Any] = []
    barrier = threading.Barrier(8)

    def start() -> None:
        barrier.wait()
        try:
            opened.append(open_database(pg_url))
        except BaseException as exc:  # noqa: BLE001  (what the test counts)
            errors.append(exc)

    threads = [threading.Thread(target=start, name=f"start-{i}") for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for db in opened:
        db.close()
    assert errors == []
    assert len(opened) == 8
