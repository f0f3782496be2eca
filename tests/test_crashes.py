"""A model that crashes the runtime never takes the device off the fleet (pipeline/lastgood.py, control/trial.py).

The crashes are real native ones: a custom operator library whose registration writes through a null pointer,
so ONNX Runtime takes the daemon's process down with SIGSEGV while it loads the model (`model.custom_ops`); for
the crash during and after a rollout's watch, the daemon is sent SIGSEGV, as ONNX Runtime crashing on a frame
would. Each start after a crash is the one systemd makes (the same config); the aftermath is checked: the other
pipeline's results, the seqs, the status, the fleet's answer. Real daemons, real Mosquitto, real ONNX Runtime;
the C compiler builds the library (gcc is on every machine the suite runs on)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import (
    Broker,
    Rig,
    StartDaemon,
    Subscribe,
    base_config,
    control_daemon,
    make_tiny_model,
    make_video,
    wait_connected,
    wait_for,
    write_config,
)
from test_rollout import http_files, model_command, model_steps, running_sha, sha

from edged.control.envelope import new_command

pytestmark = pytest.mark.integration
__all__ = ["http_files"]  # the fixture, shared with test_rollout.py

CRASH_C = """
/* ONNX Runtime calls this to register a library's custom operators: it writes through a null pointer */
void *RegisterCustomOps(void *options, const void *api) {
    (void)options; (void)api;
    *(volatile int *)0 = 0;
    return 0;
}
"""


@pytest.fixture(scope="module")
def crash_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.fail("no C compiler (gcc): the crash tests build their custom operator library with it")
    folder = tmp_path_factory.mktemp("crash")
    (folder / "crash.c").write_text(CRASH_C, encoding="utf-8")
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(folder / "libcrash.so"), str(folder / "crash.c")],
                   check=True, capture_output=True)  # fmt: skip
    return folder / "libcrash.so"


def _two_pipelines(tmp_path: Path, broker: Broker, crash_lib: Path) -> dict[str, Any]:
    """cam0 on a working model, cam1 on a model whose custom operator library crashes ONNX Runtime."""
    model, video = make_tiny_model(tmp_path / "tiny.onnx"), make_video(tmp_path / "v.mp4", 30)
    cfg: dict[str, Any] = base_config(tmp_path, model, str(video), broker=broker, fps=20, loop=True,
                                      stop_at_end=False)  # fmt: skip
    crashing = json.loads(json.dumps(cfg["pipelines"][0]))
    crashing["name"] = "cam1"
    crashing["model"]["custom_ops"] = [str(crash_lib)]
    cfg["pipelines"].append(crashing)
    return cfg


def _reasons(daemon: Any) -> list[str]:
    return list((daemon.status() or {}).get("reasons", []))


@pytest.mark.timeout(360)  # four starts of a daemon, one crash, and child processes: past the suite's 120 s loaded
def test_a_model_that_crashes_onnx_runtime_at_start_costs_only_its_pipeline(
    tmp_path: Path, broker: Broker, subscribe: Subscribe, start_daemon: StartDaemon, crash_lib: Path
) -> None:
    """Loaded in the daemon's process, the model takes it down (SIGSEGV). systemd starts it again: the model
    died with the daemon before it ran cleanly, so it is loaded in a child process first, which dies the same
    way; the pipeline is set aside with the reason, and the rest of the daemon runs: the other pipeline's results
    flow, status is degraded and says why. A clean restart does not load it in-process again."""
    cfg = _two_pipelines(tmp_path, broker, crash_lib)
    path = write_config(tmp_path / "edged.yaml", cfg)
    dev = cfg["device_id"]
    sub = subscribe(broker, f"edged/{dev}/#")
    first = start_daemon(path)
    code, _ = first.wait(120)
    assert code == -signal.SIGSEGV  # the native crash, in the daemon's process

    second = start_daemon(path)  # as systemd would: the same config
    wait_for(lambda: any("pipeline cam1 failed: set aside" in r for r in _reasons(second)), 120, "cam1 set aside")
    (line,) = [r for r in _reasons(second) if r.startswith("pipeline cam1")]
    assert "died with the daemon before it ran cleanly, and in a child process died of SIGSEGV" in line
    assert "no earlier model ran cleanly here" in line
    wait_for(lambda: len([m for m in sub.results() if m["pipeline"] == "cam0"]) >= 20, 60, "cam0's results")
    status = second.status() or {}
    assert status["state"] == "degraded"
    assert status["mqtt"]["connected"] is True
    seqs = [m["seq"] for m in sub.results() if m["pipeline"] == "cam0"]
    assert len(seqs) == len(set(seqs))  # every seq once
    code, err = second.stop()
    assert code == 0, err[-2000:]  # a pipeline set aside is no reason for systemd to try again

    third = start_daemon(path)  # a clean restart: cam1 is not loaded in-process again (it would crash)
    wait_for(lambda: any("pipeline cam1 failed: set aside" in r for r in _reasons(third)), 120, "cam1 set aside")
    top = max(seqs)
    wait_for(lambda: max(m["seq"] for m in sub.results() if m["pipeline"] == "cam0") > top + 10, 60, "more results")
    assert third.proc.poll() is None
    code, err = third.stop()
    assert code == 0, err[-2000:]


@pytest.mark.timeout(360)  # five starts of a daemon, one crash, a probe
def test_a_pipeline_whose_model_cannot_run_falls_back_to_its_last_good_model(
    tmp_path: Path, broker: Broker, subscribe: Subscribe, start_daemon: StartDaemon, crash_lib: Path
) -> None:
    """A model that ran cleanly is kept as the pipeline's last good one. The operator then points the pipeline at
    a file ONNX Runtime cannot load, and later at one that crashes it: each time the pipeline starts on its last
    good model, its results say which model made them, and status says why."""
    model, video = make_tiny_model(tmp_path / "tiny.onnx"), make_video(tmp_path / "v.mp4", 30)
    cfg: dict[str, Any] = base_config(tmp_path, model, str(video), broker=broker, fps=20, loop=True,
                                      stop_at_end=False)  # fmt: skip
    cfg["pipelines"][0]["model"]["proven_after_s"] = 1
    path = write_config(tmp_path / "edged.yaml", cfg)
    good = sha(model)
    daemon = start_daemon(path)
    last_good = Path(cfg["state_dir"]) / "models" / "last-good.json"
    wait_for(lambda: last_good.exists() and json.loads(last_good.read_text())["cam0"]["sha256"] == good, 60,
             "the model recorded as the pipeline's last good one")  # fmt: skip
    assert daemon.stop()[0] == 0

    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"this is not an ONNX model")
    model.unlink()  # the operator's file is gone too: the kept copy is what runs
    cfg["pipelines"][0]["model"]["path"] = str(broken)
    write_config(path, cfg)
    sub = subscribe(broker, f"edged/{cfg['device_id']}/#")
    daemon = start_daemon(path)
    wait_for(lambda: any("runs its last good model" in r for r in _reasons(daemon)), 60, "the fallback named")
    assert f"({good[:12]}): its model cannot be loaded" in " ".join(_reasons(daemon))
    wait_for(lambda: len(sub.results()) >= 10, 60, "results from the last good model")
    assert {m["model"]["sha256"] for m in sub.results()} == {good}
    assert daemon.stop()[0] == 0

    cfg["pipelines"][0]["model"] |= {"path": str(make_tiny_model(tmp_path / "other.onnx", gain=3.0)),
                                     "custom_ops": [str(crash_lib)]}  # fmt: skip
    write_config(path, cfg)
    assert start_daemon(path).wait(120)[0] == -signal.SIGSEGV
    daemon = start_daemon(path)
    wait_for(lambda: any("runs its last good model" in r for r in _reasons(daemon)), 120, "the fallback named")
    assert "in a child process died of SIGSEGV" in " ".join(_reasons(daemon))
    assert running_sha(daemon) == good
    assert daemon.stop()[0] == 0


def _rollout(rig: Rig, files: dict[str, bytes], base: str, watch_s: float) -> tuple[dict[str, Any], Path]:
    good = make_tiny_model(rig.tmp_path / "good.onnx", gain=11.0)
    files["/good.onnx"] = good.read_bytes()
    return model_command(rig, good, f"{base}/good.onnx", watch_s=watch_s), good


@pytest.mark.timeout(360)  # two rollouts, a crash and a restart
def test_a_crash_during_a_rollout_s_watch_rolls_back_at_the_next_start_and_tells_the_fleet(
    rig: Rig, http_files: tuple[str, dict[str, bytes]], subscribe: Subscribe
) -> None:
    """The daemon dies of SIGSEGV while the new model is on trial. Before, the next start ran the unproven
    model, nothing was rolled back or reported, and `edged fleet rollout` ended with "no answer". Now the trial
    on disk is rolled back before the pipelines load, the rollout's command gets its answer (rolled_back, with
    why), the event and the count say so, and the history keeps the record."""
    base, files = http_files
    daemon, cfg, path = control_daemon(rig)
    dev = cfg["device_id"]
    events = subscribe(rig.broker, f"edged/{dev}/events")
    before_sha = running_sha(daemon)
    before_path = yaml.safe_load(path.read_text())["pipelines"][0]["model"]["path"]
    args, good = _rollout(rig, files, base, watch_s=300.0)
    command = new_command("model", dev, args)
    replies = rig.fleet.send(command)
    wait_for(lambda: model_steps(events, dev, until="model_swapped"), 120, "the new model swapped in")
    assert running_sha(daemon) == sha(good)
    daemon.proc.send_signal(signal.SIGSEGV)  # as ONNX Runtime crashing on a frame would
    assert daemon.wait(60)[0] == -signal.SIGSEGV
    assert yaml.safe_load(path.read_text())["pipelines"][0]["model"]["path"] != before_path  # it names the new one

    again = rig.start_daemon(path)  # systemd's restart
    wait_connected(again)
    answer = rig.fleet.wait(replies, expect=1, timeout=60)[dev]
    assert (answer["ok"], answer["reason"]) == (False, "rolled_back"), answer
    assert "without a clean stop" in answer["detail"]
    assert running_sha(again) == before_sha
    assert yaml.safe_load(path.read_text())["pipelines"][0]["model"]["path"] == before_path
    assert (again.status() or {})["control"]["rollouts"]["rolled_back"] == 1
    rolled = [json.loads(p) for p, _ in events.payloads(f"edged/{dev}/events")]
    assert any(e.get("event") == "model_rolled_back" and e.get("at_start") for e in rolled)
    history = (Path(cfg["state_dir"]) / "rollouts" / "history.jsonl").read_text().splitlines()
    assert json.loads(history[-1])["outcome"] == "rolled_back"
    assert not (Path(cfg["state_dir"]) / "rollout-trial.json").exists()
    # aftermath: results flow from the previous model, and a rollout that holds is kept
    frames = (again.status() or {})["pipelines"][0]["frames"]
    wait_for(lambda: (again.status() or {})["pipelines"][0]["frames"] > frames + 5, 30, "frames after the restart")
    kept, _ = _rollout(rig, files, base, watch_s=2.0)
    assert rig.fleet.wait(rig.fleet.send(new_command("model", dev, kept)), expect=1, timeout=120)[dev]["ok"] is True


@pytest.mark.timeout(360)
def test_a_crash_after_the_watch_kept_the_model_keeps_it(rig: Rig, http_files: tuple[str, dict[str, bytes]]) -> None:
    """Once the watch kept the model, it is the pipeline's last good one: a crash afterwards is no rollback."""
    base, files = http_files
    daemon, cfg, path = control_daemon(rig)
    dev = cfg["device_id"]
    args, good = _rollout(rig, files, base, watch_s=2.0)
    answer = rig.fleet.wait(rig.fleet.send(new_command("model", dev, args)), expect=1, timeout=120)[dev]
    assert answer["ok"] is True, answer
    daemon.proc.send_signal(signal.SIGSEGV)
    assert daemon.wait(60)[0] == -signal.SIGSEGV
    again = rig.start_daemon(path)
    wait_connected(again)
    assert running_sha(again) == sha(good)
    assert (again.status() or {})["control"]["rollouts"]["rolled_back"] == 0
    last_good = json.loads((Path(cfg["state_dir"]) / "models" / "last-good.json").read_text())
    assert last_good["cam0"]["sha256"] == sha(good)
    assert not any(r.startswith("pipeline cam0") for r in _reasons(again))
