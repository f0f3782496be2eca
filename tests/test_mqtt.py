"""Publisher against a real Mosquitto broker: PUBACK-only deletion, broker absent then present, refusals."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from conftest import Broker, wait_for

from edged.config import MqttConfig
from edged.mqtt import Publisher, topic_for
from edged.spool import Spool
from edged.stats import MqttStats


def fill(spool: Spool, device: str, n: int, pipeline: str = "cam0") -> None:
    topic = topic_for("edged/{device_id}/{pipeline}/results", device, pipeline)
    for _ in range(n):
        seq = spool.next_seq(pipeline)
        body = json.dumps({"v": 1, "device": device, "pipeline": pipeline, "seq": seq}).encode()
        spool.append(pipeline, seq, time.time(), topic, body)
    assert spool.flush()


def make(tmp_path: Path, broker: Broker, **kw: object) -> tuple[Spool, Publisher, MqttStats, str]:
    device = f"pub-{tmp_path.name[-20:].replace('_', '-')}"
    spool = Spool(tmp_path / "s.db", batch_ms=10)
    spool.start()
    cfg = MqttConfig.model_validate(
        {"host": broker.host, "port": broker.port, "reconnect_min_s": 0.05, "reconnect_max_s": 0.2, **kw}
    )
    stats = MqttStats()
    return spool, Publisher(cfg, device, spool, stats), stats, device


@pytest.mark.parametrize(("protocol", "qos"), [("5", 1), ("3.1.1", 1), ("5", 0)])
def test_every_row_is_delivered_in_seq_order_and_deleted_after_puback(
    tmp_path: Path, broker: Broker, subscribe, protocol: str, qos: int
) -> None:
    # with QoS 0 there is no PUBACK: a row leaves the spool once written to the socket
    spool, pub, stats, device = make(tmp_path, broker, protocol=protocol, qos=qos, max_inflight=8)
    sub = subscribe(broker, f"edged/{device}/#")
    fill(spool, device, 200)
    pub.start()
    wait_for(lambda: len(sub.results()) >= 200 and spool.depth == 0, 30, "200 results delivered")
    assert [m["seq"] for m in sub.results()] == list(range(1, 201))
    assert stats.published == 200
    assert sub.payloads(f"edged/{device}/status")[0] == (b"online", False)
    pub.request_stop(2.0)
    pub.join(10)
    assert not pub.is_alive()
    wait_for(lambda: (b"offline", False) in sub.payloads(f"edged/{device}/status"), 5, "offline on stop")
    spool.flush()
    assert spool.stats()["depth"] == 0
    spool.close()


def test_broker_absent_at_start_then_started_everything_arrives(tmp_path: Path, own_broker: Broker, subscribe) -> None:
    spool, pub, stats, device = make(tmp_path, own_broker)
    # a subscriber session that the broker keeps (persisted) while it is down, so nothing it gets
    # before the subscriber reconnects is missed
    own_broker.persistent = True
    own_broker.start()
    sub = subscribe(own_broker, f"edged/{device}/#", persistent=True)
    own_broker.stop()
    fill(spool, device, 50)
    pub.start()
    wait_for(lambda: stats.last_error and "cannot connect" in stats.last_error, 10, "a failed connect")
    assert spool.depth == 50  # nothing lost, nothing deleted
    own_broker.start()
    fill(spool, device, 50)  # and more while it connects
    wait_for(lambda: spool.depth == 0, 30, "the spool to drain")
    wait_for(lambda: len({m["seq"] for m in sub.results()}) == 100, 10, "all 100 at the subscriber")
    assert stats.connected
    pub.request_stop(1.0)
    pub.join(10)
    spool.close()


def test_broker_restart_resends_unacknowledged_rows(tmp_path: Path, own_broker: Broker, subscribe) -> None:
    own_broker.persistent = True
    own_broker.start()
    spool, pub, stats, device = make(tmp_path, own_broker)
    sub = subscribe(own_broker, f"edged/{device}/#", persistent=True)
    pub.start()
    wait_for(lambda: stats.connected, 10, "connected")
    fill(spool, device, 20)
    wait_for(lambda: spool.depth == 0, 10, "first batch acknowledged")
    own_broker.stop()
    wait_for(lambda: not stats.connected, 10, "disconnect noticed")
    fill(spool, device, 30)  # produced while the broker is down
    assert spool.depth == 30
    own_broker.start()
    wait_for(lambda: spool.depth == 0, 30, "backlog drained after the broker came back")
    wait_for(lambda: len({m["seq"] for m in sub.results()}) == 50, 10, "all 50 at the subscriber")
    assert sorted({m["seq"] for m in sub.results()}) == list(range(1, 51))
    pub.request_stop(1.0)
    pub.join(10)
    spool.close()


def test_a_refused_publish_keeps_the_row(tmp_path: Path, own_broker: Broker) -> None:
    # Mosquitto answers an MQTT 5 publish that its ACL denies with PUBACK reason 0x87 (Not authorized).
    acl = tmp_path / "acl"
    acl.write_text("topic readwrite edged/+/status\n", encoding="utf-8")
    own_broker.extra_conf = f"acl_file {acl}\n"
    own_broker.start()
    spool, pub, stats, device = make(tmp_path, own_broker, protocol="5")
    fill(spool, device, 3)
    pub.start()
    wait_for(lambda: stats.failed >= 3, 10, "three refusals")
    assert spool.depth == 3
    assert "Not authorized" in (stats.last_error or "")
    assert stats.published == 0
    pub.request_stop(0.2)
    pub.join(10)
    spool.close()


def test_publisher_thread_stops_promptly_while_the_broker_is_absent(tmp_path: Path, own_broker: Broker) -> None:
    spool, pub, stats, _ = make(tmp_path, own_broker)
    pub.start()
    wait_for(lambda: stats.last_error, 10, "a failed connect")
    pub.request_stop(600.0)
    pub.join(10)
    assert not pub.is_alive()  # it does not sit out the grace period with nobody to talk to
    assert pub.name == "edged-mqtt"
    spool.close()
