"""Every broker's dialect: amqtt (PyPI) never answers the MQTT 5 CONNECT edged sends by default, Aedes (npm)
refuses it with 0x84; both speak 3.1.1 only; ejabberd (Debian) speaks 5 (tests/brokers.py). With the default
config (`protocol: 5`) edged tries 3.1.1 at once where 5 fails, delivers, and keeps the version that worked: a
broker restart is not met with another MQTT 5 attempt and a reconnect spread of waiting."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from brokers import OtherBroker
from conftest import StartDaemon, Subscribe, base_config, make_tiny_model, make_video, wait_for, write_config
from paho.mqtt.enums import CallbackAPIVersion

SPEAKS = {"amqtt": "3.1.1", "aedes": "3.1.1", "ejabberd": "5"}  # the version each accepts from edged


@pytest.fixture(params=["amqtt", "aedes", "ejabberd"])
def other(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OtherBroker]:
    broker = OtherBroker(str(request.param), tmp_path / str(request.param))
    broker.start()
    yield broker
    broker.stop()


@pytest.mark.integration
def test_a_broker_that_does_not_speak_mqtt_5_gets_3_1_1_at_once_and_keeps_it(
    tmp_path: Path, other: OtherBroker, subscribe: Subscribe, start_daemon: StartDaemon
) -> None:
    model, video = make_tiny_model(tmp_path / "tiny.onnx"), make_video(tmp_path / "v.mp4", 30)
    cfg: dict[str, Any] = base_config(tmp_path, model, str(video), fps=20, loop=True, stop_at_end=False)
    cfg["mqtt"] |= {"enabled": True, "port": other.port}  # protocol 5, the default
    if other.username is not None:
        cfg["mqtt"] |= {"username": other.username, "password_file": str(other.password_file())}
    device = cfg["device_id"]
    sub = subscribe(other, f"edged/{device}/#")
    daemon = start_daemon(write_config(tmp_path / "edged.yaml", cfg))
    # amqtt: one CONNACK timeout (10 s), then 3.1.1 at once; Aedes: 0x84, then 3.1.1 at once; ejabberd: 5
    wait_for(lambda: len(sub.results()) >= 10, 90, f"10 results through {other.kind}")
    speaks = SPEAKS[other.kind]
    snap = daemon.status()
    assert snap is not None
    assert snap["mqtt"]["protocol"] == speaks
    assert snap["state"] == "running", snap["reasons"]
    other.stop()  # a restart: the version that worked is asked first
    wait_for(lambda: (s := daemon.status()) and not s["mqtt"]["connected"], 30, "the broker gone")
    other.start()
    sub2 = subscribe(other, f"edged/{device}/#")
    wait_for(lambda: (s := daemon.status()) and s["mqtt"]["connected"] and s["mqtt"]["connects"] == 2, 120, "back")
    wait_for(lambda: len(sub2.results()) >= 3, 60, "results after the restart")
    status = daemon.status()
    assert status is not None
    assert status["mqtt"]["protocol"] == speaks
    code, err = daemon.stop(signal.SIGTERM)
    assert code == 0, err[-3000:]
    asked = "refused or left unanswered an MQTT 5 connection"
    # 3.1.1 brokers: once, at the first connect, never after the restart; ejabberd: never
    assert err.count(asked) == (speaks == "3.1.1"), err[-3000:]
    assert ("does not speak MQTT 5; connected with 3.1.1" in err) is (speaks == "3.1.1")


@pytest.mark.integration
def test_a_broker_that_grants_qos_0_only_keeps_the_device_connected_and_says_why(
    tmp_path: Path, start_daemon: StartDaemon
) -> None:
    """mqttools' broker (PyPI) grants QoS 0 at most and closes a connection that publishes above it. edged used
    to publish `online` at QoS 1 anyway and loop (8 connections in 40 s, the retained state `offline` while it
    ran). Every publish now honours Maximum QoS: one connection, `online` retained, and status says the results
    wait in the spool because the broker cannot acknowledge them."""
    broker = OtherBroker("mqttools", tmp_path / "mqttools")
    broker.start()
    try:
        model, video = make_tiny_model(tmp_path / "tiny.onnx"), make_video(tmp_path / "v.mp4", 30)
        cfg: dict[str, Any] = base_config(tmp_path, model, str(video), fps=10, loop=True, stop_at_end=False)
        cfg["mqtt"] |= {"enabled": True, "port": broker.port, "stats_interval_s": 1}
        daemon = start_daemon(write_config(tmp_path / "edged.yaml", cfg))

        def frames() -> int:
            status = daemon.status() or {}
            return int(status["pipelines"][0]["frames"]) if status.get("pipelines") else 0

        wait_for(lambda: frames() >= 50, 60, "50 frames")
        status = daemon.status() or {}
        assert status["mqtt"]["connected"] is True
        assert status["mqtt"]["connects"] == 1  # no loop
        assert any("grants QoS 0 at most" in r for r in status["reasons"]), status["reasons"]
        assert status["spool"]["depth"] >= 40  # kept, not lost
        got: list[bytes] = []
        reader = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
        reader.on_connect = lambda c, *_: c.subscribe(f"edged/{cfg['device_id']}/status", qos=0)
        reader.on_message = lambda _c, _u, m: got.append(bytes(m.payload))
        reader.connect(broker.host, broker.port)
        reader.loop_start()
        try:
            wait_for(lambda: got, 30, "the retained availability")
        finally:
            reader.loop_stop()
            reader.disconnect()
        assert got[-1] == b"online"
        code, _ = daemon.stop()
        assert code == 0
    finally:
        broker.stop()
