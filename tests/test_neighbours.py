"""Neighbours on the broker (uplink/inbound.py): each incoming message reaches only the handler of the
subscription it matches, within a budget per topic, so a flood on one topic leaves results and signed commands
flowing. Real daemons, a real Mosquitto, real flooding clients."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from conftest import Rig, Subscribe, ask, control_daemon, wait_for
from paho.mqtt.enums import CallbackAPIVersion

from edged.fleet.ingest import Ingest, IngestOptions
from edged.fleet.ingestdb import open_database
from edged.fleet.report import build_report

pytestmark = pytest.mark.integration


def _client(rig: Rig, name: str) -> paho.Client:
    client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id=name)
    client.max_queued_messages_set(0)
    client.connect(rig.broker.host, rig.broker.port)
    client.loop_start()
    return client


def _answers(sub: Any, topic: str) -> list[dict[str, Any]]:
    return [json.loads(p) for p, _ in sub.payloads(topic)]


def test_a_replay_request_is_not_a_command_and_a_command_is_not_a_replay_request(
    rig: Rig, subscribe: Subscribe
) -> None:
    """Every incoming message used to go to every handler: an ingest's replay request was counted as an unsigned
    command (with an event saying so, and a slot in the command queue), and a signed command got a replay
    `refused: malformed` answer. Now each goes only to the subscription it matches."""
    daemon, cfg, _ = control_daemon(rig)
    dev = cfg["device_id"]
    sub = subscribe(rig.broker, f"edged/{dev}/#")
    wait_for(lambda: len(sub.results()) >= 10, 60, "10 results")
    asker = _client(rig, f"ingest-{dev}")
    try:
        request = {"v": 1, "id": "r1", "pipeline": "cam0", "ranges": [[1, 3]]}
        asker.publish(f"edged/{dev}/replay/request", json.dumps(request), qos=1).wait_for_publish(10)
        wait_for(lambda: _answers(sub, f"edged/{dev}/replay/answer"), 30, "the replay answer")
    finally:
        asker.loop_stop()
        asker.disconnect()
    assert ask(rig.fleet, "status", dev)[dev]["ok"] is True
    status = daemon.status() or {}
    assert status["control"]["refused"] == {}  # the replay request was no command
    assert status["mqtt"]["replay"]["refused"] == 0  # and the command no replay request
    assert [a["id"] for a in _answers(sub, f"edged/{dev}/replay/answer")] == ["r1"]
    events = [json.loads(p) for p, _ in sub.payloads(f"edged/{dev}/events")]
    assert not [e for e in events if e.get("ok") is False], events


def _flood(client: paho.Client, topic: str, count: int, stop: threading.Event) -> None:
    for _ in range(count):
        if stop.is_set():
            return
        client.publish(topic, b"x", qos=0)


def test_a_flood_on_the_replay_topic_leaves_results_and_signed_commands_flowing(rig: Rig, subscribe: Subscribe) -> None:
    """The issue's attack, on this machine's scale: one QoS 0 client floods `replay/request` with 1-byte
    messages. Before, the device delivered no result and answered no signed command while it lasted. Now the
    excess is dropped before it is read: results keep coming, a signed status is answered during the flood,
    status names the flood, and a genuine request afterwards is answered."""
    daemon, cfg, _ = control_daemon(rig)
    dev = cfg["device_id"]
    sub = subscribe(rig.broker, f"edged/{dev}/#")
    wait_for(lambda: len(sub.results()) >= 10, 60, "10 results")
    flooder = _client(rig, f"flooder-{dev}")
    stop = threading.Event()
    flood = threading.Thread(target=_flood, args=(flooder, f"edged/{dev}/replay/request", 200_000, stop),
                             name="flooder")  # fmt: skip
    try:
        flood.start()
        wait_for(lambda: (daemon.status() or {}).get("mqtt", {}).get("inbound", {}).get("subscriptions", {})
                 .get(f"edged/{dev}/replay/request", {}).get("dropped", 0) > 1000, 60, "the flood dropped")  # fmt: skip
        top = max(m["seq"] for m in sub.results())
        assert ask(rig.fleet, "status", dev, timeout=30)[dev]["ok"] is True  # answered while it floods
        wait_for(lambda: max(m["seq"] for m in sub.results()) >= top + 20, 30, "20 more results during the flood")
        reasons = (daemon.status() or {}).get("reasons", [])
        assert any("dropped in the last 60 s: a flood" in r and "replay/request" in r for r in reasons), reasons
    finally:
        stop.set()
        flood.join(60)
        flooder.loop_stop()
        flooder.disconnect()
    asker = _client(rig, f"ingest-{dev}")
    try:
        request = {"v": 1, "id": "after", "pipeline": "cam0", "ranges": [[1, 2]]}
        polls = [0]

        def answered() -> bool:  # the bucket refills within seconds: a genuine request is answered again
            if polls[0] % 20 == 0:  # one request a second (wait_for polls every 50 ms)
                asker.publish(f"edged/{dev}/replay/request", json.dumps(request), qos=1).wait_for_publish(10)
            polls[0] += 1
            return any(a.get("id") == "after" for a in _answers(sub, f"edged/{dev}/replay/answer"))

        wait_for(answered, 30, "a genuine request answered after the flood")
    finally:
        asker.loop_stop()
        asker.disconnect()
    status = daemon.status() or {}
    assert status["mqtt"]["connected"] is True
    assert status["control"]["refused"] == {}


def test_one_forged_seq_near_2_63_does_not_poison_the_ingest_s_loss_detection(rig: Rig, tmp_path: Path) -> None:
    """One result at seq 2^63-1 on a device's topic used to make the ingest ask 3 x 5,000 bogus seqs, report
    9.2e18 lost for good, and never ask for a later real loss on that stream. A seq more than a million past
    what the device's own stats message says it numbered is quarantined (`implausible_seq`): the report stays
    true, and the stream's top is the device's."""
    _, cfg, _ = control_daemon(rig)
    dev = cfg["device_id"]
    url = str(tmp_path / "r.db")
    opts = IngestOptions(host=rig.broker.host, port=rig.broker.port, client_id=f"ingest-{dev}", group="",
                         replay_after_s=0.5, session_expiry_s=60)  # fmt: skip
    ingest = Ingest(opts, open_database(url))
    ingest.start()
    forger = _client(rig, f"forger-{dev}")
    try:
        wait_for(lambda: ingest.snapshot()["stats"] >= 1 and ingest.snapshot()["inserted"] >= 10, 60,
                 "rows and the device's stats message")  # fmt: skip
        forged = {"v": 1, "device": dev, "pipeline": "cam0", "seq": 2**63 - 1, "ts": 1_764_680_000.0,
                  "result": {"top": []}}  # fmt: skip
        forger.publish(f"edged/{dev}/cam0/results", json.dumps(forged), qos=1).wait_for_publish(10)
        wait_for(lambda: ingest.snapshot()["quarantined"].get("implausible_seq") == 1, 30, "the forged seq refused")
        top = ingest.snapshot()["inserted"]
        wait_for(lambda: ingest.snapshot()["inserted"] >= top + 20, 30, "20 more genuine rows")
        assert ingest.snapshot()["replay"]["asked"] == 0
    finally:
        forger.loop_stop()
        forger.disconnect()
        ingest.stop()
        ingest.db.close()
    db = open_database(url)
    try:
        entry = next(d for d in build_report(db)["devices"] if d["device"] == dev)
    finally:
        db.close()
    assert entry["unexplained"] == 0
    assert entry["pipelines"][0]["last_seq"] < 10_000
    assert entry["quarantined"] == {"implausible_seq": 1}
