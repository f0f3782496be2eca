"""What comes in on the publisher's connection, on its own (uplink/inbound.py): routing to one handler, the
budget per topic, made-up topic names, topics nothing subscribed to. paho's own message objects."""

from __future__ import annotations

import paho.mqtt.client as paho

from edged.uplink.inbound import PER_TOPIC_BURST, Inbound


def _message(topic: str) -> paho.MQTTMessage:
    return paho.MQTTMessage(topic=topic.encode())


def test_each_message_goes_to_the_one_handler_whose_subscription_it_matches() -> None:
    inbound = Inbound()
    got: dict[str, list[str]] = {"cmd": [], "replay": []}
    inbound.route(["edged/d/cmd/+"], lambda m: got["cmd"].append(m.topic))
    inbound.route(["edged/d/replay/request"], lambda m: got["replay"].append(m.topic))
    for topic in ("edged/d/cmd/status", "edged/d/replay/request", "edged/other/cmd/status"):
        inbound.deliver(_message(topic))
    assert got == {"cmd": ["edged/d/cmd/status"], "replay": ["edged/d/replay/request"]}
    assert inbound.unrouted == 1


def test_a_flood_on_one_topic_costs_no_other_topic_its_messages() -> None:
    inbound = Inbound()
    got: list[str] = []
    inbound.route(["edged/d/cmd/+"], lambda m: got.append(m.topic))
    inbound.deliver(_message("edged/d/cmd/reload"))
    for _ in range(10_000):
        inbound.deliver(_message("edged/d/cmd/status"))
    inbound.deliver(_message("edged/d/cmd/reload"))
    assert got.count("edged/d/cmd/reload") == 2  # untouched by the flood beside it
    assert got.count("edged/d/cmd/status") <= PER_TOPIC_BURST + 1
    counts = inbound.snapshot()["subscriptions"]["edged/d/cmd/+"]
    assert counts["dropped"] >= 10_000 - PER_TOPIC_BURST
    assert inbound.floods() == [("edged/d/cmd/+", counts["dropped"])]


def test_made_up_topic_names_do_not_add_up_to_a_budget_each() -> None:
    """A flood over 100,000 different command names used to be 100,000 new buckets: a subscription takes on
    a few new names a second, each with one message, not a burst."""
    inbound = Inbound()
    got: list[str] = []
    inbound.route(["edged/d/cmd/+"], lambda m: got.append(m.topic))
    for i in range(100_000):
        inbound.deliver(_message(f"edged/d/cmd/x{i}"))
    assert len(got) <= 200  # 10 new names a second, 8 messages each at most


def test_a_subscription_without_a_budget_takes_every_message() -> None:
    """A rollout's model chunks bound themselves (the download knows its size): all of them come."""
    inbound = Inbound()
    got: list[str] = []
    inbound.route(["edged/fleet/models/abc/#"], lambda m: got.append(m.topic), budget=False)
    for i in range(500):
        inbound.deliver(_message(f"edged/fleet/models/abc/{i}"))
    assert len(got) == 500
    inbound.unroute(["edged/fleet/models/abc/#"])
    inbound.deliver(_message("edged/fleet/models/abc/0"))
    assert len(got) == 500
