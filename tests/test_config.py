"""Config: strict schema, errors as `file:line key=value: message`, check-config exit codes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from edged.config import find_status_socket, load_config
from edged.control.remoteconfig import apply_remote_config
from edged.core.errors import ConfigError


def write(tmp_path: Path, body: str, model: Path) -> Path:
    path = tmp_path / "edged.yaml"
    path.write_text(textwrap.dedent(body).format(model=model), encoding="utf-8")
    return path


GOOD = """\
device_id: pi-kitchen-01
state_dir: state
pipelines:
  - name: cam0
    source: {{type: camera, uri: /dev/video0}}
    model: {{path: {model}}}
"""


def problems(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return info.value.problems


def test_minimal_config_gets_defaults(tmp_path: Path, tiny_model: Path) -> None:
    cfg = load_config(write(tmp_path, GOOD, tiny_model))
    assert cfg.state_dir == tmp_path / "state"  # relative to the config file
    assert cfg.mqtt.qos == 1
    assert cfg.pipelines[0].model.providers[-1] == "CPUExecutionProvider"
    assert cfg.pipelines[0].postprocess.type == "classify"
    assert cfg.status_socket == tmp_path / "state" / "status.sock"


def test_a_key_yaml_would_read_as_a_boolean_stays_a_word(tmp_path: Path, tiny_model: Path) -> None:
    body = GOOD + "    snapshot: {{enabled: yes, on: change}}\n"  # YAML 1.1: `on` and `yes` are true
    cfg = load_config(write(tmp_path, body, tiny_model))
    assert cfg.pipelines[0].snapshot.on == "change"
    assert cfg.pipelines[0].snapshot.enabled is True  # values keep their YAML meaning


def test_unknown_key_names_file_line_and_key_but_not_its_value(tmp_path: Path, tiny_model: Path) -> None:
    body = GOOD + "    postproces: {{type: raw}}\n"
    path = write(tmp_path, body, tiny_model)
    assert problems(path) == [
        f"{path}:7 pipelines[0].postproces=<not shown>: "
        "unknown key; check the spelling against the config reference in docs/configuration.md"
    ]
    # a secret pasted under a wrong name is not echoed (check-config output, logs, a remote config's reply)
    leaked = write(tmp_path, GOOD + "mqtt_pasword: hunter2-secret\n", tiny_model)
    assert "hunter2" not in "\n".join(problems(leaked))


def test_wrong_type(tmp_path: Path, tiny_model: Path) -> None:
    body = GOOD.replace("uri: /dev/video0}}", "uri: /dev/video0, fps: fast}}")
    path = write(tmp_path, body, tiny_model)
    assert problems(path) == [
        f"{path}:5 pipelines[0].source.fps=fast: Input should be a valid number, unable to parse string as a number"
    ]


def test_missing_model_file(tmp_path: Path, tiny_model: Path) -> None:
    path = write(tmp_path, GOOD, tmp_path / "nope.onnx")
    assert problems(path) == [
        f"{path}:6 pipelines[0].model.path={tmp_path / 'nope.onnx'}: "
        f"model file not found: {tmp_path / 'nope.onnx'}; check model.path"
    ]


def test_bad_provider_name(tmp_path: Path, tiny_model: Path) -> None:
    body = GOOD.replace("{{path: {model}}}", "{{path: {model}, providers: [CUDAProvider]}}")
    (problem,) = problems(write(tmp_path, body, tiny_model))
    assert ":6 pipelines[0].model.providers=[\"CUDAProvider\"]: unknown execution provider 'CUDAProvider'" in problem
    assert "did you mean CUDAExecutionProvider?" in problem


def test_missing_required_key_and_several_problems_at_once(tmp_path: Path, tiny_model: Path) -> None:
    body = """\
    device_id: x
    mqtt:
      qos: 2
    pipelines:
      - name: cam0
        source: {{type: camera}}
        model: {{path: {model}}}
    """
    path = write(tmp_path, body, tiny_model)
    assert problems(path) == [
        f"{path}:3 mqtt.qos=2: must be one of 0 or 1",
        f"{path}:6 pipelines[0].source.uri=<missing>: required key is missing",
    ]


def test_yaml_syntax_error_has_a_line(tmp_path: Path, tiny_model: Path) -> None:
    path = write(tmp_path, GOOD + "  - name: [unclosed\n", tiny_model)
    (problem,) = problems(path)
    assert problem.startswith((f"{path}:8 yaml:", f"{path}:9 yaml:"))


def test_duplicate_pipeline_names(tmp_path: Path, tiny_model: Path) -> None:
    body = GOOD + "  - name: cam0\n    source: {{type: camera, uri: 1}}\n    model: {{path: {model}}}\n"
    (problem,) = problems(write(tmp_path, body, tiny_model))
    assert "pipeline name 'cam0' is used twice" in problem


def test_world_writable_status_socket_is_refused(tmp_path: Path, tiny_model: Path) -> None:
    body = GOOD + "status: {{mode: 0o666}}\n"
    (problem,) = problems(write(tmp_path, body, tiny_model))
    assert "must not be world-writable" in problem


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edged", *args], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.integration
def test_check_config_cli_exit_codes(tmp_path: Path, tiny_model: Path) -> None:
    good = write(tmp_path, GOOD, tiny_model)
    ok = run_cli("check-config", str(good))
    assert ok.returncode == 0, ok.stderr
    assert "OK (1 pipeline(s)" in ok.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.format(model=tiny_model).replace("device_id", "devce_id"), encoding="utf-8")
    res = run_cli("check-config", str(bad))
    assert res.returncode == 1
    assert f"{bad}:1 devce_id=<not shown>: unknown key" in res.stderr


@pytest.mark.integration
def test_run_refuses_invalid_config_with_the_same_message(tmp_path: Path, tiny_model: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.format(model=tiny_model).replace("device_id", "devce_id"), encoding="utf-8")
    check = run_cli("check-config", str(bad))
    run = run_cli("run", "--config", str(bad))
    assert run.returncode == 1
    assert run.stderr.strip() == check.stderr.strip()


def test_the_status_socket_is_found_in_a_config_that_does_not_load(tmp_path: Path) -> None:
    path = tmp_path / "edged.yaml"
    path.write_text("state_dir: state\npipelines: [oops]\n", encoding="utf-8")
    socket_path, note = find_status_socket(path)
    assert socket_path == tmp_path / "state" / "status.sock"
    assert note is not None
    assert "pipelines" in note
    path.write_text("status: {socket: /run/edged/s.sock}\nstate_dir: [not, a, path]\n", encoding="utf-8")
    assert find_status_socket(path)[0] == Path("/run/edged/s.sock")
    path.write_text("{{{ not yaml", encoding="utf-8")  # nothing usable: the packaged default
    assert find_status_socket(path)[0] == Path("/var/lib/edged/status.sock")


def test_a_remote_config_change_keeps_the_operators_comments_and_layout(tmp_path: Path, tiny_model: Path) -> None:
    body = """\
    # kitchen Pi: the operator's notes stay
    device_id: pi-kitchen-01
    state_dir: state      # relative to this file
    log_level: info
    pipelines:
      - name: cam0
        source: {{type: camera, uri: /dev/video0, fps: 5}}   # the USB camera
        model: {{path: {model}}}
    """
    path = write(tmp_path, body, tiny_model)
    before = path.read_text(encoding="utf-8")
    apply_remote_config(path, {"log_level": "debug", "pipelines": [{"name": "cam0", "source": {"fps": 10}}]},
                        replace=False, check=load_config)  # fmt: skip
    after = path.read_text(encoding="utf-8")
    # only the two values changed; the comment after the longer one keeps its column
    assert after == before.replace("log_level: info", "log_level: debug").replace("fps: 5}   #", "fps: 10}  #")
    assert load_config(path).pipelines[0].source.model_dump()["fps"] == 10
    assert path.with_name("edged.yaml.prev").read_text(encoding="utf-8") == before


@pytest.mark.parametrize(
    ("uri", "refused"),
    [
        ("cam.avi", True),
        ("/dev/video7", False),
        ("/dev/v4l/by-id/usb-cam-index0", False),
        ("rtsp://cam.local/s", False),
    ],
)
def test_a_missing_video_file_is_refused_but_an_absent_camera_or_stream_waits(
    tmp_path: Path, tiny_model: Path, uri: str, refused: bool
) -> None:
    path = write(tmp_path, GOOD.replace("/dev/video0", uri), tiny_model)
    if not refused:
        assert load_config(path).pipelines[0].source.model_dump()["uri"] == uri
        return
    with pytest.raises(ConfigError) as err:
        load_config(path)
    (problem,) = err.value.problems
    assert problem.startswith(f"{path}:5 pipelines[0].source.uri=cam.avi: video file not found: {tmp_path}/cam.avi")


def test_a_long_value_in_an_error_keeps_its_head_and_its_file_name(tmp_path: Path, tiny_model: Path) -> None:
    """A deep path is shown whole up to SHOW_MAX characters; a longer value keeps both ends, bounded."""
    deep = tmp_path / ("d" * 60) / ("e" * 60) / "missing-model.onnx"
    (problem,) = problems(write(tmp_path, GOOD, deep))
    assert f"model.path={deep}:" in problem  # ~200 characters: whole (the xdist workers' tmp paths are deep too)
    huge = "/" + "x" * 10_000 + "/the-end.onnx"
    (problem,) = problems(write(tmp_path, GOOD, Path(huge)))
    assert "model.path=/xxx" in problem
    assert "...x" in problem
    assert "/the-end.onnx" in problem
    assert len(problem) < 1_000
