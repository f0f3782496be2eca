"""Labels inline in the config or from a file (one label per line), checked against the model's classes
by check-config; the bundled digits model has ten."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import ASSETS, write_config

from edged.core.errors import ConfigError
from edged.model.postprocess import load_labels
from edged.ops.checkconfig import check_config


def config(tmp_path: Path, labels: Any) -> Path:
    return write_config(
        tmp_path / "edged.yaml",
        {
            "state_dir": str(tmp_path / "state"),
            "pipelines": [
                {
                    "name": "digits",
                    "source": {"type": "camera", "uri": "/dev/video0"},
                    "model": {"path": str(ASSETS / "digits.int8.onnx"), "providers": ["CPUExecutionProvider"]},
                    "postprocess": {"type": "classify", "labels": labels},
                }
            ],
        },
    )


def test_inline_labels_are_taken_and_checked_against_the_classes(tmp_path: Path) -> None:
    names = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    cfg = check_config(config(tmp_path, names))
    assert load_labels(getattr(cfg.pipelines[0].postprocess, "labels", None), {}) == names
    with pytest.raises(ConfigError) as caught:
        check_config(config(tmp_path, ["0", "180"]))
    (problem,) = caught.value.problems
    assert 'pipelines[0].postprocess={"type": "classify", "labels": ["0", "180"]}' in problem
    assert "2 labels for a model with 10 classes" in problem


def test_a_labels_file_has_one_label_per_line_and_blank_lines_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "labels.txt"
    path.write_text("cat\n\ndog\n  bird  \n", encoding="utf-8")
    assert load_labels(path, {"edged.labels": '["x"]'}) == ["cat", "dog", "bird"]
    assert load_labels(None, {"edged.labels": '["x"]'}) == ["x"]  # else the model's metadata
