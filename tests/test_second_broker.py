"""A second broker implementation: RabbitMQ 3.10 with its MQTT plugin, from Debian (tests/rabbitmq.py).
It speaks MQTT 3.1.1 only and closes an MQTT 5 connection without a CONNACK, so edged, configured for 5 as
by default, falls back to 3.1.1 for the connection; then the same promises as with Mosquitto: delivery in
seq order, the retained availability and the last will, an outage with no seq missing."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import StartDaemon, Subscribe, base_config, make_tiny_model, make_video, wait_for, write_config
from rabbitmq import RabbitMQ
from test_daemon import spool_seqs

from edged.core.errors import IngestError
from edged.fleet.ingest import Ingest, IngestOptions
from edged.fleet.ingestdb import open_database
from edged.fleet.report import build_report


@pytest.fixture(scope="module")
def rabbit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitMQ]:
    broker = RabbitMQ(tmp_path_factory.mktemp("rabbitmq"))
    broker.start()
    yield broker
    broker.stop()


def config_for(tmp_path: Path, rabbit: RabbitMQ) -> tuple[Path, str]:
    model, video = make_tiny_model(tmp_path / "tiny.onnx"), make_video(tmp_path / "v.mp4", 30)
    cfg: dict[str, Any] = base_config(tmp_path, model, str(video), broker=rabbit, fps=40, loop=True, stop_at_end=False)  # type: ignore[arg-type]
    cfg["mqtt"]["enabled"] = True  # protocol: 5, the default
    return write_config(tmp_path / "edged.yaml", cfg), cfg["device_id"]


@pytest.mark.integration
def test_delivery_retained_availability_and_last_will_on_rabbitmq(
    tmp_path: Path, rabbit: RabbitMQ, subscribe: Subscribe, start_daemon: StartDaemon
) -> None:
    config, device = config_for(tmp_path, rabbit)
    sub = subscribe(rabbit, f"edged/{device}/#")
    daemon = start_daemon(config)
    wait_for(lambda: len(sub.results()) >= 20, 60, "20 results through RabbitMQ")
    snap = daemon.status()
    assert snap is not None
    assert snap["mqtt"]["protocol"] == "3.1.1"  # RabbitMQ 3.10 refused 5
    assert snap["state"] == "running", snap["reasons"]
    seqs = [m["seq"] for m in sub.results()]
    assert seqs == sorted(seqs)
    # RabbitMQ delivers retained messages to exact topic names: a newcomer learns the device is online
    late = subscribe(rabbit, f"edged/{device}/status")
    wait_for(lambda: late.payloads(f"edged/{device}/status"), 15, "the retained availability")
    assert late.payloads(f"edged/{device}/status")[0] == (b"online", True)
    daemon.stop(signal.SIGKILL)
    wait_for(lambda: (b"offline", False) in sub.payloads(f"edged/{device}/status"), 30, "the last will")
    delivered, spooled = {m["seq"] for m in sub.results()}, set(spool_seqs(tmp_path / "state"))
    assert delivered | spooled == set(range(1, max(delivered | spooled) + 1))


@pytest.mark.integration
def test_a_rabbitmq_outage_loses_no_seq(
    tmp_path: Path, rabbit: RabbitMQ, subscribe: Subscribe, start_daemon: StartDaemon
) -> None:
    config, device = config_for(tmp_path, rabbit)
    sub = subscribe(rabbit, f"edged/{device}/#", persistent=True)  # a durable queue keeps what comes meanwhile
    daemon = start_daemon(config)
    wait_for(lambda: len(sub.results()) >= 10, 60, "results before the outage")
    rabbit.stop()
    down = wait_for(lambda: (s := daemon.status()) and not s["mqtt"]["connected"] and s, 30, "the outage seen")
    assert down["state"] == "degraded"
    assert any(r.startswith("broker not connected") for r in down["reasons"])
    wait_for(lambda: (s := daemon.status()) and s["spool"]["depth"] >= 20 and s, 30, "results buffered")
    rabbit.start()
    wait_for(lambda: (s := daemon.status()) and s["mqtt"]["connected"], 60, "reconnected")
    code, err = daemon.stop(signal.SIGTERM)
    assert code == 0, err

    def accounted() -> set[int]:
        return {m["seq"] for m in sub.results()} | set(spool_seqs(tmp_path / "state"))

    top = max(accounted())
    assert top >= 30
    wait_for(lambda: accounted() == set(range(1, top + 1)), 30, "every seq delivered or still spooled")


@pytest.mark.integration
def test_ingest_over_mqtt_3_1_1_lands_every_result_from_rabbitmq(
    tmp_path: Path, rabbit: RabbitMQ, start_daemon: StartDaemon
) -> None:
    """`edged ingest --protocol 3.1.1` (RabbitMQ 3.10 has no MQTT 5, so no shared subscription): every result
    of a device lands once in SQLite, and the report finds nothing missing."""
    ingest = Ingest(
        IngestOptions(host=rabbit.host, port=rabbit.port, protocol="3.1.1", group="", client_id="ingest-rabbit"),
        open_database(str(tmp_path / "r.db")),
    )
    ingest.start()
    try:
        model, video = make_tiny_model(tmp_path / "tiny.onnx"), make_video(tmp_path / "v.mp4", 40)
        cfg = base_config(tmp_path, model, str(video), broker=rabbit)  # type: ignore[arg-type]
        cfg["mqtt"] |= {"enabled": True, "protocol": "3.1.1"}  # the 40 frames end before a fallback would
        daemon = start_daemon(write_config(tmp_path / "edged.yaml", cfg))
        wait_for(lambda: ingest.db.count() == 40, 60, "the video's 40 results in the database")
        daemon.stop()
        entry = next(d for d in build_report(ingest.db)["devices"] if d["device"] == cfg["device_id"])
        assert (entry["missing"], entry["unexplained"], entry["pipelines"][0]["last_seq"]) == (0, 0, 40)
    finally:
        ingest.stop()
        ingest.db.close()


def test_ingest_refuses_shared_subscriptions_over_mqtt_3_1_1() -> None:
    with pytest.raises(IngestError, match=r"need MQTT 5"):
        Ingest(IngestOptions(protocol="3.1.1", group="g"), open_database(":memory:"))
