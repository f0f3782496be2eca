"""The remote `config` command's last guard: a file that passed check-config but does not reload is put back,
and the answer says so. The controller, the gate, the merge and the file writes are real; the daemon behind
them is a stand-in whose first reload fails (a real daemon's reload fails only on what check-config cannot
see, such as a device that vanished between the check and the reload: not something a test can arrange)."""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

import yaml
from conftest import make_tiny_model, wait_for
from control_stubs import Outbox

from edged.control.controller import Controller
from edged.control.envelope import command_topic, new_command
from edged.control.remoteconfig import merged_text
from edged.control.settings import ControlConfig
from edged.core.signing import generate_key, load_private_key, sign
from edged.ops.checkconfig import check_config

BASE = """\
device_id: dev1
state_dir: state
log_level: info   # the operator's comment stays
pipelines:
  - name: cam0
    source: {{type: camera, uri: /dev/video9}}
    model: {{path: {model}}}
"""


class Daemon:
    """Stands in for the daemon: its reloads read the file and fail while `failing` is set."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.failing = 1
        self.reloaded: list[bytes] = []

    def snapshot(self) -> dict[str, Any]:
        return {"state": "running", "pipelines": []}

    def config_file(self) -> Path:
        return self.path

    def check_config(self, path: Path) -> object:
        return check_config(path, as_daemon=True)

    def reload_and_wait(self, timeout: float) -> dict[str, Any]:
        self.reloaded.append(self.path.read_bytes())
        if self.failing:
            self.failing -= 1
            return {"result": "failed", "notes": ["applying: the camera went away"]}
        return {"result": "applied", "notes": []}

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"not asked of the daemon by a config command: {name}")


def test_a_written_config_that_does_not_reload_is_put_back_and_the_answer_says_so(tmp_path: Path) -> None:
    path = tmp_path / "edged.yaml"
    path.write_text(BASE.format(model=make_tiny_model(tmp_path / "m.onnx")), encoding="utf-8")
    before = path.read_bytes()
    public = generate_key(tmp_path / "k")
    key = load_private_key(tmp_path / "k")
    daemon, out = Daemon(path), Outbox()
    controller = Controller(ControlConfig.model_validate({"public_keys": [public]}), "dev1", tmp_path,
                            target=daemon, side=out)  # fmt: skip
    controller.start()
    try:
        change = {"config": {"log_level": "debug"}}
        controller.deliver(command_topic("config", "dev1"), json.dumps(sign(new_command("config", "dev1", change), key))
                           .encode(), None, None)  # fmt: skip
        answer = wait_for(out.answers, 30, "the answer")[0]
        assert (answer["ok"], answer["reason"]) == (False, "rolled_back"), answer
        assert "the camera went away" in answer["detail"]
        assert answer["report"]["after_rollback"]["result"] == "applied"
        assert b"log_level: debug" in daemon.reloaded[0]  # the new file was what failed to reload
        assert path.read_bytes() == before  # the operator's file is back, comment and all
        assert daemon.reloaded[1] == before  # and the daemon reloaded it
        # aftermath: the next push that reloads is kept
        again = {"config": {"log_level": "warning"}}
        controller.deliver(command_topic("config", "dev1"), json.dumps(sign(new_command("config", "dev1", again), key))
                           .encode(), None, None)  # fmt: skip
        wait_for(lambda: len(out.answers()) == 2, 30, "the second answer")
        assert out.answers()[1]["ok"] is True
        assert "log_level: warning" in path.read_text()
        assert "# the operator's comment stays" in path.read_text()
    finally:
        controller.stop(5.0)
    assert not controller.is_alive()


def _changed(before: str, after: str) -> list[str]:
    """The lines a merge removed (-) or added (+)."""
    diff = difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
    return [line for line in diff if not line.startswith(("---", "+++", "@@"))]


def test_a_merge_keeps_every_shipped_configs_indentation_comments_and_quotes() -> None:
    """A merge edits the file in place: only the merged keys' lines change, on every shipped config (2-space block
    mappings with `  - name` lists), and on a 4-space file with quoted values (quotes kept)."""
    root = Path(__file__).resolve().parent.parent / "deploy"
    shipped = sorted(root.glob("*.yaml"))
    assert len(shipped) >= 4
    for path in shipped:
        text = path.read_text(encoding="utf-8")
        name = yaml.safe_load(text)["pipelines"][0]["name"]
        after = merged_text(text, {"log_level": "debug", "pipelines": [{"name": name, "model": {"warmup_runs": 3}}]})
        changed = _changed(text, after)
        assert "+log_level: debug" in changed, (path.name, changed)
        # nothing re-indented: the lines that change are the merged keys' (a flow mapping `model: {...}` is
        # rewritten whole, in its own style, with the new key in it)
        assert all("log_level" in c or "warmup_runs" in c or c.lstrip("-+ ").startswith("model:") for c in changed), (
            path.name,
            changed,
        )
        assert len(changed) <= 4, (path.name, changed)
    quoted = (
        'device_id: "pi-01"\nmqtt:\n    host: \'broker.local\'\n    protocol: "3.1.1"   # RabbitMQ 3.10\n'
        'pipelines:\n-   name: "cam0"\n    source: {type: camera, uri: "/dev/video0"}\n'
    )
    after = merged_text(quoted, {"mqtt": {"port": 8883}})
    assert _changed(quoted, after) == ["+    port: 8883"]
