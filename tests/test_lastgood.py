"""Which model a pipeline may run at start (pipeline/lastgood.py) and a rollout's trial on disk (control/trial.py),
on their own: tries counted before a load, a probe after a crash, set aside after two, the last good model kept as
a copy; a trial left by a crash rolled back in the config file, written down. Real files, no daemon."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from edged.config import load_config
from edged.control import trial
from edged.control.trial import Trial
from edged.pipeline.lastgood import ModelGuard

SHA_A, SHA_B = "a" * 64, "b" * 64


def test_a_model_that_died_with_the_daemon_is_probed_then_set_aside(tmp_path: Path) -> None:
    guard = ModelGuard(tmp_path)
    assert guard.decide("cam0", SHA_B) == ("load", 0)  # never tried: loaded in-process, no cost
    guard.trying("cam0", SHA_B)  # on disk before the load; then the process died
    again = ModelGuard(tmp_path)  # the next start reads it
    assert again.decide("cam0", SHA_B) == ("probe", 1)
    again.trying("cam0", SHA_B)  # the probe passed, loaded in-process, died again
    assert ModelGuard(tmp_path).decide("cam0", SHA_B) == ("set_aside", 2)
    assert ModelGuard(tmp_path).decide("cam0", SHA_A) == ("load", 0)  # another model: its own tries


def test_a_clean_stop_forgets_the_tries_of_models_that_ran_not_of_one_set_aside(tmp_path: Path) -> None:
    guard = ModelGuard(tmp_path)
    guard.trying("cam0", SHA_A)
    guard.trying("cam1", SHA_B)
    guard.stopped_cleanly({"cam0"})  # cam1 was set aside: it did not run
    after = ModelGuard(tmp_path)
    assert after.decide("cam0", SHA_A) == ("load", 0)
    assert after.decide("cam1", SHA_B) == ("probe", 1)


def test_a_model_that_ran_cleanly_is_kept_as_a_copy_and_loads_without_tries(tmp_path: Path) -> None:
    model = tmp_path / "op.onnx"
    model.write_bytes(b"model bytes")
    guard = ModelGuard(tmp_path / "state")
    guard.trying("cam0", SHA_A)
    guard.proved("cam0", model, SHA_A)
    model.write_bytes(b"the operator copied another model over it")  # a copy, not a link: the kept one stays
    good = ModelGuard(tmp_path / "state").last_good("cam0")
    assert good is not None
    assert (good.sha256, good.path.read_bytes()) == (SHA_A, b"model bytes")
    assert ModelGuard(tmp_path / "state").decide("cam0", SHA_A) == ("load", 0)
    assert good.path in guard.kept()


def test_a_trial_left_by_a_crash_is_rolled_back_in_the_config_and_written_down(tmp_path: Path) -> None:
    old, new = tmp_path / "old.onnx", tmp_path / "new.onnx"
    old.write_bytes(b"old")
    new.write_bytes(b"new")
    config = tmp_path / "edged.yaml"
    config.write_text(
        f"device_id: d  # the operator's comment stays\nstate_dir: {tmp_path / 'state'}\nmqtt:\n  enabled: false\n"
        f"pipelines:\n  - name: cam0\n    source: {{type: camera, uri: /dev/video0}}\n    model:\n      path: {new}\n",
        encoding="utf-8",
    )
    state = tmp_path / "state"
    state.mkdir()
    on_trial = Trial("cam0", SHA_B, str(new), str(old), SHA_A, "cmd-17", "reply/here", 1.0, 120.0)
    trial.begin(state, on_trial)
    assert trial.on_trial(state) == "cam0"
    recovered = trial.recover(state, config, check=load_config)
    assert recovered is not None
    assert recovered.trial.command_id == "cmd-17"
    assert recovered.answer()["reason"] == "rolled_back"
    assert yaml.safe_load(config.read_text())["pipelines"][0]["model"]["path"] == str(old)
    assert "the operator's comment stays" in config.read_text()
    assert trial.on_trial(state) is None
    (line,) = (state / "rollouts" / "history.jsonl").read_text().splitlines()
    assert json.loads(line)["outcome"] == "rolled_back"
    assert trial.recover(state, config, check=load_config) is None  # once


def test_a_torn_trial_file_is_no_trial(tmp_path: Path) -> None:
    (tmp_path / "rollout-trial.json").write_text('{"pipeline": "cam0"', encoding="utf-8")
    assert Trial.read(tmp_path) is None


def test_a_run_that_did_not_crash_is_no_evidence_against_the_models_it_loaded(tmp_path: Path) -> None:
    """A power cut or a SIGKILL in a model's first minute leaves no crash report (ops/crashlog.py): the model it
    loaded is tried afresh. A model the crash set aside keeps its tries through runs that did not load it."""
    ModelGuard(tmp_path).trying("cam0", SHA_A)  # run 1 loads A; the power goes
    assert ModelGuard(tmp_path, crashed=False).decide("cam0", SHA_A) == ("load", 0)
    ModelGuard(tmp_path).trying("cam1", SHA_B)  # a run loads B, and B crashes it
    after_crash = ModelGuard(tmp_path, crashed=True)
    assert after_crash.decide("cam1", SHA_B) == ("probe", 1)  # the probe sets it aside: no try in this run
    assert ModelGuard(tmp_path, crashed=False).decide("cam1", SHA_B) == ("probe", 1)  # still suspect
