"""check-config refuses what run would refuse, with `file:line key=value: message` and exit 1: hostile configs
(bounded memory, one clear line), topics no broker takes, models ONNX Runtime cannot load, pairings of a
model and a decoder that cannot work, backoff bounds in the wrong order."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import base_config, make_video, write_config
from hostile import HOSTILE, broken_models, run_cli, run_set_aside


@pytest.mark.integration
def test_backoff_bounds_in_the_wrong_order_fail_check_config_not_run(tmp_path: Path, tiny_model: Path) -> None:
    # `edged run` used to die with a ValueError traceback; check-config passed it
    cfg = base_config(tmp_path, tiny_model, "/dev/video9")
    cfg["mqtt"].update({"reconnect_min_s": 10, "reconnect_max_s": 1})
    path = write_config(tmp_path / "edged.yaml", cfg)
    res = run_cli("check-config", str(path))
    assert res.returncode == 1
    (problem,) = res.stderr.strip().splitlines()
    assert problem.startswith(f"{path}:")
    assert "mqtt" in problem
    assert "reconnect_max_s must be >= reconnect_min_s" in problem


@pytest.mark.integration
def test_a_model_run_would_refuse_fails_check_config_too_and_run_names_the_pipeline(tmp_path: Path) -> None:
    # a model with dynamic input axes and no preprocess size: check-config passed it, run refused it
    # without naming the pipeline
    from tools_models import make_conv_model

    dyn = make_conv_model(tmp_path / "dyn.onnx", dynamic=True, metadata=False)
    video = make_video(tmp_path / "v.mp4", 5)
    cfg = base_config(tmp_path, dyn, str(video))
    cfg["pipelines"][0]["name"] = "door"
    path = write_config(tmp_path / "edged.yaml", cfg)
    checked = run_cli("check-config", str(path))
    assert checked.returncode == 1, checked.stdout
    (problem,) = checked.stderr.strip().splitlines()
    assert problem.startswith(f"{path}:")
    assert "pipelines[0].preprocess=<missing>" in problem  # the key at fault, not the model file
    assert "size" in problem  # what to add: preprocess.size
    # `run` names the pipeline too; it sets the pipeline aside and runs on (an exit would be systemd's restart
    # loop: the device off the fleet), status saying why
    code, reasons, err = run_set_aside(path)
    assert code == 0, err[-2000:]
    assert any(r.startswith("pipeline door failed: set aside: its model cannot be loaded: pipeline door:")
               for r in reasons), reasons  # fmt: skip
    assert "Traceback" not in err
    cfg["pipelines"][0]["preprocess"] = {"size": [16, 16]}  # with the size both accept it
    assert run_cli("check-config", str(write_config(path, cfg))).returncode == 0


@pytest.mark.integration
def test_a_forced_yolov5_on_a_yolov8_head_fails_check_config_and_run(tmp_path: Path) -> None:
    # the head [1, 4 + nc, N] read as YOLOv5 [1, N, 5 + nc] published garbage silently (no labels to check)
    from detect_models import make_detector

    model = make_detector(tmp_path / "v8.onnx", "yolov8", labels=False)
    cfg = base_config(tmp_path, model, str(make_video(tmp_path / "v.mp4", 3, size=(64, 64))))
    cfg["pipelines"][0]["postprocess"] = {"type": "detect", "format": "yolov5"}
    path = write_config(tmp_path / "edged.yaml", cfg)
    checked = run_cli("check-config", str(path))
    assert checked.returncode == 1
    (problem,) = checked.stderr.strip().splitlines()
    assert 'pipelines[0].postprocess={"type": "detect", "format": "yolov5"}' in problem
    assert "set format: yolov8" in problem
    code, reasons, err = run_set_aside(path)
    assert code == 0, err[-2000:]
    assert any("set aside" in r and "set format: yolov8" in r for r in reasons), reasons
    cfg["pipelines"][0]["postprocess"]["format"] = "auto"  # aftermath: the same head, read right, passes
    assert run_cli("check-config", str(write_config(path, cfg))).returncode == 0


@pytest.mark.integration
@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_config_is_one_clear_line_and_bounded_memory(tmp_path: Path, name: str) -> None:
    content, line, says = HOSTILE[name]
    path = tmp_path / "edged.yaml"
    path.write_bytes(content)
    res = run_cli("check-config", str(path))
    assert res.returncode == 1, res.stderr[-2000:]
    assert "Traceback" not in res.stderr, res.stderr[-2000:]
    (problem,) = res.stderr.strip().splitlines()
    assert problem.startswith(f"{path}:{line} "), problem
    assert says in problem


@pytest.mark.parametrize(
    ("topic", "says"),
    [
        ("edged/{device_id}/#", "wildcards"),
        ("edged/+/{pipeline}", "wildcards"),
        ("$SYS/edged/{device_id}", "belong to the broker"),
        ("", "cannot be empty"),
        ("t/" + "x" * 65_500 + "/{pipeline}", "MQTT allows 65535"),
    ],
)
@pytest.mark.integration
def test_a_topic_no_broker_takes_fails_check_config(tmp_path: Path, tiny_model: Path, topic: str, says: str) -> None:
    cfg = base_config(tmp_path, tiny_model, "/dev/video9")  # a camera that is not there: check-config passes it
    cfg["mqtt"]["topic"] = topic
    path = write_config(tmp_path / "edged.yaml", cfg)
    res = run_cli("check-config", str(path))
    assert res.returncode == 1
    (problem,) = res.stderr.strip().splitlines()
    assert " mqtt.topic=" in problem
    assert says in problem


@pytest.mark.integration
def test_check_config_and_inspect_refuse_a_model_onnx_runtime_cannot_load(tmp_path: Path, tiny_model: Path) -> None:
    for name, model in broken_models(tmp_path, tiny_model).items():
        cfg = base_config(tmp_path, model, "/dev/video9")  # a camera that is not there: check-config passes it
        path = write_config(tmp_path / "edged.yaml", cfg)
        res = run_cli("check-config", str(path))
        assert res.returncode == 1, f"{name}: {res.stdout}"
        (problem,) = res.stderr.strip().splitlines()
        assert f"pipelines[0].model.path={model}: ONNX Runtime cannot load it" in problem, name
        assert problem.startswith(f"{path}:"), problem
        inspected = run_cli("inspect", str(model))
        assert inspected.returncode == 1, f"{name}: {inspected.stdout}"
        assert "Traceback" not in inspected.stderr
    good = base_config(tmp_path, tiny_model, "/dev/video9")  # a camera that is not there: check-config passes it
    assert run_cli("check-config", str(write_config(tmp_path / "good.yaml", good))).returncode == 0  # still fine
    assert run_cli("inspect", str(tiny_model)).returncode == 0
