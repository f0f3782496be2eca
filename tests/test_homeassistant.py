"""Home Assistant discovery: the configs follow the MQTT discovery schema, their templates render (with
Jinja2's sandbox, Home Assistant's engine) to the right states on a real daemon's messages through a
real Mosquitto, and an entity that goes away gets the empty retained config that deletes it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import Broker, Subscribe, base_config, make_video, wait_for
from detect_models import make_detector
from jinja2.sandbox import SandboxedEnvironment

from edged.config import config_from_dict
from edged.daemon import Daemon
from edged.uplink.homeassistant import Discovery

TOPIC = re.compile(r"^homeassistant/(sensor|binary_sensor)/([A-Za-z0-9_-]+)/([A-Za-z0-9_-]+)/config$")
NEEDED = {"name", "unique_id", "object_id", "device", "availability", "state_topic", "value_template"}


def render(template: str, message: dict[str, Any]) -> str:
    """What Home Assistant shows for a message: `value_json` is the payload parsed as JSON."""
    return SandboxedEnvironment().from_string(template).render(value_json=message).strip()


def ha_config(tmp_path: Path, broker: Broker, name: str = "yard") -> dict[str, Any]:
    model = make_detector(tmp_path / "det.onnx", "yolov8")
    cfg = base_config(tmp_path, model, str(make_video(tmp_path / "v.mp4", 20)), broker=broker, loop=True,
                      stop_at_end=False, fps=20)  # fmt: skip
    cfg["device_id"] = cfg["device_id"] + ".cam"  # a dot: not allowed in Home Assistant ids
    cfg["mqtt"]["stats_interval_s"] = 0.2
    cfg["homeassistant"] = {"enabled": True, "labels": ["person", "car"]}
    cfg["pipelines"][0].update({
        "name": name,
        "postprocess": {"type": "detect"},
        "zones": [{"name": "left", "points": [[0, 0], [0.5, 0], [0.5, 1], [0, 1]], "labels": ["person"]}],
        "tracking": {"enabled": True, "min_hits": 1},
    })  # fmt: skip
    return cfg


def test_discovery_configs_follow_the_schema(tmp_path: Path) -> None:
    cfg = config_from_dict(ha_config(tmp_path, Broker("127.0.0.1", 1, tmp_path)))
    configs = Discovery(
        cfg.homeassistant, device_id=cfg.device_id, pipelines=cfg.pipelines, results_topic={"yard": "r"},
        stats_topic="s", availability_topic="a",
    ).configs()  # fmt: skip
    ids = [c["unique_id"] for _, c in configs]
    assert len(ids) == len(set(ids))  # unique across the device
    node = cfg.device_id.replace(".", "_")
    for topic, c in configs:
        match = TOPIC.match(topic)
        assert match, topic
        assert match.group(2) == node
        assert c["object_id"] == f"{node}_{match.group(3)}"
        assert set(c) >= NEEDED, (topic, NEEDED - set(c))
        assert c["device"]["identifiers"] == [f"edged_{node}"]
        assert c["availability"] == [{"topic": "a", "payload_available": "online", "payload_not_available": "offline"}]
        if match.group(1) == "binary_sensor":
            assert (c["payload_on"], c["payload_off"]) == ("ON", "OFF")
    objects = {TOPIC.match(t).group(3) for t, _ in configs}  # type: ignore[union-attr]
    assert {"yard_person", "yard_car", "yard_person_count", "yard_left_person_count", "yard_fps", "yard_tracks",
            "spool_depth", "spool_dropped"} <= objects  # fmt: skip
    assert "yard_left_car_count" not in objects  # the zone counts persons only


def test_stats_entities_go_unavailable_when_three_stats_messages_are_missed(tmp_path: Path) -> None:
    """A broker that keeps a gone device's retained `online` (ejabberd across a clean restart: the will never fired)
    must not make it look alive for ever: the entities fed by the stats message expire after three intervals."""
    cfg = config_from_dict(ha_config(tmp_path, Broker("127.0.0.1", 1, tmp_path)))
    configs = Discovery(
        cfg.homeassistant, device_id=cfg.device_id, pipelines=cfg.pipelines, results_topic={"yard": "r"},
        stats_topic="s", availability_topic="a", stats_interval_s=60.0,
    ).configs()  # fmt: skip
    fed = {c["object_id"]: c.get("expire_after") for _, c in configs if c.get("state_topic") == "s"}
    assert fed
    assert set(fed.values()) == {180}
    assert all("expire_after" not in c for _, c in configs if c.get("state_topic") == "r")  # results may be rare


@pytest.mark.integration
def test_home_assistant_sees_the_device_its_entities_and_their_states(
    tmp_path: Path, broker: Broker, subscribe: Subscribe
) -> None:
    cfg = ha_config(tmp_path, broker)
    dev = cfg["device_id"]
    node = dev.replace(".", "_")
    daemon = Daemon(config_from_dict(cfg))
    daemon.start()
    try:
        sub = subscribe(broker, "#")
        wait_for(lambda: sub.payloads(f"edged/{dev}/yard/results") and sub.payloads(f"edged/{dev}/stats"), 30,
                 "results and a stats message")  # fmt: skip
        configs = {t: json.loads(p) for t, p, _ in sub.messages if t.startswith("homeassistant/") and p}
        kept = subscribe(broker, "homeassistant/#")  # Home Assistant starting later finds them: retained
        wait_for(lambda: {t for t, _, r in kept.messages if r} == set(configs), 30, "every config retained")
        states = {}
        for topic, c in configs.items():
            message = json.loads(sub.payloads(c["state_topic"])[-1][0])
            states[topic.split("/")[3]] = render(c["value_template"], message)
    finally:
        daemon.stop()
    # the detector sees a person (left half), a car and two dogs in every frame (tests/detect_models.py)
    assert states["yard_detections"] == "4"
    assert (states["yard_person"], states["yard_person_count"], states["yard_car_count"]) == ("ON", "1", "1")
    assert states["yard_left_person_count"] == "1"
    assert float(states["yard_fps"]) >= 0
    assert states["yard_provider"] == "CPUExecutionProvider"
    assert int(states["spool_depth"]) >= 0
    assert configs[f"homeassistant/binary_sensor/{node}/yard_person/config"]["device_class"] == "occupancy"

    # aftermath: the pipeline renamed, restarted: the old entities are deleted (empty retained), the new appear
    renamed = {**cfg, "pipelines": [{**cfg["pipelines"][0], "name": "drive"}]}
    daemon = Daemon(config_from_dict(renamed))
    daemon.start()
    try:
        gone = f"homeassistant/binary_sensor/{node}/yard_person/config"
        wait_for(lambda: any(p == b"" for p, _ in sub.payloads(gone)), 30, "the old entity's empty config")
        late = subscribe(broker, f"homeassistant/+/{node}/+/config")  # what Home Assistant finds now (retained)
        wait_for(lambda: late.payloads(f"homeassistant/binary_sensor/{node}/drive_person/config"), 30, "the new one")
        assert not late.payloads(gone)  # an empty retained message removes the retained config
    finally:
        daemon.stop()
