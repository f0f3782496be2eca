"""Every example config (deploy/*.yaml and the YAML blocks of the README and docs/) goes through `edged check-config`
and `edged run`, and the two must agree: what check-config passes, run starts (READY: the status socket
answers); what check-config refuses, run refuses with the same problem, before it opens a device.

The examples name files of the device they are for (models under /var/lib/edged, /dev/video0, a serial
port); the test points the model paths at the bundled models, the state at a temporary folder and MQTT
at a closed loopback port (results then buffer: normal). Cameras and serial ports that this machine does
not have stay as written: run must start anyway, with the pipeline reconnecting.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ASSETS, REPO, StartDaemon, free_port, wait_for
from detect_models import make_detector

from edged.core.configfile import load

pytestmark = pytest.mark.integration


def examples() -> list[tuple[str, dict[str, Any]]]:
    found = [(p.name, yaml.safe_load(p.read_text(encoding="utf-8"))) for p in sorted((REPO / "deploy").glob("*.yaml"))]
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        name = str(page.relative_to(REPO))
        blocks = re.findall(r"```yaml\n(.*?)```", page.read_text(encoding="utf-8"), re.DOTALL)
        found += [(f"{name} yaml block {i}", load(b, name)[0]) for i, b in enumerate(blocks, 1)]  # as edged reads
    return [(name, data) for name, data in found if isinstance(data, dict) and "pipelines" in data]


def on_this_machine(data: dict[str, Any], tmp: Path) -> dict[str, Any]:
    data = {**data, "state_dir": str(tmp / "state"), "status": {"socket": str(tmp / "state" / "status.sock")}}
    data["mqtt"] = {**data.get("mqtt", {}), "host": "127.0.0.1", "port": free_port()}
    for p in data["pipelines"]:
        sensor = p["source"]["type"] == "sensor"
        p["model"] = {**p["model"], "path": str(ASSETS / ("vibration.int8.onnx" if sensor else "digits.int8.onnx"))}
        if p.get("postprocess", {}).get("type") == "detect":  # a detector example runs a real detector
            p["model"]["path"] = str(make_detector(tmp / f"{p['name']}-detector.onnx", "yolov8"))
        for second in p.get("secondary", []):  # a classifier on the crops: the demo's digits model
            second["model"] = {**second["model"], "path": str(ASSETS / "digits.int8.onnx")}
        if sensor and p["source"].get("transport") == "fifo":
            p["source"]["path"] = str(tmp / f"{p['name']}.fifo")
    return data


@pytest.mark.parametrize(("name", "data"), examples(), ids=[name for name, _ in examples()])
def test_check_config_and_run_agree_on_every_example(
    name: str, data: dict[str, Any], tmp_path: Path, start_daemon: StartDaemon
) -> None:
    path = tmp_path / "edged.yaml"
    path.write_text(yaml.safe_dump(on_this_machine(data, tmp_path)), encoding="utf-8")
    checked = subprocess.run(
        [sys.executable, "-m", "edged", "check-config", str(path)], capture_output=True, text=True, check=False
    )
    daemon = start_daemon(path)
    if checked.returncode == 0:
        wait_for(lambda: daemon.status() is not None or daemon.proc.poll() is not None, 60, f"{name}: READY")
        assert daemon.status() is not None, f"{name}: check-config passed it, run did not start: {daemon.stop()[1]}"
        code, err = daemon.stop()
        assert code == 0, err
    else:  # refused by run too: the config (exit 1), or a pipeline set aside with the same reason (it runs on)
        said = checked.stderr.strip().splitlines()[0]

        def refused() -> list[str] | None:
            if daemon.proc.poll() is not None:
                return []
            aside = [r for r in (daemon.status() or {}).get("reasons", []) if "set aside" in r]
            return aside or None

        aside = wait_for(refused, 60, f"{name}: refused by run")
        if not aside:
            code, err = daemon.wait(60)
            assert code == 1, f"{name}: check-config refused it ({checked.stderr}), run did not"
            line = next(line for line in err.splitlines() if line.startswith("edged: error: "))
            why = line.removeprefix("edged: error: ").split(": ", 1)[1]  # after "pipeline NAME: "
        else:
            why = (
                aside[0]
                .split(": pipeline ", 1)[1]
                .split(": ", 1)[1]
                .removesuffix("; no earlier model ran cleanly here")
            )
            assert daemon.stop()[0] == 0
        assert said.endswith(why), f"{name}: run refused it for another reason: {why}"


def test_the_examples_are_found() -> None:
    names = [name for name, _ in examples()]
    assert {"edged.pi.yaml", "edged.jetson.yaml", "edged.sensor.yaml", "edged.pi-libcamera.yaml"} <= set(names)
    assert any(name.startswith("README.md") for name in names)
    assert any(name.startswith("docs/configuration.md") for name in names)


@pytest.mark.parametrize("path", sorted((REPO / "deploy").glob("*.yaml")), ids=lambda p: p.name)
def test_check_config_on_an_example_as_shipped_passes_or_says_what_to_install(path: Path) -> None:
    """From a fresh checkout: the examples that name the sample models where the installer puts them say so,
    and what to set instead; nothing else may be wrong with them."""
    checked = subprocess.run(
        [sys.executable, "-m", "edged", "check-config", str(path)], capture_output=True, text=True, check=False
    )
    if checked.returncode == 0:
        assert checked.stdout.startswith(f"{path}: OK")
        return
    problems = checked.stderr.strip().splitlines()
    assert problems
    for line in problems:
        assert "edged's sample models, which deploy/install.sh copies there; or set model.path: " in line, line
        assert (ASSETS / line.rsplit(": ", 1)[1].rsplit("/", 1)[1]).is_file()
