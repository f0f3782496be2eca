"""The attacks of the issue "Hostile bytes at every boundary", replayed against real daemons through a real
Mosquitto as any client on the broker would send them: each is refused with a reason, and afterwards a signed
command is still answered, results still flow and no buffered result is lost. (The ingest's side is in
tests/test_ingest.py; the parsers' properties in tests/test_fuzz_boundaries.py.)"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from conftest import Rig, StartDaemon, ask, base_config, control_daemon, make_video, wait_for, write_config
from hostile_bytes import CORPUS
from paho.mqtt.enums import CallbackAPIVersion

from edged.control.envelope import command_topic, new_command
from edged.core.signing import load_private_key, sign

pytestmark = pytest.mark.integration


def publish_raw(rig: Rig, topic: str, payloads: list[bytes]) -> None:
    """As a stranger on the broker would: no key, any bytes."""
    client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id=f"stranger-{os.getpid()}")
    client.connect(rig.broker.host, rig.broker.port)
    client.loop_start()
    try:
        for payload in payloads:
            client.publish(topic, payload, qos=1).wait_for_publish(10)
    finally:
        client.loop_stop()
        client.disconnect()


def test_hostile_commands_are_refused_and_remote_control_still_answers(rig: Rig) -> None:
    daemon, cfg, _ = control_daemon(rig)
    dev = cfg["device_id"]
    key = load_private_key(rig.key)
    nan = json.dumps(sign({**new_command("status", dev), "ts": float("nan")}, key)).encode()
    junk = [CORPUS["60 kB of ["], CORPUS["60 kB of {"], CORPUS["int of 5000 digits"], CORPUS["NUL in a key"], nan]
    # over the 2 MiB that CONNECT announced: the broker drops it instead of making the device read it whole
    publish_raw(rig, command_topic("status", dev), [*junk, b"{" + b" " * (3 << 20)])

    def refused() -> int:
        control = (daemon.status() or {}).get("control", {})
        return sum(control.get("refused", {}).values())

    wait_for(lambda: refused() >= len(junk), 30, "every hostile command refused")
    snap = daemon.status() or {}
    assert snap["control"]["refused"].get("malformed", 0) + snap["control"]["refused"].get("too_large", 0) == len(junk)
    assert not [r for r in snap["reasons"] if "edged-control" in r]  # the control thread did not die
    # aftermath: a signed command is answered at once, by the same thread; and junk on the operator's reply topic
    # (anyone on the broker may publish there too) does not silence `fleet send`'s side either
    publish_raw(rig, rig.fleet.reply_topic, [CORPUS["60 kB of ["], CORPUS["int of 5000 digits"]])
    answer = ask(rig.fleet, "status", dev, timeout=30)[dev]
    assert answer["ok"] is True
    assert snap["mqtt"]["connected"] is True


def test_a_pushed_config_that_check_config_refuses_changes_nothing(rig: Rig) -> None:
    daemon, cfg, path = control_daemon(rig)
    dev = cfg["device_id"]
    before = path.read_bytes()
    notes = rig.tmp_path / "notes.txt"
    notes.write_text("a text file, not a model\n")
    spool = Path(cfg["state_dir"]) / "spool.db"
    pushes = {
        "a text file as the model": {"pipelines": [{"name": "cam0", "model": {"path": str(notes)}}]},
        "state_dir: /etc": {"state_dir": "/etc"},
        "the spool as the status socket": {"status": {"socket": str(spool)}},
    }
    for what, patch in pushes.items():
        answer = ask(rig.fleet, "config", dev, {"config": patch})[dev]
        assert (answer["ok"], answer["reason"]) == (False, "invalid_config"), what
        assert path.read_bytes() == before, what
    replaced = {"config": {**cfg, "state_dir": "/etc"}, "replace": True}
    answer = ask(rig.fleet, "config", dev, replaced)[dev]
    assert answer["reason"] == "invalid_config"
    assert path.read_bytes() == before
    assert spool.exists()
    # aftermath: a good push is applied and the daemon still runs from the file
    good = ask(rig.fleet, "config", dev, {"config": {"log_level": "debug"}})
    assert good[dev]["ok"] is True, good
    assert (daemon.status() or {}).get("state") in ("running", "degraded")


def _rows(spool: Path) -> int:
    with sqlite3.connect(spool) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM results").fetchone()[0])


def test_a_status_socket_on_an_existing_file_is_refused_and_the_spool_kept(
    tmp_path: Path, tiny_model: Path, start_daemon: StartDaemon
) -> None:
    video = make_video(tmp_path / "v.mp4", 30)
    cfg = base_config(tmp_path, tiny_model, str(video))  # no broker: the results stay in the spool
    path = write_config(tmp_path / "edged.yaml", cfg)
    code, err = start_daemon(path).wait(120)
    assert code == 0, err
    spool = Path(cfg["state_dir"]) / "spool.db"
    buffered = _rows(spool)
    assert buffered == 30

    cfg["status"] = {"socket": str(spool)}
    bad = write_config(tmp_path / "bad.yaml", cfg)
    checked = subprocess.run([sys.executable, "-m", "edged", "check-config", str(bad)], capture_output=True,
                             text=True, check=False, timeout=120)  # fmt: skip
    assert checked.returncode == 1
    assert f"status.socket={spool}: a file is there, not a socket" in checked.stderr
    ran = subprocess.run([sys.executable, "-m", "edged", "run", "--config", str(bad)], capture_output=True,
                         text=True, check=False, timeout=120)  # fmt: skip
    assert ran.returncode == 1
    assert "a file is there, not a socket" in ran.stderr
    assert "Traceback" not in ran.stderr
    assert _rows(spool) == buffered  # nothing lost
    assert spool.stat().st_mode & 0o777 == 0o640  # and nobody else may read the results
