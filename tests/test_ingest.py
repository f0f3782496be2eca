"""`edged ingest`: results land exactly once in a real SQLite file and a real PostgreSQL, through a real
Mosquitto, across the ingest's own crash, the database's restart and a split between two ingests."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from conftest import Broker, StartDaemon, base_config, make_video, wait_for, write_config
from hostile_bytes import CORPUS
from hostile_bytes import result as hostile_result
from paho.mqtt.enums import CallbackAPIVersion
from pgserver import PgServer

from edged.fleet.ingest import Ingest, IngestOptions
from edged.fleet.ingestdb import CorrectionRow, GapRow, IngestBatch, QuarantineRow, ResultRow, StatsRow, open_database
from edged.fleet.ingestparse import Identity, RefusedError, parse_clock, parse_results
from edged.fleet.quarantinedb import QUARANTINE_BURST, QuarantineGate
from edged.fleet.report import build_report

pytestmark = pytest.mark.integration


def result(device: str, pipeline: str, seq: int) -> dict[str, Any]:
    return {"v": 1, "device": device, "pipeline": pipeline, "seq": seq, "ts": 1764680000.0 + seq,
            "result": {"top": [{"index": seq % 10, "score": 0.5}]}}  # fmt: skip


class Device:
    """A stand-in for a device's publisher (QoS 1, waits for each PUBACK): the ingest is what is tested."""

    def __init__(self, broker: Broker, name: str) -> None:
        self.client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id=f"dev-{name}")
        self.client.max_inflight_messages_set(100)
        self.client.connect(broker.host, broker.port)
        self.client.loop_start()

    def send(self, topic: str, payload: Any) -> None:
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.client.publish(topic, body, qos=1).wait_for_publish(10)

    def send_results(self, device: str, pipeline: str, seqs: range | list[int]) -> None:
        infos = [
            self.client.publish(f"edged/{device}/{pipeline}/results", json.dumps(result(device, pipeline, s)), qos=1)
            for s in seqs
        ]
        for info in infos:
            info.wait_for_publish(30)

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


@pytest.fixture
def device(broker: Broker) -> Iterator[Device]:
    d = Device(broker, f"{os.getpid()}-{id(broker)}")
    yield d
    d.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "results.db")
    url: str = request.getfixturevalue("pg_url")
    return url


StartIngest = Callable[..., Ingest]


@pytest.fixture
def start_ingest(broker: Broker) -> Iterator[StartIngest]:
    started: list[Ingest] = []

    def start(db_url: str, *, client_id: str | None = None, **kw: Any) -> Ingest:
        client_id = client_id or f"ingest-{uuid.uuid4().hex[:8]}"  # a fresh session unless the test resumes one
        group = kw.pop("group", f"g{uuid.uuid4().hex[:8]}")
        kw.setdefault("session_expiry_s", 300)  # the shared test broker forgets them soon after
        opts = IngestOptions(host=broker.host, port=broker.port, client_id=client_id, group=group, **kw)
        ingest = Ingest(opts, open_database(db_url))
        ingest.start()
        started.append(ingest)
        return ingest

    yield start
    for ingest in started:
        ingest.stop()
        ingest.db.close()


def _count(url: str) -> int:
    db = open_database(url)
    try:
        return db.count()
    finally:
        db.close()


def test_every_result_lands_once_and_duplicates_are_absorbed(
    db_url: str, device: Device, start_ingest: StartIngest
) -> None:
    ingest = start_ingest(db_url)
    dev = f"d{os.getpid()}"
    device.send_results(dev, "cam0", range(1, 201))
    device.send_results(dev, "cam1", range(1, 101))
    device.send_results(dev, "cam0", range(150, 181))  # redelivered after a reconnect: the same seqs again
    batch = [result(dev, "cam1", s) for s in range(101, 111)]  # mqtt.batch > 1: one message, a JSON array
    device.send(f"edged/{dev}/cam1/results", batch)
    wait_for(lambda: ingest.snapshot()["results"] >= 341, 30, "every result read")

    snap = ingest.snapshot()
    assert (snap["inserted"], snap["duplicates"]) == (310, 31)
    report = build_report(ingest.db)
    streams = {p["pipeline"]: p for d in report["devices"] if d["device"] == dev for p in d["pipelines"]}
    assert streams["cam0"]["results"] == 200
    assert streams["cam1"]["last_seq"] == 110
    assert streams["cam1"]["contiguous_to"] == 110
    assert report["unexplained"] == 0


def test_a_malformed_message_is_acknowledged_counted_and_skipped(
    tmp_path: Path, device: Device, start_ingest: StartIngest
) -> None:
    url = str(tmp_path / "r.db")
    ingest = start_ingest(url, client_id=f"ingest-m{os.getpid()}", group="gm")
    dev = f"m{os.getpid()}"
    device.send(f"edged/{dev}/cam0/results", b"not json")
    device.send(f"edged/{dev}/cam0/results", {"device": dev, "pipeline": "cam0", "seq": "seven", "ts": 1})
    device.send_results(dev, "cam0", [1])
    wait_for(lambda: ingest.snapshot()["inserted"] == 1, 30, "the good result")
    assert ingest.snapshot()["malformed"] == 2
    ingest.stop()

    # aftermath: the bad messages were acknowledged, so the same session does not get them again
    again = start_ingest(url, client_id=f"ingest-m{os.getpid()}", group="gm")
    device.send_results(dev, "cam0", [2])
    wait_for(lambda: again.snapshot()["inserted"] == 1, 30, "the next result")
    assert again.snapshot()["malformed"] == 0
    assert _count(url) == 2


def test_ingest_killed_mid_stream_loses_nothing(broker: Broker, tmp_path: Path, device: Device) -> None:
    url = str(tmp_path / "r.db")
    dev = f"k{os.getpid()}"
    cmd = [sys.executable, "-m", "edged", "ingest", "--db", url, "--host", broker.host, "--port", str(broker.port),
           "--client-id", f"ingest-kill-{os.getpid()}", "--group", "gk", "--batch", "50",
           "--session-expiry", "300"]  # fmt: skip

    def start(n: int) -> subprocess.Popen[bytes]:
        log = tmp_path / f"ingest{n}.log"
        with log.open("wb") as err:
            proc = subprocess.Popen(cmd, stderr=err)
        wait_for(lambda: b"writing to" in log.read_bytes(), 30, "the ingest connected and subscribed")
        return proc

    first = start(1)
    sender = threading.Thread(target=device.send_results, args=(dev, "cam0", range(1, 3001)))
    sender.start()
    wait_for(lambda: Path(url).exists() and _count(url) >= 300, 60, "some rows written")
    first.send_signal(signal.SIGKILL)  # mid-batch: received, maybe written, not all acknowledged
    first.wait(10)
    sender.join(120)

    second = start(2)  # the same client id: the broker kept the session and what arrived meanwhile
    try:
        wait_for(lambda: _count(url) == 3000, 90, "all 3000 results")
        db = open_database(url)
        report = build_report(db)
        db.close()
        assert report["unexplained"] == 0
        assert report["devices"][0]["pipelines"][0]["contiguous_to"] == 3000
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(30) == 0


def test_postgresql_restart_costs_no_result(
    pg_server: PgServer, pg_url: str, device: Device, start_ingest: StartIngest
) -> None:
    ingest = start_ingest(pg_url)
    dev = f"p{os.getpid()}"
    device.send_results(dev, "cam0", range(1, 101))
    wait_for(lambda: ingest.snapshot()["inserted"] == 100, 30, "the first 100")
    pg_server.stop()
    try:
        device.send_results(dev, "cam0", range(101, 201))  # the broker takes them; the ingest cannot write
        wait_for(lambda: ingest.snapshot()["db_errors"] > 0, 30, "a failed write")
        assert ingest.snapshot()["inserted"] == 100
    finally:
        pg_server.start()
    wait_for(lambda: ingest.snapshot()["inserted"] == 200, 60, "the batch written after the restart")
    device.send_results(dev, "cam0", range(201, 251))  # and the next ones too
    wait_for(lambda: _count(pg_url) == 250, 30, "all 250")
    assert build_report(ingest.db)["devices"][0]["pipelines"][0]["contiguous_to"] == 250


def test_two_ingests_in_one_group_split_the_load(tmp_path: Path, device: Device, start_ingest: StartIngest) -> None:
    url = str(tmp_path / "r.db")
    group = f"split{os.getpid()}"
    a = start_ingest(url, client_id="ingest-a", group=group)
    b = start_ingest(url, client_id="ingest-b", group=group)
    dev = f"s{os.getpid()}"
    device.send_results(dev, "cam0", range(1, 401))
    wait_for(lambda: a.snapshot()["results"] + b.snapshot()["results"] >= 400, 30, "400 results read")
    assert _count(url) == 400
    assert a.snapshot()["results"] > 0
    assert b.snapshot()["results"] > 0


def test_report_says_which_device_lost_what_and_why(tmp_path: Path) -> None:
    url = str(tmp_path / "r.db")
    db = open_database(url)
    rows = [ResultRow("a", "cam0", s, float(s), "{}") for s in [*range(1, 11), *range(15, 21)]]
    rows += [ResultRow("b", "cam0", s, float(s), "{}") for s in [1, 2, 3, 4, 5, 8]]
    stats = {"v": 1, "device": "a", "ts": 5.0, "spool": {"dropped_by_reason": {"expired": 4}, "dead_letters": 0}}
    db.write(IngestBatch(rows, [StatsRow("a", 5.0, json.dumps(stats))]))
    db.close()

    out = subprocess.run(
        [sys.executable, "-m", "edged", "ingest", "--report", "--json", "--db", url],
        check=False, capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 1, out.stderr  # b lost 2 without a reason
    report = json.loads(out.stdout)
    a, b = report["devices"]
    assert (a["missing"], a["unexplained"], a["pipelines"][0]["gaps"]) == (4, 0, [[11, 14]])
    assert a["pipelines"][0]["contiguous_to"] == 10
    assert (b["missing"], b["unexplained"], b["pipelines"][0]["gaps"]) == (2, 2, [[6, 7]])
    wide = {**os.environ, "COLUMNS": "200"}
    cmd = [sys.executable, "-m", "edged", "ingest", "--report", "--db", url]
    text = subprocess.run(cmd, check=False, capture_output=True, text=True, env=wide).stdout
    assert "2 LOST unexplained; no stats message from the device" in text
    assert "explained; device says: 4 expired" in text


def test_the_report_says_no_rows_and_where_rows_start_plainly(tmp_path: Path) -> None:
    """A device known only from its stats is not "complete"; one whose rows start at seq 562 is complete only from
    there, and the text says so (not only the JSON's before_first)."""
    url = str(tmp_path / "r.db")
    db = open_database(url)
    rows = [ResultRow("late", "cam0", s, float(s), "{}") for s in range(562, 676)]
    stats = [StatsRow(d, 5.0, json.dumps({"device": d, "spool": {}})) for d in ("late", "quiet")]
    db.write(IngestBatch(rows, stats))
    db.close()
    cmd = [sys.executable, "-m", "edged", "ingest", "--report", "--db", url]
    text = subprocess.run(cmd, check=False, capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"}).stdout
    assert "quiet: no rows (seen only in its stats or quarantined messages)" in text
    assert "late: complete from where its rows start (cam0 at seq 562: earlier seqs never arrived here)" in text
    assert "  cam0  results 114  seq 562..675  missing 0  started at seq 562" in text


def test_the_report_fits_80_columns_with_whole_device_names(tmp_path: Path) -> None:
    url = str(tmp_path / "r.db")
    db = open_database(url)
    device, pipeline = "newcomer-warehouse-north-dock-pi-0042", "front-door-camera"
    rows = [ResultRow(device, pipeline, s, float(s), "{}") for s in range(1, 200, 3)]  # many gaps
    db.write(IngestBatch(rows))
    db.close()
    cmd = [sys.executable, "-m", "edged", "ingest", "--report", "--db", url]
    text = subprocess.run(cmd, check=False, capture_output=True, text=True, env={**os.environ, "COLUMNS": "80"}).stdout
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80, text
    assert any(line.startswith(f"{device}: 132 LOST unexplained") for line in lines), text  # the name whole
    assert any(line.startswith(f"  {pipeline}  results 67  seq 1..199  missing 132") for line in lines), text


def test_a_real_daemon_lands_every_result(
    broker: Broker, tmp_path: Path, tiny_model: Path, start_daemon: StartDaemon, start_ingest: StartIngest
) -> None:
    url = str(tmp_path / "r.db")
    ingest = start_ingest(url)
    video = make_video(tmp_path / "v.mp4", 40)
    cfg = base_config(tmp_path, tiny_model, str(video), broker=broker)
    cfg["mqtt"]["stats_interval_s"] = 0.2
    daemon = start_daemon(write_config(tmp_path / "edged.yaml", cfg))
    wait_for(lambda: _count(url) == 40, 60, "the video's 40 results")
    wait_for(lambda: cfg["device_id"] in ingest.db.device_stats(), 30, "the device's stats message")
    daemon.stop()
    report = build_report(ingest.db)
    entry = next(d for d in report["devices"] if d["device"] == cfg["device_id"])
    assert (entry["missing"], entry["unexplained"], entry["pipelines"][0]["last_seq"]) == (0, 0, 40)
    assert not ingest.writer.death


def test_report_labels_missing_seqs_a_device_declared_uncertain(tmp_path: Path) -> None:
    url = str(tmp_path / "r.db")
    db = open_database(url)
    rows = [ResultRow("a", "cam0", s, float(s), "{}") for s in [*range(1, 11), *range(31, 41)]]
    gap = GapRow("a", "cam0", 8, 30, json.dumps({"gap": {"first": 8, "last": 30}}))
    db.write(IngestBatch(rows, [StatsRow("a", 5.0, json.dumps({"device": "a", "spool": {}}))], [gap, gap]))  # once
    db.close()
    report = build_report(open_database(url))
    (a,) = report["devices"]
    # 11..30 are missing and declared: uncertain (sent before the stop, lost, or never used), not unexplained
    assert (a["missing"], a["uncertain"], a["unexplained"]) == (20, 20, 0)
    assert a["pipelines"][0]["declared_gaps"] == [[8, 30]]


def test_a_daemon_killed_mid_run_declares_its_gap_and_the_report_explains_it(
    broker: Broker, tmp_path: Path, tiny_model: Path, start_daemon: StartDaemon, start_ingest: StartIngest
) -> None:
    url = str(tmp_path / "r.db")
    ingest = start_ingest(url)
    video = make_video(tmp_path / "v.mp4", 30)
    cfg = base_config(tmp_path, tiny_model, str(video), broker=broker, fps=30, loop=True, stop_at_end=False)
    cfg["mqtt"]["stats_interval_s"] = 0.2
    config = write_config(tmp_path / "edged.yaml", cfg)
    daemon = start_daemon(config)
    wait_for(lambda: _count(url) >= 40, 60, "results before the kill")
    daemon.stop(signal.SIGKILL)
    again = start_daemon(config)
    wait_for(ingest.db.declared, 60, "the gap announced after the restart")
    top = ingest.db.declared()[0].last
    wait_for(lambda: max(s.last for s in ingest.db.streams()) > top + 10, 60, "results after the gap")
    wait_for(lambda: "uncertain" in json.dumps(ingest.db.device_stats().get(cfg["device_id"])), 30, "stats")
    again.stop()
    entry = next(d for d in build_report(ingest.db)["devices"] if d["device"] == cfg["device_id"])
    assert entry["missing"] > 0  # the skipped lease beyond the last seq handed out
    assert (entry["uncertain"], entry["unexplained"]) == (entry["missing"], 0)


def test_poison_messages_are_quarantined_acknowledged_and_ingest_goes_on(
    db_url: str, device: Device, start_ingest: StartIngest
) -> None:
    session = {"client_id": f"ingest-q{uuid.uuid4().hex[:6]}", "group": f"gq{uuid.uuid4().hex[:6]}"}
    ingest = start_ingest(db_url, **session)
    dev = f"q{os.getpid()}"
    topic = f"edged/{dev}/cam0/results"
    poison = [
        *CORPUS.values(),  # everything that broke a part once
        b'{"v":1,"device":"' + dev.encode() + b'","pipeline":"cam0","seq":1,"ts":' + b"9" * 400 + b"}",
        b'{"v":1,"device":"' + dev.encode() + b'","pipeline":"cam0","seq":' + b"1" * 30 + b',"ts":1}',
        hostile_result(dev, "cam0", 1, result={"label": "a\u0000b"}),  # PostgreSQL's jsonb refuses a NUL
        b"[" * 60_000,
    ]
    for payload in poison:
        device.send(topic, payload)
    device.send_results(dev, "cam0", [1, 2])
    wait_for(lambda: ingest.snapshot()["inserted"] == 2, 60, "the good results after the poison")
    wait_for(lambda: ingest.snapshot()["malformed"] == len(poison), 30, "every poison message quarantined")
    assert ingest.snapshot()["writer_alive"] is True
    assert {"too_deep", "out_of_range", "nul", "identity_mismatch"} <= set(ingest.snapshot()["quarantined"])
    ingest.stop()

    # aftermath: acknowledged, so the same session does not get the poison again; new results land
    again = start_ingest(db_url, **session)
    device.send_results(dev, "cam0", [3])
    wait_for(lambda: again.snapshot()["inserted"] == 1, 30, "the next result")
    assert again.snapshot()["malformed"] == 0, json.dumps([ingest.snapshot(), again.snapshot()])
    report = build_report(again.db)
    entry = next(d for d in report["devices"] if d["device"] == dev)
    assert sum(entry["quarantined"].values()) == len(poison)  # --report counts them for the device
    assert entry["pipelines"][0]["contiguous_to"] == 3


def test_a_result_on_another_device_s_topic_is_quarantined_and_the_genuine_one_lands(
    db_url: str, device: Device, start_ingest: StartIngest
) -> None:
    ingest = start_ingest(db_url)
    victim, attacker = f"v{os.getpid()}", f"a{os.getpid()}"
    forged = hostile_result(victim, "cam0", 5, result={"top": [{"label": "intruder", "score": 1.0}]})
    device.send(f"edged/{attacker}/x/results", forged)  # the attacker may publish only under its own topics
    device.send_results(victim, "cam0", range(1, 6))
    wait_for(lambda: ingest.snapshot()["inserted"] == 5, 30, "the victim's five results")
    assert ingest.snapshot()["quarantined"] == {"identity_mismatch": 1}
    report = build_report(ingest.db)
    devices = {d["device"]: d for d in report["devices"]}
    assert devices[victim]["pipelines"][0]["results"] == 5
    assert devices[attacker]["quarantined"] == {"identity_mismatch": 1}
    assert devices[attacker]["pipelines"] == []  # no row in its name or the victim's


def test_a_message_the_database_refuses_alone_is_quarantined_and_its_batch_lands(
    tmp_path: Path, device: Device, start_ingest: StartIngest
) -> None:
    url = str(tmp_path / "r.db")
    db = open_database(url)  # the schema, then a rule of the operator's that refuses one pipeline's rows
    db.close()
    with sqlite3.connect(url) as conn:
        conn.execute("CREATE TRIGGER refuse BEFORE INSERT ON results WHEN NEW.pipeline = 'banned' "
                     "BEGIN SELECT RAISE(ABORT, 'banned pipeline'); END")  # fmt: skip
    ingest = start_ingest(url, batch=100, flush_s=1.0)  # one batch: the refused message and the good ones
    dev = f"r{os.getpid()}"
    device.send_results(dev, "cam0", [1, 2])
    device.send_results(dev, "banned", [1])
    device.send_results(dev, "cam0", [3])
    wait_for(lambda: ingest.snapshot()["inserted"] == 3, 30, "the good rows of the batch")
    wait_for(lambda: ingest.snapshot()["quarantined"] == {"db_refused": 1}, 30, "the refused one quarantined")
    device.send_results(dev, "cam0", [4])  # aftermath: not retried forever, the next batch lands
    wait_for(lambda: ingest.snapshot()["inserted"] == 4, 30, "the next result")
    assert ingest.snapshot()["db_errors"] == 0


def _flagged(device: str, seq: int, ts: float, boot: str, mono: float) -> ResultRow:
    body = json.dumps({"device": device, "pipeline": "cam0", "seq": seq, "ts": ts,
                       "clock": {"synced": False, "boot": boot, "mono": mono}})  # fmt: skip
    (row,) = parse_results(body.encode(), Identity(device, "cam0"))
    return row


def test_results_stamped_by_an_unsynchronized_clock_are_corrected_whichever_arrives_first(db_url: str) -> None:
    """A device booted at 1970 (core/clock.py): its flagged rows take the time of the first correction of their
    boot at or after their capture, whether the correction comes before or after them; the device's own stamp
    stays beside it; another boot's rows and a synchronized device's rows are left alone."""
    db = open_database(db_url)
    try:
        before = [_flagged("a", s, 86_400.0 + s, "boot-1", 10.0 + s) for s in range(1, 4)]  # mono 11..13
        other_boot = _flagged("a", 4, 86_500.0, "boot-0", 5.0)
        synced = ResultRow("b", "cam0", 1, 1_764_680_000.0, "{}")
        db.write(IngestBatch([*before, other_boot, synced]))
        assert db.clocks() == {"a": {"unsynced": 4, "corrected": 0}}

        # the clock synchronized at mono 20 (offset 1_764_680_000) and was stepped back later (a second stretch)
        corrections = [CorrectionRow("a", "boot-1", 20.0, 1_764_680_000.0), CorrectionRow("a", "boot-1", 90.0, 1e9)]
        db.write(IngestBatch(corrections=corrections))
        late = _flagged("a", 5, 86_600.0, "boot-1", 50.0)  # sent before the correction, arrives after it
        db.write(IngestBatch([late], corrections=corrections))  # the clock message again (retained): idempotent
        rows = _rows(db_url, "a")
        assert rows[1] == (1_764_680_011.0, 86_401.0, "corrected")
        assert rows[3] == (1_764_680_013.0, 86_403.0, "corrected")
        assert rows[4] == (86_500.0, None, "unsynced")  # boot-0 never synchronized: as stamped, flagged
        assert rows[5] == (1e9 + 50.0, 86_600.0, "corrected")  # after the first correction: the second one's
        assert db.clocks() == {"a": {"unsynced": 1, "corrected": 4}}
        assert build_report(db)["devices"][0]["clock"] == {"unsynced": 1, "corrected": 4}
    finally:
        db.close()


def test_a_forged_clock_correction_is_undone_by_the_device_s_own_and_an_implausible_one_refused(
    db_url: str,
) -> None:
    """A client without the ACL published a clock message under the device's topic: its rows moved to its time,
    and the device's genuine message later fixed only new rows (the first correction won). A clock message is
    the device's whole list: the next one replaces the forged one and corrects every row of the boot again from
    the device's own stamp. A correction to 1979 is refused at the door, and an empty retained message (the
    device's cleared) is ignored."""
    db = open_database(db_url)
    now = 1_800_000_000.0
    try:
        db.write(IngestBatch([_flagged("a", s, 86_400.0 + s, "boot-1", 10.0 + s) for s in range(1, 4)]))
        forged = CorrectionRow("a", "boot-1", 30.0, 1_650_000_000.0)  # plausible (2022), and false
        db.write(IngestBatch(corrections=[forged]))
        assert _rows(db_url, "a")[1] == (1_650_000_011.0, 86_401.0, "corrected")
        genuine = CorrectionRow("a", "boot-1", 20.0, 1_764_680_000.0)
        db.write(IngestBatch(corrections=[genuine]))  # the device's own message: its whole list for boot-1
        rows = _rows(db_url, "a")
        assert rows[1] == (1_764_680_011.0, 86_401.0, "corrected")  # from the device's stamp, not the forged ts
        assert rows[3] == (1_764_680_013.0, 86_403.0, "corrected")
    finally:
        db.close()
    sender = Identity("a", None)
    to_1979 = json.dumps({"device": "a", "corrections": [{"boot": "boot-1", "mono": 20.0, "offset": 3e8}]})
    with pytest.raises(RefusedError, match="before 2020"):
        parse_clock(to_1979.encode(), sender, now)
    assert parse_clock(b"", sender, now) == []


def _rows(url: str, device: str) -> dict[int, tuple[float, float | None, str | None]]:
    db = open_database(url)
    try:
        conn: Any = db.conn  # type: ignore[attr-defined]
        sql = f"SELECT seq, ts, ts_original, clock FROM results WHERE device = '{device}' ORDER BY seq"  # noqa: S608
        return {int(r[0]): (float(r[1]), r[2], r[3]) for r in conn.execute(sql)}
    finally:
        db.close()


def test_a_database_from_before_the_clock_columns_gets_them_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE results (device TEXT NOT NULL, pipeline TEXT NOT NULL, seq BIGINT NOT NULL, "
                 "ts DOUBLE PRECISION NOT NULL, body TEXT NOT NULL, PRIMARY KEY (device, pipeline, seq))")  # fmt: skip
    conn.execute("INSERT INTO results VALUES ('a', 'cam0', 1, 5.0, '{}')")
    conn.commit()
    conn.close()
    db = open_database(str(path))
    try:
        db.write(
            IngestBatch([_flagged("a", 2, 6.0, "boot", 1.0)], corrections=[CorrectionRow("a", "boot", 2.0, 100.0)])
        )
        assert db.count() == 2
    finally:
        db.close()
    assert _rows(str(path), "a") == {1: (5.0, None, None), 2: (101.0, 6.0, "corrected")}


def test_a_broker_that_refuses_only_the_clock_topic_still_gets_an_ingest_that_says_what_it_misses(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An operator's broker ACL written before the clock topic (docs/security.md) on a broker that refuses what
    it would not deliver: the SUBACK refuses that one filter. The ingest goes on with the rest, and says which
    topic it lacks and what that costs; a refused results filter still stops it."""
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.reasoncodes import ReasonCode

    ingest = Ingest(IngestOptions(replay_topic=""), open_database(str(tmp_path / "r.db")))
    granted, refused = ReasonCode(PacketTypes.SUBACK, "Granted QoS 1"), ReasonCode(PacketTypes.SUBACK, "Not authorized")
    try:
        with caplog.at_level("WARNING", logger="edged.fleet.ingest"):
            ingest.link._on_subscribe(ingest.link.client, None, 1, [granted] * 4 + [refused], None)  # noqa: SLF001
        assert ingest.wait_connected(0)
        assert any("refused edged/+/clock" in r.getMessage() and "stay as stamped" in r.getMessage()
                   for r in caplog.records)  # fmt: skip
        ingest.link.connected.clear()
        ingest.link._on_subscribe(ingest.link.client, None, 2, [refused] + [granted] * 4, None)  # noqa: SLF001
        assert not ingest.wait_connected(0)
    finally:
        ingest.db.close()


def test_the_quarantine_is_bounded_per_device_and_in_bytes_and_says_what_it_dropped(db_url: str) -> None:
    """60 kB of junk for 10 s grew the database to 2.4 GB. Now each device keeps its newest refused messages
    up to the row bound, all of them up to the byte bound, and the report counts what went."""
    db = open_database(db_url)
    try:
        for i in range(6):  # six batches of 10 refused messages from one device, 1 kB kept each
            rows = [QuarantineRow(float(i * 10 + j), "edged/junk/x/results", "junk", "not_json", "x", 1024,
                                  b"j" * 1024) for j in range(10)]  # fmt: skip
            db.write(IngestBatch(quarantine=rows, quarantine_rows=25, quarantine_bytes=10**9))
        assert db.quarantined()["junk"] == {"not_json": 25, "dropped_oldest": 35}
        other = [QuarantineRow(100.0 + j, "edged/b/x/results", "b", "not_json", "x", 1024, b"b" * 1024)
                 for j in range(10)]  # fmt: skip
        db.write(IngestBatch(quarantine=other, quarantine_rows=25, quarantine_bytes=20 * 1024))
        kept = db.quarantined()
        assert kept["junk"]["not_json"] + kept["b"]["not_json"] == 20  # 20 kB in all: the oldest (junk's) went
        assert kept["b"]["not_json"] == 10
        assert kept["junk"]["dropped_oldest"] == 35 + 15
    finally:
        db.close()


def test_a_device_s_refused_messages_past_its_budget_are_counted_not_written() -> None:
    gate = QuarantineGate()
    written = sum(gate.admit("junk") for _ in range(10_000))
    assert written <= QUARANTINE_BURST + 1
    assert gate.admit("another") is True  # one device's flood costs another nothing
