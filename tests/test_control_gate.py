"""The command gate on its own: every refusal reason, counted; nonces outlive a restart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from edged.config import parse_config
from edged.control.envelope import command_topic, new_command
from edged.control.gate import CommandGate
from edged.control.settings import ControlConfig
from edged.core.errors import CommandError, ConfigError
from edged.core.signing import generate_key, load_private_key, sign


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Any, str, Any]:
    public = generate_key(tmp_path / "fleet.key")
    other = generate_key(tmp_path / "other.key")
    assert other != public
    return load_private_key(tmp_path / "fleet.key"), public, load_private_key(tmp_path / "other.key")


def gate(tmp_path: Path, public: str, **kw: Any) -> CommandGate:
    cfg = ControlConfig.model_validate({"public_keys": [public], "groups": ["lobby"], **kw})
    return CommandGate(cfg, "dev1", tmp_path)


def signed(key: Any, cmd: str = "status", target: str = "dev1", **kw: Any) -> bytes:
    return json.dumps(sign(new_command(cmd, target, **kw), key)).encode()


def refusal(g: CommandGate, topic: str, payload: bytes, **kw: Any) -> str:
    with pytest.raises(CommandError) as err:
        g.admit(topic, payload, **kw)
    return err.value.reason


def test_a_signed_command_for_this_device_or_its_group_passes(tmp_path: Path, keys: tuple[Any, str, Any]) -> None:
    key, public, _ = keys
    g = gate(tmp_path, public)
    assert g.admit(command_topic("status", "dev1"), signed(key)).name == "status"
    group = g.admit(command_topic("reload", "group:lobby"), signed(key, "reload", "group:lobby"))
    assert group.target == "group:lobby"
    assert g.topics() == ["edged/dev1/cmd/+", "edged/group/lobby/cmd/+"]
    assert g.snapshot()["accepted"] == 2


def test_every_bad_command_is_refused_with_its_reason_and_counted(tmp_path: Path, keys: tuple[Any, str, Any]) -> None:
    key, public, other = keys
    g = gate(tmp_path, public, commands=["status", "reload"])
    topic = command_topic("status", "dev1")
    good = signed(key)
    tampered = json.loads(good)
    tampered["args"] = {"evil": True}
    unsigned = json.dumps(new_command("status", "dev1")).encode()
    cases = {
        "unsigned": (topic, unsigned),
        "bad_signature": (topic, json.dumps(tampered).encode()),
        "malformed": (topic, b"{not json"),
        "too_large": (topic, b"x" * 70_000),
        "wrong_target": (command_topic("status", "dev2").replace("dev2", "dev1"), signed(key, target="dev2")),
        "not_allowed": (command_topic("config", "dev1"), signed(key, "config")),
        "stale": (topic, signed(key, ts=1_000_000.0)),
    }
    for reason, (t, payload) in cases.items():
        assert refusal(g, t, payload) == reason, reason
    assert refusal(g, topic, signed(other)) == "bad_signature"  # a key this device does not trust
    g.admit(topic, good)
    assert refusal(g, topic, good) == "replayed"
    assert refusal(g, command_topic("reload", "dev1"), good) == "wrong_target"  # status signed, sent as reload
    snap = g.snapshot()
    assert snap["accepted"] == 1
    assert snap["refused"] == {**dict.fromkeys(cases, 1), "bad_signature": 2, "replayed": 1, "wrong_target": 2}


def test_a_replay_is_refused_after_a_restart_too(tmp_path: Path, keys: tuple[Any, str, Any]) -> None:
    key, public, _ = keys
    payload = signed(key)
    gate(tmp_path, public).admit(command_topic("status", "dev1"), payload)
    again = gate(tmp_path, public)  # a new daemon on the same state_dir
    assert refusal(again, command_topic("status", "dev1"), payload) == "replayed"


def test_check_config_names_a_bad_public_key_and_control_without_mqtt(tmp_path: Path, tiny_model: Path) -> None:
    text = (f"device_id: d\nstate_dir: {tmp_path}\nmqtt: {{enabled: false}}\ncontrol:\n  public_keys: [\"abc\"]\n"
            "pipelines:\n  - name: cam0\n    source: {type: camera, uri: /dev/video9}\n"
            f"    model: {{path: {tiny_model}}}\n")  # fmt: skip
    with pytest.raises(ConfigError) as err:
        parse_config(text, "edged.yaml")
    assert err.value.problems[0].startswith('edged.yaml:5 control.public_keys=["abc"]: ')
    assert "is not an Ed25519 public key" in err.value.problems[0]
    public = generate_key(tmp_path / "k")
    with pytest.raises(ConfigError) as err:
        parse_config(text.replace('"abc"', f'"{public}"'), "edged.yaml")
    assert "control needs mqtt" in err.value.problems[0]


def test_control_events_topic_is_now_replies_topic_and_the_old_name_still_works(
    keys: tuple[Any, str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """`control.events_topic` (command replies, not spooled) shared its name with `mqtt.events_topic` (tracking
    events, spooled): renamed, the old key kept with a warning."""
    _, public, _ = keys
    new = ControlConfig.model_validate({"public_keys": [public], "replies_topic": "ops/{device_id}/replies"})
    assert new.replies_topic == "ops/{device_id}/replies"
    with caplog.at_level("WARNING"):
        old = ControlConfig.model_validate({"public_keys": [public], "events_topic": "ops/{device_id}/replies"})
    assert old.replies_topic == "ops/{device_id}/replies"
    assert "control.events_topic is now control.replies_topic" in caplog.text
    with pytest.raises(ValueError, match=r"old name of control\.replies_topic"):
        ControlConfig.model_validate({"public_keys": [public], "events_topic": "a", "replies_topic": "b"})


def test_every_command_name_has_one_handler_module_and_no_handler_is_unnamed() -> None:
    """The command path: names.py (what `edged fleet send` offers) and handlers/ (one module per command,
    found by the dispatcher's registry) hold the same commands."""
    from edged.control.dispatch import HANDLERS
    from edged.control.names import ALL_COMMANDS

    assert HANDLERS.keys() == set(ALL_COMMANDS)
    assert {f.__module__.rsplit(".", 1)[-1] for f in HANDLERS.factories.values()} == set(ALL_COMMANDS)
