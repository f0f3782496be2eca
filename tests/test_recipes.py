"""`edged quantize` picks its recipe by measuring: every candidate is quantized with real ONNX Runtime and
judged against the fp32 outputs on held-out frames (real); only the timing is injected here, because a
test checks behaviour, never wall-clock time (benchmarks/quantize.py measures the real speed-ups)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx
import pytest
from tools_models import make_conv_model, make_frames

from edged.tools import recipes
from edged.tools.quantize import Int8SlowerError, QuantizeOptions, quantize_model

pytestmark = pytest.mark.integration  # quantizes a model with every candidate recipe


@pytest.fixture(scope="module")
def model_and_frames(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    work = tmp_path_factory.mktemp("recipes")
    return make_conv_model(work / "conv.fp32.onnx"), make_frames(work / "calib.npz", 40, seed=3)


def fake_times(by_recipe: dict[str, float], fp32_ms: float) -> Callable[..., list[float]]:
    """Stands in for the stopwatch: fp32 first, then each candidate by its file name (the recipe)."""

    def times(paths: list[Path], _name: str, _x: Any, _tick: Any = None) -> list[float]:
        return [fp32_ms] + [by_recipe.get(p.stem, 5.0) for p in paths[1:]]

    return times


def quantization_of(path: Path) -> dict[str, Any]:
    props = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    return dict(json.loads(props["edged.quantization"]))


def test_the_fastest_candidate_that_keeps_the_answers_is_chosen_and_recorded(
    model_and_frames: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fp32, calib = model_and_frames
    monkeypatch.setattr(recipes, "time_models", fake_times({"u8s8": 2.0, "u8s8-per-tensor": 2.5}, fp32_ms=4.0))
    out = tmp_path / "q.onnx"
    report = quantize_model(fp32, out, QuantizeOptions(calib=calib, progress=False, target="cpu"))
    search = report["search"]
    assert [row["recipe"] for row in search["table"]] == list(recipes.CANDIDATES["cpu"])
    assert all(row["passed"] for row in search["table"])  # the tiny conv model quantizes well every way
    assert search["chosen"] == "u8s8"
    assert search["speedup"] == 2.0
    recorded = quantization_of(out)
    assert recorded["recipe"] == "u8s8"
    assert recorded["activation_type"] == "uint8"
    assert recorded["search"]["fp32_ms"] == 4.0
    assert len(recorded["search"]["candidates"]) == len(recipes.CANDIDATES["cpu"])


def test_a_faster_candidate_that_changes_the_answers_is_not_chosen(
    model_and_frames: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fp32, calib = model_and_frames
    monkeypatch.setattr(recipes, "time_models", fake_times({"u8s8": 1.0, "s8-sym": 2.0}, fp32_ms=4.0))
    real_judge = __import__("edged.tools.quantize", fromlist=["judge"]).judge
    calls = {"n": 0}

    def judge_failing_the_second(*args: Any) -> dict[str, Any]:  # the u8s8 candidate (second) drifts
        calls["n"] += 1
        verdict = dict(real_judge(*args))
        if calls["n"] == 2:
            verdict["passed"] = False
            verdict["checks"] = [{**c, "passed": False} for c in verdict["checks"]]
        return verdict

    monkeypatch.setattr("edged.tools.quantize.judge", judge_failing_the_second)
    report = quantize_model(fp32, tmp_path / "q.onnx", QuantizeOptions(calib=calib, progress=False, target="cpu"))
    rows = {row["recipe"]: row for row in report["search"]["table"]}
    assert rows["u8s8"]["passed"] is False
    assert report["search"]["chosen"] == "s8-sym"


def test_when_int8_cannot_win_here_quantize_says_so_writes_nothing_and_exits_3(
    model_and_frames: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fp32, calib = model_and_frames
    monkeypatch.setattr(recipes, "time_models", fake_times({}, fp32_ms=1.0))  # every int8 candidate: 5 ms
    out = tmp_path / "q.onnx"
    with pytest.raises(Int8SlowerError, match="int8 is slower than fp32 on this machine") as caught:
        quantize_model(fp32, out, QuantizeOptions(calib=calib, progress=False, target="tensorrt"))
    assert caught.value.search["chosen"] == "s8-sym"  # the best it found is named
    assert not out.exists()
    # --accept-slower writes that best one, and says in its metadata how it measured
    report = quantize_model(
        fp32, out, QuantizeOptions(calib=calib, progress=False, target="tensorrt", accept_slower=True)
    )
    assert out.exists()
    assert report["search"]["speedup"] == 0.2
    assert quantization_of(out)["recipe"] == "s8-sym"


def test_the_cli_exit_status_for_slower_int8_and_a_fixed_recipe_skips_the_search(
    model_and_frames: tuple[Path, Path], tmp_path: Path
) -> None:
    fp32, calib = model_and_frames
    out = tmp_path / "fixed.onnx"
    proc = subprocess.run(
        [sys.executable, "-m", "edged", "quantize", str(fp32), "-o", str(out), "--calib", str(calib),
         "--recipe", "u8s8-heavy-ops", "--labels", "cat, dog", "--json"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["search"] is None
    assert report["quantization"]["recipe"] == "u8s8-heavy-ops"
    assert report["quantization"]["op_types"] == list(recipes.HEAVY_OPS)
    props = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
    assert json.loads(props["edged.labels"]) == ["cat", "dog"]  # --labels writes them
    legacy = subprocess.run(
        [sys.executable, "-m", "edged", "quantize", str(fp32), "-o", str(tmp_path / "l.onnx"), "--calib", str(calib),
         "--activation-type", "uint8", "--json"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert legacy.returncode == 0, legacy.stderr
    assert json.loads(legacy.stdout)["search"] is None  # today's flags: a fixed recipe, as before


def test_targets_and_recipes_are_named() -> None:
    assert recipes.resolve_target("cpu") == "cpu"
    assert all(r.symmetric_activations and r.activation_type == "int8" for r in recipes.candidates("tensorrt"))
    with pytest.raises(Exception, match="unknown recipe 'nope'"):
        recipes.recipe("nope")
