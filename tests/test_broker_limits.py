"""The publisher honours what the broker's CONNACK says (edged/uplink/brokerlimits.py), against a real
Mosquitto (Maximum Packet Size, Maximum QoS, Retain Available, a session taken over) and, for Receive
Maximum, which no installable broker enforces, the stand-in server of tests/mqtt5_standin.py."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from conftest import Broker, Subscribe, wait_for
from mqtt5_standin import StandIn
from paho.mqtt.enums import CallbackAPIVersion
from test_mqtt import make, stop_publisher

from edged.store.spool import Spool
from edged.uplink.brokerlimits import BrokerLimits, publish_size
from edged.uplink.publisher import topic_for


def put(spool: Spool, device: str, sizes: list[int]) -> list[int]:
    """One result per size (bytes of padding in its payload); their seqs."""
    topic = topic_for("edged/{device_id}/{pipeline}/results", device, "cam0")
    seqs = []
    for size in sizes:
        seq = spool.next_seq("cam0")
        body = json.dumps({"v": 1, "device": device, "pipeline": "cam0", "seq": seq, "pad": "x" * size}).encode()
        spool.append("cam0", seq, time.time(), topic, body)
        seqs.append(seq)
    assert spool.flush()
    return seqs


@pytest.mark.integration
def test_a_result_larger_than_the_brokers_maximum_packet_size_is_a_dead_letter_and_the_rest_flow(
    tmp_path: Path, own_broker: Broker, subscribe: Subscribe
) -> None:
    """Mosquitto with `max_packet_size 300` says so in its CONNACK: the 400-byte results are set aside at
    once with both sizes in the reason, never sent (no reconnect storm); every small one arrives, batched
    results are split to fit, and what comes after still flows."""
    own_broker.extra_conf = "max_packet_size 300\n"
    own_broker.start()
    spool, pub, stats, device = make(tmp_path, own_broker, batch=8)
    sub = subscribe(own_broker, f"edged/{device}/#")
    big = put(spool, device, [20, 400, 20, 20, 400, 20, 20, 20, 20, 20])
    pub.start()
    wait_for(lambda: spool.stats()["dead_letters"] == 2 and spool.depth == 0, 15, "two dead letters, the rest out")
    delivered = sorted(r["seq"] for batch in sub.payloads(f"edged/{device}/cam0/results") for r in json.loads(batch[0]))
    assert delivered == [s for i, s in enumerate(big) if i not in (1, 4)]
    assert stats.broker_limits["max_packet"] == 300
    assert "larger than the broker's Maximum Packet Size of 300 bytes" in (stats.last_error or "")
    assert stats.connects == 1  # the broker never had to hang up on us
    later = put(spool, device, [20, 20])
    wait_for(lambda: spool.depth == 0, 10, "later results delivered")
    wait_for(lambda: len(sub.payloads(f"edged/{device}/cam0/results")) >= 1, 10, "later delivery")
    got = {r["seq"] for batch in sub.payloads(f"edged/{device}/cam0/results") for r in json.loads(batch[0])}
    assert set(later) <= got
    stop_publisher(pub, 0.5)
    spool.close()


def test_in_flight_never_exceeds_the_brokers_receive_maximum(tmp_path: Path) -> None:
    """The stand-in advertises Receive Maximum 3 and disconnects with 0x93 beyond it, as HiveMQ and EMQX
    do; edged's own window is 32. Every result arrives on one connection, never more than 3 unacknowledged."""
    server = StandIn(receive_maximum=3)
    server.start()
    try:
        broker = Broker("127.0.0.1", server.port, tmp_path)
        spool, pub, stats, device = make(tmp_path, broker, max_inflight=32)
        put(spool, device, [10] * 60)
        pub.start()
        wait_for(lambda: spool.depth == 0, 20, "every result acknowledged")
        assert not server.exceeded
        assert server.max_in_flight <= 3
        assert server.distinct() == 60 + 1  # and the availability message
        assert server.connections == 1
        assert stats.broker_limits["receive_max"] == 3
        stop_publisher(pub, 0.5)
        spool.close()
    finally:
        server.stop()


def test_a_broker_that_cannot_do_qos_1_keeps_results_in_the_spool_and_says_why(
    tmp_path: Path, own_broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    """Mosquitto with `max_qos 0` refuses edged's CONNECT (its last will is QoS 1) with 0x9B: the refusal is
    named with what it means, edged connects again with a QoS 0 will and stays connected, status says results
    cannot be delivered at QoS 1, and the results wait in the spool."""
    own_broker.extra_conf = "max_qos 0\n"
    own_broker.start()
    spool, pub, stats, device = make(tmp_path, own_broker)
    put(spool, device, [10, 10])
    caplog.set_level(logging.WARNING, logger="edged.uplink")
    pub.start()
    wait_for(lambda: stats.connected, 30, "connected again, with a QoS 0 last will")
    refusals = [r.getMessage() for r in caplog.records if "refused the connection" in r.getMessage()]
    assert any("does not support QoS 1" in m and "(0x9B)" in m for m in refusals), refusals  # named, in words
    assert any("grants QoS 0 at most" in p for p in stats.broker_problems)
    assert spool.depth == 2
    assert stats.published == 0
    assert BrokerLimits(max_qos=0).problems(1)[0].startswith("the broker grants QoS 0 at most")
    stop_publisher(pub, 0.5)
    spool.close()


@pytest.mark.integration
def test_without_retain_the_availability_goes_unretained_and_results_flow(
    tmp_path: Path, own_broker: Broker, subscribe: Subscribe
) -> None:
    """Mosquitto with `retain_available false` refuses a CONNECT whose will is retained (0x9A): edged connects
    again without retain (will and availability), says so in status, and delivers its results."""
    own_broker.extra_conf = "retain_available false\n"
    own_broker.start()
    spool, pub, stats, device = make(tmp_path, own_broker)
    sub = subscribe(own_broker, f"edged/{device}/#")
    put(spool, device, [10, 10, 10])
    pub.start()
    wait_for(lambda: spool.depth == 0, 10, "results delivered")
    assert "Retain Available 0" in stats.broker_problems[0]
    assert sub.payloads(pub.availability_topic) == [(b"online", False)]
    assert stats.connects == 1  # the refused attempt did not connect
    stop_publisher(pub, 0.5)
    spool.close()


@pytest.mark.integration
def test_a_session_taken_over_is_named(tmp_path: Path, own_broker: Broker, caplog: pytest.LogCaptureFixture) -> None:
    """Another client with edged's client id (a second device with the same device_id) keeps taking the
    session. Mosquitto 2.0 just closes the old connection (no DISCONNECT 0x8E, so paho says "Unspecified
    error"); after three such drops of fresh connections the log and status say what is likely going on."""
    own_broker.start()
    spool, pub, stats, _ = make(tmp_path, own_broker)
    pub.start()
    wait_for(lambda: stats.connected, 10, "connected")
    rival = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id=pub.client_id,
                        protocol=paho.MQTTv5)  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="edged.uplink.publisher"):
        rival.connect(own_broker.host, own_broker.port)
        rival.loop_start()
        wait_for(lambda: "may be taking the session" in caplog.text, 60, "the takeover named")
    rival.loop_stop()
    rival.disconnect()
    assert f"another client with client id {pub.client_id!r} may be taking the session" in caplog.text
    assert stats.suspicion is not None  # a status reason for a minute after the last such drop
    assert "may be taking the session" in stats.suspicion[1]
    stop_publisher(pub, 0.5)
    spool.close()


def test_reason_codes_are_named_with_what_they_mean() -> None:
    """Brokers that do say why (MQTT 5 reason codes) get the name, the code and, where the name is not
    enough, what it means for this client."""
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.reasoncodes import ReasonCode

    from edged.uplink.brokerlimits import describe_reason

    taken = describe_reason(ReasonCode(PacketTypes.DISCONNECT, identifier=0x8E), "edged-pi1")
    assert taken == (
        "another client with client id 'edged-pi1' took the session (two devices with one device_id or "
        "mqtt.client_id?): Session taken over (0x8E)"
    )
    version = describe_reason(ReasonCode(PacketTypes.CONNACK, identifier=0x84), "x")
    assert version.startswith('the broker does not speak this MQTT version: set mqtt.protocol: "3.1.1"')
    assert describe_reason(ReasonCode(PacketTypes.DISCONNECT, identifier=0x93), "x").endswith("(0x93)")


def test_packet_sizes_are_counted_as_paho_sends_them() -> None:
    """The size check counts what goes on the wire: fixed header, topic, packet id, properties, payload."""
    assert publish_size("a/b", b"x" * 10, 1, None, mqtt5=False) == 1 + 1 + (2 + 3) + 2 + 10
    assert publish_size("a/b", b"x" * 10, 1, None, mqtt5=True) == 1 + 1 + (2 + 3) + 2 + 1 + 10
    assert publish_size("t", b"x" * 200, 0, None, mqtt5=False) == 1 + 2 + (2 + 1) + 200  # two length bytes
    limits = BrokerLimits.from_properties(None)  # MQTT 3.1.1: no properties, the protocol's limits
    assert limits.inflight(32) == 32
    assert limits.fits(10_000_000)
    assert not limits.problems(1)


def test_a_lost_connection_is_said_in_words_not_as_an_unspecified_error() -> None:
    """paho reports a socket closed without DISCONNECT (a broker stopped cleanly, a network gone) as 0x80
    'Unspecified error': the log and status say what it means."""
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.reasoncodes import ReasonCode

    from edged.uplink.brokerlimits import describe_disconnect

    closed = describe_disconnect(ReasonCode(PacketTypes.DISCONNECT, identifier=0x80), "pi-01")
    assert closed.startswith("the connection closed without a DISCONNECT (the broker stopped or restarted")
    assert closed.endswith("(0x80)")
    shutting = describe_disconnect(ReasonCode(PacketTypes.DISCONNECT, identifier=0x8B), "pi-01")
    assert shutting.startswith("the broker is shutting down: ")
    taken = describe_disconnect(ReasonCode(PacketTypes.DISCONNECT, identifier=0x8E), "pi-01")
    assert taken.startswith("another client with client id 'pi-01' took the session")
