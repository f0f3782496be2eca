"""A third-party decoder, installed the way a package installs one (an `edged.postprocessors` entry point),
is found, configured, checked and run by edged. The plugin is docs/models.md's own example, taken from it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import base_config, write_config
from hostile import run_set_aside

REPO = Path(__file__).resolve().parent.parent
MODEL = REPO / "edged" / "assets" / "digits.int8.onnx"


def docs_plugin() -> str:
    text = (REPO / "docs" / "models.md").read_text(encoding="utf-8")
    found = re.search(
        r"<!-- plugin-example: start -->\n```python\n(.*?)```\n<!-- plugin-example: end -->", text, re.DOTALL
    )
    assert found, "docs/models.md's plugin example is missing its markers"
    return found.group(1)


def install_plugin(site: Path) -> None:
    """What `pip install` of a package declaring `alarm = "edged_alarm"` leaves on the path."""
    (site / "edged_alarm.py").write_text(docs_plugin(), encoding="utf-8")
    info = site / "edged_alarm-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: edged-alarm\nVersion: 0.1\n", encoding="utf-8")
    (info / "entry_points.txt").write_text("[edged.postprocessors]\nalarm = edged_alarm\n", encoding="utf-8")


def check_config(
    config: Path, site: Path, command: tuple[str, ...] = ("check-config",)
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run(
        [sys.executable, "-m", "edged", *command, str(config)],
        capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip


def test_the_readme_plugin_is_found_checked_and_run(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    install_plugin(site)
    data = base_config(tmp_path, MODEL, "/dev/video9")
    data["pipelines"][0]["postprocess"] = {"type": "alarm", "threshold": 0.9}
    good = check_config(write_config(tmp_path / "good.yaml", data), site)
    # check-config ran a frame through the model and the plugin's decoder (edged/pipeline/model.py dry_run)
    assert good.returncode == 0, good.stderr
    data["pipelines"][0]["postprocess"] = {"type": "alarm", "output": 3}
    bad = tmp_path / "bad.yaml"
    refused = check_config(write_config(bad, data), site)
    assert refused.returncode == 1
    assert "Traceback" not in refused.stderr
    assert f"{bad}:" in refused.stderr
    assert "alarm: no output 3" in refused.stderr
    # `run` makes the same check before it opens the camera and names the pipeline; it sets the pipeline aside
    # and runs on (status saying why), rather than exit into systemd's restart loop
    code, reasons, err = run_set_aside(bad, env={**os.environ, "PYTHONPATH": str(site)})
    assert code == 0, err[-2000:]
    (line,) = [r for r in reasons if r.startswith("pipeline cam0")]
    assert line.startswith("pipeline cam0 failed: set aside: its model cannot be loaded: pipeline cam0: ")
    assert "alarm: no output 3" in line
    assert "Traceback" not in err


def test_without_the_plugin_its_type_is_unknown(tmp_path: Path) -> None:
    data = base_config(tmp_path, MODEL, "/dev/video9")
    data["pipelines"][0]["postprocess"] = {"type": "alarm"}
    res = check_config(write_config(tmp_path / "edged.yaml", data), tmp_path)
    assert res.returncode == 1
    assert "alarm" in res.stderr
    assert "Traceback" not in res.stderr


def test_a_broken_plugin_is_named_and_skipped(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    install_plugin(site)
    (site / "edged_alarm.py").write_text("raise ImportError('needs libfoo')\n", encoding="utf-8")
    data = base_config(tmp_path, MODEL, "/dev/video9")
    data["pipelines"][0]["postprocess"] = {"type": "classify"}
    res = check_config(write_config(tmp_path / "edged.yaml", data), site)
    assert res.returncode == 0, res.stderr  # the other types still work
    assert "postprocessor plugin alarm (edged_alarm) failed to load" in res.stderr
