"""Remote control against real daemons through a real Mosquitto: signed commands do what they say, every
bad one is refused with its reason and changes nothing, and the daemon answers the next good one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import paho.mqtt.client as paho
import pytest
from conftest import Rig, Subscribe, ask, control_daemon, wait_for
from paho.mqtt.enums import CallbackAPIVersion

from edged.control.envelope import command_topic, new_command
from edged.core.signing import generate_key, load_private_key, sign

pytestmark = pytest.mark.integration


def test_status_answers_on_the_response_topic_and_the_state_is_retained(rig: Rig, subscribe: Subscribe) -> None:
    daemon, cfg, _ = control_daemon(rig)
    dev = cfg["device_id"]
    answer = ask(rig.fleet, "status", dev)[dev]
    assert answer["ok"] is True
    assert answer["detail"]["pipelines"][0]["name"] == "cam0"
    late = subscribe(rig.broker, f"edged/{dev}/state")  # subscribed after it was sent: retained
    wait_for(lambda: late.payloads(f"edged/{dev}/state"), 10, "the retained state")
    state = json.loads(late.payloads(f"edged/{dev}/state")[-1][0])
    assert state["health"] in ("running", "degraded")
    assert state["pipelines"][0]["model"]["sha256"]
    assert len(state["config_sha256"]) == 64
    assert daemon.status()["control"]["accepted"] == 1  # type: ignore[index]


def test_config_is_validated_first_and_applied_only_when_valid(rig: Rig) -> None:
    daemon, cfg, path = control_daemon(rig)
    dev = cfg["device_id"]
    before = path.read_bytes()
    bad = ask(rig.fleet, "config", dev, {"config": {"pipelines": [{"name": "cam0", "postprocess": {"type": "nope"}}]}})
    assert (bad[dev]["ok"], bad[dev]["reason"]) == (False, "invalid_config")
    assert "<remote config>" in bad[dev]["detail"]
    assert path.read_bytes() == before  # nothing changed on the device
    assert daemon.status()["reload"]["result"] is None  # type: ignore[index]

    good = ask(rig.fleet, "config", dev, {"config": {"log_level": "debug"}})
    assert good[dev]["ok"] is True, good
    assert "log_level debug applied" in good[dev]["detail"]["notes"]
    assert "log_level: debug" in path.read_text()
    assert path.with_name("edged.yaml.prev").read_bytes() == before
    # and the next reload still works (aftermath)
    assert ask(rig.fleet, "reload", dev)[dev]["detail"]["result"] == "applied"


def test_record_saves_the_frames_the_model_sees(rig: Rig) -> None:
    _, cfg, _ = control_daemon(rig)
    dev = cfg["device_id"]
    answer = ask(rig.fleet, "record", dev, {"frames": 5, "every": 2})[dev]
    assert answer["ok"] is True, str(answer)  # whole: the reason and the report
    saved = np.load(answer["detail"]["path"])["frames"]
    assert saved.shape == (5, 48, 64, 3)
    assert Path(answer["detail"]["path"]).stat().st_mode & 0o777 == 0o640  # frames of the scene: not for others


def test_while_a_recording_runs_status_is_answered_and_other_commands_are_busy(rig: Rig) -> None:
    daemon, cfg, _ = control_daemon(rig)
    dev = cfg["device_id"]
    recording = rig.fleet.send(new_command("record", dev, {"frames": 20, "every": 10}))  # 200 frames at 20 fps: 10 s
    status = ask(rig.fleet, "status", dev)[dev]
    assert status["ok"] is True  # at once, not behind the recording ...
    assert not recording.by_device  # ... which is still running
    reload = ask(rig.fleet, "reload", dev)[dev]
    assert (reload["ok"], reload["reason"]) == (False, "busy")
    assert reload["detail"].startswith("busy with record (id ")
    recorded = rig.fleet.wait(recording, expect=1, timeout=60)[dev]
    assert recorded["ok"] is True, recorded
    assert recorded["detail"]["frames"] == 20
    # aftermath: the next command runs, and the refusal was counted
    assert ask(rig.fleet, "reload", dev)[dev]["detail"]["result"] == "applied"
    assert daemon.status()["control"]["refused"]["busy"] == 1  # type: ignore[index]


def test_a_stop_during_a_long_recording_ends_it_and_answers_first(rig: Rig) -> None:
    daemon, cfg, _ = control_daemon(rig)
    dev = cfg["device_id"]
    args = {"frames": 50, "every": 100, "timeout_s": 600}  # 5,000 frames at 20 fps: over four minutes
    recording = rig.fleet.send(new_command("record", dev, args))
    assert ask(rig.fleet, "reload", dev)[dev]["reason"] == "busy"  # the recording runs
    code, err = daemon.stop()  # within the harness's stop timeout, not after the recording's 600 s
    assert code == 0, err
    answer = rig.fleet.wait(recording, expect=1, timeout=30)[dev]  # answered before the daemon went
    if answer["ok"]:  # with the frames it had
        assert answer["detail"]["complete"] is False
    else:  # a loaded machine may stop it before the first frame came; it says so
        assert answer["detail"].endswith("the daemon stopped before a frame came"), answer


def test_a_group_command_reaches_every_member(rig: Rig) -> None:
    group = f"lobby{rig.tmp_path.name[-6:]}"
    devices = [control_daemon(rig, name, (group,))[1]
               for name in ("a", "b")]  # fmt: skip
    answers = ask(rig.fleet, "status", f"group:{group}", expect=2)
    assert sorted(answers) == sorted(d["device_id"] for d in devices)
    assert all(a["ok"] for a in answers.values())


def test_bad_commands_are_refused_counted_and_change_nothing(rig: Rig, subscribe: Subscribe) -> None:
    daemon, cfg, path = control_daemon(rig)
    dev = cfg["device_id"]
    events = subscribe(rig.broker, f"edged/{dev}/events")
    key = load_private_key(rig.key)
    generate_key(rig.tmp_path / "stranger.key")
    stranger = load_private_key(rig.tmp_path / "stranger.key")
    change = {"config": {"log_level": "debug"}}
    topic = command_topic("config", dev)
    replay = json.dumps(sign(new_command("config", dev, {"config": {"log_level": "warning"}}), key)).encode()
    tampered = sign(new_command("config", dev, {"config": {"log_level": "info"}}), key)
    tampered["args"] = change
    attempts = {
        "unsigned": json.dumps(new_command("config", dev, change)).encode(),
        "bad_signature": json.dumps(tampered).encode(),
        "stale": json.dumps(sign(new_command("config", dev, change, ts=1_700_000_000.0), key)).encode(),
        "too_large": json.dumps(sign(new_command("config", dev, {"config": {"x": "y" * 70_000}}), key)).encode(),
        "wrong_target": json.dumps(sign(new_command("config", "someone-else", change), key)).encode(),
        "malformed": json.dumps(sign(new_command("record", dev, {"frames": -1}), key)).encode(),
    }
    publisher = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id=f"attacker-{dev}")
    publisher.connect(rig.broker.host, rig.broker.port)
    publisher.loop_start()
    try:
        for reason, payload in attempts.items():
            target = command_topic("record", dev) if reason == "malformed" else topic
            publisher.publish(target, payload, qos=1).wait_for_publish(10)
        publisher.publish(topic, json.dumps(sign(new_command("config", dev, change), stranger)), qos=1)
        publisher.publish(topic, replay, qos=1).wait_for_publish(10)
        wait_for(lambda: (daemon.status() or {}).get("control", {}).get("accepted") == 1, 30, "the first copy")
        publisher.publish(topic, replay, qos=1).wait_for_publish(10)  # the same message again: a replay
    finally:
        publisher.loop_stop()
        publisher.disconnect()

    expected = {**dict.fromkeys(attempts, 1), "bad_signature": 2, "replayed": 1}
    wait_for(lambda: daemon.status()["control"]["refused"] == expected, 30, "every refusal counted")  # type: ignore[index]
    wait_for(lambda: len([e for e in (json.loads(p) for p, _ in events.payloads(f"edged/{dev}/events"))
                          if e.get("ok") is False]) == 8, 30, "an event per refusal")  # fmt: skip
    refused = [e for e in (json.loads(p) for p, _ in events.payloads(f"edged/{dev}/events")) if e.get("ok") is False]
    assert sorted({e["reason"] for e in refused}) == sorted(expected)
    assert "log_level: debug" not in path.read_text()  # none of the bad ones changed anything
    assert "log_level: warning" in path.read_text()  # the one good copy did, once
    # aftermath: a good command still works, the daemon is healthy
    assert ask(rig.fleet, "status", dev)[dev]["ok"] is True
    assert daemon.status()["state"] in ("running", "degraded")  # type: ignore[index]


def test_key_setup_and_send_from_the_command_line(rig: Rig) -> None:
    key = rig.tmp_path / "ops.key"
    made = subprocess.run([sys.executable, "-m", "edged", "fleet", "keygen", str(key)], check=False,
                          capture_output=True, text=True)  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert key.stat().st_mode & 0o777 == 0o600
    public = made.stdout.split('public_keys: ["')[1].split('"')[0]
    again = subprocess.run([sys.executable, "-m", "edged", "fleet", "keygen", str(key)], check=False,
                           capture_output=True, text=True)  # fmt: skip
    assert again.returncode == 1
    assert "not overwriting a key" in again.stderr
    rig.public, rig.key = public, key
    _, cfg, _ = control_daemon(rig)
    dev = cfg["device_id"]
    sent = subprocess.run([sys.executable, "-m", "edged", "fleet", "send", "status", "--device", dev, "--key", str(key),
                           "--host", rig.broker.host, "--port", str(rig.broker.port)],
                          check=False, capture_output=True, text=True)  # fmt: skip
    assert sent.returncode == 0, sent.stderr
    assert json.loads(sent.stdout)[dev]["ok"] is True
    nobody = subprocess.run([sys.executable, "-m", "edged", "fleet", "send", "status", "--device", "nobody", "--key",
                             str(key), "--wait", "0.5", "--host", rig.broker.host, "--port", str(rig.broker.port)],
                            check=False, capture_output=True, text=True)  # fmt: skip
    assert nobody.returncode == 3  # its own code: nobody answered in time
    assert json.loads(nobody.stdout) == {}
    assert nobody.stderr.startswith("edged fleet: device nobody did not answer within 0.5 s (is it online")
    # signed with a key the device does not trust: it answers at once, on its public replies topic and without the
    # id it could not verify; fleet send matches the answer by the hash of what it sent, and exits 1 with the reason
    stranger = rig.tmp_path / "stranger.key"
    assert subprocess.run([sys.executable, "-m", "edged", "fleet", "keygen", str(stranger)], check=False,
                          capture_output=True).returncode == 0  # fmt: skip
    refused = subprocess.run([sys.executable, "-m", "edged", "fleet", "send", "status", "--device", dev, "--key",
                              str(stranger), "--wait", "60", "--host", rig.broker.host, "--port", str(rig.broker.port)],
                             check=False, capture_output=True, text=True)  # fmt: skip
    assert refused.returncode == 1, refused.stderr
    answer = json.loads(refused.stdout)[dev]
    assert answer["ok"] is False
    assert answer["reason"] == "bad_signature"
    assert answer["id"] is None  # it could not echo what it did not trust
    assert refused.stderr.startswith(f"edged fleet: device {dev}: bad_signature: ")
