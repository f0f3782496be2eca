"""`edged quantize` picks its recipe by measuring: every candidate is quantized with real ONNX Runtime and
judged against the fp32 outputs on held-out frames (real); only the timing is injected here, because a
test checks behaviour, never wall-clock time (benchmarks/quantize.py measures the real speed-ups)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from tools_models import make_conv_model, make_frames, make_outlier_model, make_yolo_model

from edged.model.postprocess import POSTPROCESSORS
from edged.tools import mixed, recipes, sensitivity
from edged.tools.quantize import Int8SlowerError, QuantizeOptions, choose, quantize_model, search_base

pytestmark = pytest.mark.integration  # quantizes a model with every candidate recipe


@pytest.fixture(scope="module")
def model_and_frames(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    work = tmp_path_factory.mktemp("recipes")
    # 64 frames: 48 calibrate, 16 are held out to judge (quantize's least held-out set)
    return make_conv_model(work / "conv.fp32.onnx"), make_frames(work / "calib.npz", 64, seed=3)


def fake_times(by_recipe: dict[str, float], fp32_ms: float) -> Callable[..., list[float]]:
    """Stands in for the stopwatch: fp32 first, then each candidate by its file name (the recipe; a recipe with
    nodes kept in float, `u8s8-float-3`, by `u8s8-float` when the dict has no entry of its own)."""

    def times(paths: list[Path], _name: str, _x: Any, _tick: Any = None) -> list[float]:
        def of(stem: str) -> float:
            derived = stem.rpartition("-")[0] if "-float-" in stem else stem
            return by_recipe.get(stem, by_recipe.get(derived, 5.0))

        return [fp32_ms] + [of(p.stem) for p in paths[1:]]

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


def test_when_the_fastest_recipe_loses_the_answers_its_noisiest_stretch_is_kept_in_float(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a tensor int8 cannot hold (one channel x1000 sets the range; the channels the convolution reads round
    # to zero): every full recipe fails, the error analysis finds the Mul -> Conv -> Relu stretch
    fp32 = make_outlier_model(tmp_path / "outlier.onnx")
    calib = make_frames(tmp_path / "calib.npz", 40, seed=3)
    monkeypatch.setattr(recipes, "time_models", fake_times({"u8s8": 1.0, "u8s8-float": 2.0}, fp32_ms=4.0))
    out = tmp_path / "q.onnx"
    report = quantize_model(fp32, out, QuantizeOptions(calib=calib, progress=False, target="cpu"))
    rows = {row["recipe"]: row for row in report["search"]["table"]}
    assert not any(rows[name]["passed"] for name in recipes.CANDIDATES["cpu"])
    derived = rows[report["search"]["chosen"]]  # derived from the fastest, which failed
    assert derived["recipe"].startswith("u8s8-float-")
    assert derived["passed"]
    assert {"Mul_0", "Conv_1"} <= set(derived["kept_in_float"])
    assert any("loses" in why for why in derived["float_for"])  # measured: where the error comes in
    assert report["search"]["speedup"] == 2.0
    recorded = quantization_of(out)
    assert recorded["recipe"] == derived["recipe"]
    assert recorded["exclude_nodes"] == derived["kept_in_float"]
    # the nodes are named in the model as quantize prepares it: the recorded recipe reproduces with the CLI
    again = tmp_path / "again.onnx"
    proc = subprocess.run(
        [sys.executable, "-m", "edged", "quantize", str(fp32), "-o", str(again), "--calib", str(calib),
         "--recipe", "u8s8", "--exclude-nodes", ",".join(recorded["exclude_nodes"]), "--json"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["quantization"]["exclude_nodes"] == recorded["exclude_nodes"]


def test_the_error_analysis_ranks_where_the_error_comes_in(tmp_path: Path) -> None:
    model = onnx.load(str(make_outlier_model(tmp_path / "outlier.onnx")))
    assert sensitivity.name_nodes(model) == 6  # nodes are left out of quantization by name
    fp32 = tmp_path / "named.onnx"
    onnx.save(model, str(fp32))
    int8 = tmp_path / "int8.onnx"
    calib = make_frames(tmp_path / "calib.npz", 12, seed=3)
    quantize_model(fp32, int8, QuantizeOptions(calib=calib, progress=False, recipe="u8s8"))
    rng = np.random.default_rng(0)
    inputs = [rng.uniform(-2, 2, (1, 3, 16, 16)).astype(np.float32) for _ in range(4)]
    errors = sensitivity.tensor_errors(fp32, int8, "image", inputs, tmp_path)
    worst = errors[0]
    assert worst.added_db > 20  # the convolution's answer is lost to the boosted channel's range
    assert {"Mul_0", "Conv_1"} <= set(worst.region)  # the stretch back to the last tensor int8 held well
    assert errors[-1].added_db < 1  # a stretch that adds no error ranks last
    assert set(sensitivity.nodes_to_float(fp32, errors)) >= {"Mul_0", "Conv_1", "GlobalAveragePool_3"}
    # a tensor per chunk (each chunk a model that outputs only its tensors) ranks them the same
    one_by_one = pytest.MonkeyPatch()
    one_by_one.setattr(sensitivity, "CHUNK_BYTES", 1)
    try:
        chunked = sensitivity.tensor_errors(fp32, int8, "image", inputs, tmp_path)
    finally:
        one_by_one.undo()
    assert [(e.tensor, round(e.sqnr_db, 6)) for e in chunked] == [(e.tensor, round(e.sqnr_db, 6)) for e in errors]


def test_a_chunk_model_drops_the_nodes_that_only_fed_other_chunks(tmp_path: Path) -> None:
    """ORT keeps a Reshape's output, laid over its input, to the end of the run when nothing reads it: the
    saved outputs of other chunks must go with their nodes, or every activation stays alive."""
    from onnxruntime.quantization import qdq_loss_debug

    fp32 = make_outlier_model(tmp_path / "outlier.onnx")
    augmented = tmp_path / "aug.onnx"
    qdq_loss_debug.modify_model_output_intermediate_tensors(str(fp32), str(augmented))
    model = onnx.load(str(augmented))
    saved = sensitivity._saved(model)  # noqa: SLF001
    trimmed = sensitivity.trimmed_to(model, saved[:1])
    assert [o.name for o in trimmed.graph.output if o.name in saved] == saved[:1]
    made = {o for n in trimmed.graph.node for o in n.output}
    assert saved[0] in made
    assert not made & set(saved[1:])  # no node left that only made another chunk's output
    assert len(trimmed.graph.node) == len(model.graph.node) - (len(saved) - 1)


def test_a_derived_recipe_or_unknown_nodes_are_refused_with_what_to_give(
    model_and_frames: tuple[Path, Path], tmp_path: Path
) -> None:
    fp32, calib = model_and_frames
    with pytest.raises(Exception, match="--recipe u8s8 --exclude-nodes"):
        recipes.recipe("u8s8-float-noisiest")
    with pytest.raises(Exception, match="does not have: Conv_99"):
        quantize_model(
            fp32,
            tmp_path / "q.onnx",
            QuantizeOptions(calib=calib, progress=False, recipe="u8s8", exclude_nodes=("Conv_99",)),
        )


def test_when_no_recipe_passes_the_table_says_how_fast_and_how_far_each_missed(
    model_and_frames: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Gates can be set; when none is met, the error carries every candidate's speed and miss."""
    from edged.tools.quantize import NoRecipePassedError
    from edged.tools.validate import Thresholds

    fp32, calib = model_and_frames
    monkeypatch.setattr(recipes, "time_models", fake_times({"u8s8": 2.0}, fp32_ms=4.0))
    impossible = Thresholds(min_top1=1.01)
    with pytest.raises(NoRecipePassedError) as err:
        quantize_model(fp32, tmp_path / "q.onnx", QuantizeOptions(calib=calib, progress=False, gates=impossible))
    table = err.value.search["table"]
    assert {row["recipe"] for row in table} >= set(recipes.CANDIDATES["cpu"])
    assert all(row["int8_ms"] is not None and not row["passed"] for row in table)
    assert all("top-1 agreement >= 1.01" in row["why"] for row in table)
    assert "the closest, " in str(err.value)  # the best found, and why nothing better was
    assert "The mixed-precision search: " in str(err.value)
    assert err.value.search["search_ended"]
    assert not (tmp_path / "q.onnx").exists()


@pytest.mark.parametrize("opset", [17, 12])
def test_a_yolo_head_that_mixes_ranges_is_kept_in_float_by_its_structure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, opset: int
) -> None:
    """A YOLO-style export (boxes in input pixels joined with sigmoid scores by one Concat): every all-int8
    recipe changes the detections; the search keeps the head's Concat in float first, and that passes. The
    opset-12 export is upgraded on the way (per-channel QDQ needs 13), and says so."""
    fp32 = make_yolo_model(tmp_path / "yolo.onnx", opset=opset)
    calib = make_frames(tmp_path / "calib.npz", 64, seed=3, size=(32, 32))
    POSTPROCESSORS.load_builtins()
    post = POSTPROCESSORS.configs["detect"](type="detect", format="yolov8", labels=["a", "b", "c"])
    times = dict.fromkeys(recipes.CANDIDATES["cpu"], 1.2) | {"u8s8": 1.0, "u8s8-float": 1.3}
    monkeypatch.setattr(recipes, "time_models", fake_times(times | {"u8s8-heavy-ops": 3.0, "s8-sym-heavy-ops": 3.0},
                                                           fp32_ms=4.0))  # fmt: skip
    out = tmp_path / "q.onnx"
    report = quantize_model(fp32, out, QuantizeOptions(calib=calib, progress=False, target="cpu", postprocess=post))
    search = report["search"]
    rows = {row["recipe"]: row for row in search["table"]}
    assert not rows["u8s8"]["passed"]  # one scale for pixels and scores
    chosen = rows[search["chosen"]]
    assert chosen["recipe"].startswith("u8s8-float-")
    assert {"Concat_9", "Reshape_10"} <= set(chosen["kept_in_float"])
    assert any("Concat_9 Concat joins probabilities" in why for why in chosen["float_for"])
    assert chosen["agreement"]["value"] >= 0.95
    assert ("upgraded the model from opset 12 to 13" in " ".join(report["notes"])) is (opset == 12)


def test_of_two_recipes_within_ten_percent_the_more_accurate_is_chosen() -> None:
    """CenterFace on the VNNI machine: 4.03x at recall 0.91 against 3.69x at 1.00; an operator takes the second."""

    def row(name: str, ms: float, value: float, passed: bool = True) -> dict[str, Any]:
        return {"recipe": name, "int8_ms": ms, "passed": passed, "agreement": {"check": "recall", "value": value}}

    fp32 = 40.0
    table = [row("per-tensor", 10.0, 0.91), row("percentile", 10.9, 1.0), row("entropy", 9.0, 0.5, passed=False)]
    assert choose(table, fp32) == 1
    assert choose([row("per-tensor", 10.0, 0.91), row("percentile", 11.5, 1.0)], fp32) == 0  # 15% slower: speed
    assert choose([row("a", 10.0, 0.96), row("b", 10.5, 0.99)], 10.8) == 0  # b would not beat fp32 by 1.05x
    assert choose([row("a", 10.0, 0.5, passed=False)], fp32) is None


def test_the_search_steps_keep_the_head_first_then_double_the_measured_stretches() -> None:
    head = [mixed.Group("concat", ("c", "r")), mixed.Group("sigmoid", ("c", "r", "s")), mixed.Group("same", ("c",))]
    measured = [mixed.Group(f"m{i}", (f"n{i}",)) for i in range(7)]
    plan = mixed.steps(head, measured, node_count=100)
    got = plan.sets
    assert not plan.capped
    assert got[:2] == [("c", "r"), ("c", "r", "s")]  # one structural group at a time; one that adds nothing skipped
    assert [len(s) - 3 for s in got[2:]] == [1, 3, 7]  # then 1, 2, 4 measured stretches more
    small = mixed.steps(head, measured, node_count=10)
    assert (len(small.sets), small.capped, small.cap) == (3, True, 5)  # at most half the graph's nodes


def test_the_search_starts_from_the_failing_recipe_that_keeps_the_most() -> None:
    """PP-PicoDet on the VNNI machine: per-tensor was fastest with 3% of the boxes, u8s8 nearly as fast with 64%."""

    def row(ms: float, value: float, passed: bool = False) -> dict[str, Any]:
        return {"int8_ms": ms, "passed": passed, "agreement": {"check": "detection recall", "value": value}}

    table = [row(12.0, 0.033), row(12.2, 0.64), row(14.0, 0.64), row(40.0, 0.9), row(11.0, 0.99, passed=True)]
    whole = [True, True, True, True, False]
    assert search_base(table, whole, fp32_ms=20.0, structural=True) == 1  # the slow one would not beat fp32
    assert search_base(table, [False, False, False, True, False], fp32_ms=20.0, structural=True) == 3
    assert search_base([row(5.0, 0.0), row(4.0, 0.0)], [True, True], fp32_ms=20.0, structural=False) == 1  # a tie


def test_after_a_step_that_doubled_the_float_nodes_passed_the_search_bisects_back() -> None:
    """Two structural groups, then measured batches of 1, 2, 4 and 8: the step of 8 passes, and 4 of them (but
    not 2) were enough: the bisection finds that set in two tries, and tries nothing smaller."""
    from edged.tools.quantize import _bisect_back

    head = [mixed.Group("concat", ("c",)), mixed.Group("sigmoid", ("s",))]
    measured = [mixed.Group(f"m{i}", (f"n{i:02d}",)) for i in range(15)]
    plan = mixed.steps(head, measured, node_count=1000)
    step = len(plan.sets) - 1  # the batch of 8
    assert len(plan.batches[step]) == 8
    needed = {f"n{i:02d}" for i in range(7 + 4)}  # what passes: the sets before and 4 of the last 8
    tried: list[int] = []

    def attempt(nodes: tuple[str, ...]) -> bool:
        tried.append(len(nodes))
        return needed <= set(nodes)

    best = _bisect_back(plan, step, attempt, deadline=time.monotonic() + 60)
    assert best is not None
    assert set(best) == needed | {"c", "s"}
    assert tried == [2 + 7 + 4, 2 + 7 + 2]  # half of the batch passes, a quarter does not: two tries
    assert plan.narrower(step, 0) == plan.sets[step - 1]
