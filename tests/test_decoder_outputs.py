"""A decoder reads the output it declared, never a guess: `postprocess.output` names it, or it is the only one
that fits; a model with several that fit is refused by check-config with the key that decides. And a map whose
axes the model left dynamic is read in the layout its real shape shows (issue "No silent garbage": a face
detector's NHWC softmax [N, H, W, 2] with dynamic H and W was argmaxed over its width and published as labels
"10", "100", "254"). The models are built here with the layouts of that detector (real ONNX Runtime runs them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import third_party as tp
from conftest import base_config, make_video, write_config
from detect_models import make_detector
from inprocess import results
from onnx import TensorProto, helper, numpy_helper

import edged
from edged.config import load_config
from edged.core.errors import ConfigError, ModelError, RefusedResultError
from edged.daemon import Daemon
from edged.model.outputcheck import OutputShapes
from edged.ops.checkconfig import check_config
from edged.pipeline.frametap import save_frames
from edged.pipeline.model import prepare_model
from edged.tools.inspect import inspect_model


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def face_like_model(path: Path) -> Path:
    """NHWC input with dynamic height and width, as a TensorFlow export has it (transposes around 1x1 convs); a
    per-cell box regression `boxes` [N, H, W, 4] and a two-class softmax `faces` [N, H, W, 2] (class 1 where
    the red channel beats the green one)."""
    x = helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", "H", "W", 3])
    boxes = helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["N", "M5", "M6", 4])
    faces = helper.make_tensor_value_info("faces", TensorProto.FLOAT, ["N", "M5", "M6", 2])
    face_w = np.zeros((2, 3, 1, 1), np.float32)
    face_w[0, 1], face_w[1, 0] = 8.0, 8.0  # class 0: green, class 1: red (the input is RGB)
    box_w = np.random.default_rng(1).normal(size=(4, 3, 1, 1)).astype(np.float32)
    init = [numpy_helper.from_array(face_w, "face_w"), numpy_helper.from_array(box_w, "box_w")]
    nodes = [
        helper.make_node("Transpose", ["image"], ["nchw"], perm=[0, 3, 1, 2]),
        helper.make_node("Conv", ["nchw", "face_w"], ["face_logits"]),
        helper.make_node("Transpose", ["face_logits"], ["face_nhwc"], perm=[0, 2, 3, 1]),
        helper.make_node("Softmax", ["face_nhwc"], ["faces"], axis=-1),
        helper.make_node("Conv", ["nchw", "box_w"], ["box_nchw"]),
        helper.make_node("Transpose", ["box_nchw"], ["boxes"], perm=[0, 2, 3, 1]),
    ]
    return _save(helper.make_graph(nodes, "facelike", [x], [boxes, faces], initializer=init), path)


def heads_model(path: Path) -> Path:
    """A classifier-shaped model with three heads: [1, 4] box, [1, 10] landmarks, [1, 2] face scores."""
    x = helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 8, 8])
    outs, init, nodes = [], [], [helper.make_node("Flatten", ["image"], ["flat"])]
    rng = np.random.default_rng(0)
    for name, n in (("box", 4), ("landmarks", 10), ("score", 2)):
        outs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, n]))
        init.append(numpy_helper.from_array(rng.normal(size=(192, n)).astype(np.float32), f"w_{name}"))
        nodes.append(helper.make_node("MatMul", ["flat", f"w_{name}"], [name]))
    return _save(helper.make_graph(nodes, "heads", [x], outs, initializer=init), path)


NHWC = {"size": [64, 48], "resize": "stretch", "color": "rgb", "layout": "nhwc", "scale": 1 / 255}


def config(tmp_path: Path, model: Path, post: dict[str, Any], pre: dict[str, Any] | None = None) -> Path:
    data = base_config(tmp_path, model, "/dev/video9")
    data["pipelines"][0]["postprocess"] = post
    if pre is not None:
        data["pipelines"][0]["preprocess"] = pre
    return write_config(tmp_path / "edged.yaml", data)


def refusal(path: Path) -> str:
    with pytest.raises(ConfigError) as err:
        check_config(path)
    return "\n".join(err.value.problems)


def test_several_maps_that_fit_are_refused_until_output_names_one(tmp_path: Path) -> None:
    model = face_like_model(tmp_path / "face.onnx")
    said = refusal(config(tmp_path, model, {"type": "segment"}, NHWC))
    assert "segment could read 2 of the model's outputs (boxes, faces)" in said
    assert "postprocess.output" in said
    wrong = refusal(config(tmp_path, model, {"type": "segment", "output": "scores"}, NHWC))
    assert "postprocess.output 'scores' is not an output of the model" in wrong


def test_an_nhwc_map_with_dynamic_axes_decodes_as_its_own_argmax(tmp_path: Path) -> None:
    model = face_like_model(tmp_path / "face.onnx")
    path = config(tmp_path, model, {"type": "segment", "output": "faces", "labels": ["background", "face"]}, NHWC)
    check_config(path)
    cfg = load_config(path)
    prepared = prepare_model(cfg.pipelines[0], cfg.state_dir, cores=1)
    frame = np.zeros((48, 64, 3), np.uint8)
    frame[:, :16] = (0, 0, 255)  # BGR: the left quarter is red (a "face"), the rest black
    result = prepared.post(prepared.loaded.run(prepared.pre(frame)), prepared.pre.geometry(64, 48))  # type: ignore[union-attr]
    assert [s["label"] for s in result["segments"]] == ["face"]  # never "10", "100", "254": its width's indices
    assert result["segments"][0]["area"] == pytest.approx(0.25, abs=0.02)
    own = prepared.loaded.run(prepared.pre(frame))[1]  # the model's own answer: argmax over its last axis
    assert float(np.mean(np.argmax(own[0], axis=-1) == 1)) == pytest.approx(0.25, abs=0.02)


def test_classify_on_several_heads_is_refused_until_output_names_one(tmp_path: Path) -> None:
    model = heads_model(tmp_path / "heads.onnx")
    plain = {"size": [8, 8], "resize": "stretch"}
    said = refusal(config(tmp_path, model, {"type": "classify"}, plain))
    assert "classify could read 3 of the model's outputs (box, landmarks, score)" in said
    path = config(tmp_path, model, {"type": "classify", "output": "score", "labels": ["no face", "face"]}, plain)
    check_config(path)
    cfg = load_config(path)
    prepared = prepare_model(cfg.pipelines[0], cfg.state_dir, cores=1)
    frame = np.full((8, 8, 3), 100, np.uint8)
    result = prepared.post(prepared.loaded.run(prepared.pre(frame)))
    assert {t["label"] for t in result["top"]} == {"no face", "face"}  # two classes: the score head, not the box
    too_few = refusal(config(tmp_path, model, {"type": "classify", "output": "landmarks", "labels": ["a"]}, plain))
    assert "1 labels for a model with 10 classes" in too_few


def test_quantize_takes_an_nhwc_model_s_frame_size_from_the_pipeline(tmp_path: Path) -> None:
    """quantize --config judges with the pipeline's decoder at the pipeline's input size, NHWC as NCHW (it took
    the size from the tensor's last two axes: `segment needs a map shaped like the 3x960 input`)."""
    model = face_like_model(tmp_path / "face.onnx")
    path = config(tmp_path, model, {"type": "segment", "output": "faces"}, NHWC)
    rng = np.random.default_rng(3)
    frames = rng.integers(0, 255, size=(16, 48, 64, 3), dtype=np.uint8)
    frames[:, :, :20, 2] = 255  # red on the left: a face in every frame
    calib = save_frames(tmp_path / "calib.npz", frames)
    out = tmp_path / "face.int8.onnx"
    done = subprocess.run([sys.executable, "-m", "edged", "quantize", str(model), "-o", str(out), "--calib",
                           str(calib), "--config", str(path), "--accept-slower"],
                          capture_output=True, text=True, check=False, timeout=600)  # fmt: skip
    assert "shaped like" not in done.stderr
    assert done.returncode == 0, done.stderr[-2000:]
    assert out.exists()


def test_validate_and_bench_take_an_nhwc_model_from_the_pipeline_config(tmp_path: Path) -> None:
    model = face_like_model(tmp_path / "face.onnx")
    path = config(tmp_path, model, {"type": "segment", "output": "faces"}, NHWC)
    frames = save_frames(tmp_path / "f.npz", np.random.default_rng(3).integers(0, 255, (8, 48, 64, 3), np.uint8))
    tools = {
        "validate": ["validate", str(model), str(model), "--data", str(frames), "--config", str(path)],
        "bench": ["bench", str(model), "--config", str(path), "--runs", "10"],
    }
    said = {}
    for tool, args in tools.items():
        done = subprocess.run([sys.executable, "-m", "edged", *args], capture_output=True, text=True, check=False,
                              timeout=300)  # fmt: skip
        assert done.returncode == 0, (tool, done.stderr[-2000:])
        said[tool] = done.stdout
    assert "PASS mask IoU" in said["validate"]  # judged by the pipeline's own decode, at its NHWC input size


def test_inspect_proposes_what_fits_or_says_it_cannot_tell(tmp_path: Path) -> None:
    digits = inspect_model(Path(edged.__file__).parent / "assets" / "digits.int8.onnx")["proposal"]
    assert digits["postprocess"] == {"type": "classify"}  # one family, one output: a proposal
    assert digits["preprocess"] is None  # the model carries its preprocessing
    heads = inspect_model(heads_model(tmp_path / "heads.onnx"))["proposal"]
    assert heads["preprocess"] == {"layout": "nchw", "size": [8, 8]}
    # classify could read any of its three heads (and detect's `boxes` reading is not excluded by shapes alone):
    # never a proposal that picks one of them
    assert heads["postprocess"] in (None, {"type": "classify"})
    assert any("classify" in d and ("could each read" in d or "name one" in d) for d in heads["decide"])
    face = inspect_model(face_like_model(tmp_path / "face.onnx"))["proposal"]
    assert face["preprocess"] == {"layout": "nhwc"}  # the channels are last; the size is the user's
    assert any(d.startswith("preprocess.size: the model's height and width are dynamic") for d in face["decide"])
    assert face["postprocess"] is None
    assert any(d.startswith("cannot tell:") for d in face["decide"])
    u2net = inspect_model(tp.package_dir("rembg") / "u2netp.onnx")["proposal"]
    assert u2net["postprocess"] is None  # a one-channel map reads as a text map too: edged does not pick
    assert any("segment, text could each read these outputs" in d for d in u2net["decide"])


def test_a_box_regression_read_as_boxes_is_refused_not_published(tmp_path: Path) -> None:
    """detect on the face detector's raw outputs read its per-cell regression as corners: 29-51 boxes a frame,
    piled in the top-left corner, on frames without a face. Boxes must be boxes: refused, format auto or not."""
    model = face_like_model(tmp_path / "face.onnx")
    for post in ({"type": "detect"}, {"type": "detect", "format": "boxes"}):
        said = refusal(config(tmp_path, model, post, NHWC))
        assert "not a list of boxes [1, N, 4] (a per-cell box regression before its decode" in said
        assert "export the model with its box decoding" in said  # what to do instead


def test_a_class_beyond_the_labels_is_never_published_as_a_bare_number(tmp_path: Path) -> None:
    """A box model whose graph gives class 2 ("dog") with two labels configured: the detection is never published
    as label "2"; check-config's synthetic frame already shows it, and the model is refused."""
    model = make_detector(tmp_path / "boxes.onnx", "boxes")
    path = config(tmp_path, model, {"type": "detect", "format": "boxes", "labels": ["person", "car"]})
    assert "the model gave classes [2] beyond its 2 labels" in refusal(path)
    cfg = load_config(path)
    with pytest.raises(ModelError, match=r"classes \[2\] beyond its 2 labels"):
        prepare_model(cfg.pipelines[0], cfg.state_dir, cores=1)  # what `run` does: refused the same way
    white = np.full((64, 64, 3), 255, np.uint8)  # the detector's scene: a person, a car and two dogs
    three = config(tmp_path, model, {"type": "detect", "format": "boxes", "labels": ["person", "car", "dog"]})
    cfg = load_config(three)
    prepared = prepare_model(cfg.pipelines[0], cfg.state_dir, cores=1)
    result = prepared.post(prepared.loaded.run(prepared.pre(white)), prepared.pre.geometry(64, 64))  # type: ignore[union-attr]
    assert {d["label"] for d in result["detections"]} <= {"person", "car", "dog"}


def red_means_dog_model(path: Path) -> Path:
    """A decoded-boxes detector ([1, 1, 6]: x1, y1, x2, y2, score, class) that names class 2 on a frame whose red
    channel is full and class 0 otherwise: check-config's noise frame (red about half) passes; a red frame at run
    time gives a class beyond two labels."""
    x = helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 64, 64])
    out = helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, 1, 6])
    init = [
        numpy_helper.from_array(np.asarray([[10, 10, 30, 30, 0.9]], np.float32), "box"),
        numpy_helper.from_array(np.asarray([0], np.int64), "c0"),
        numpy_helper.from_array(np.asarray([1], np.int64), "c1"),
        numpy_helper.from_array(np.asarray([1], np.int64), "axis"),
        numpy_helper.from_array(np.asarray(0.9, np.float32), "full"),
        numpy_helper.from_array(np.asarray(2.0, np.float32), "two"),
        numpy_helper.from_array(np.asarray([1, 1, 6], np.int64), "shape"),
    ]
    nodes = [
        helper.make_node("Slice", ["image", "c0", "c1", "axis"], ["red"]),
        helper.make_node("ReduceMean", ["red"], ["mean"], axes=[2, 3], keepdims=0),  # [1, 1]
        helper.make_node("Greater", ["mean", "full"], ["is_red"]),
        helper.make_node("Cast", ["is_red"], ["flag"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["flag", "two"], ["cls"]),
        helper.make_node("Concat", ["box", "cls"], ["row"], axis=1),
        helper.make_node("Reshape", ["row", "shape"], ["output0"]),
    ]
    return _save(helper.make_graph(nodes, "reddog", [x], [out], initializer=init), path)


def test_a_result_that_does_not_fit_at_run_time_is_refused_and_the_pipeline_goes_on(tmp_path: Path) -> None:
    """Labels are a contract at run time too: a red frame's class 2 with two labels is not published as "2" (nor
    at all); it is counted, status is degraded and says why, and the frames before and after it are published
    with unbroken seqs; the pipeline ends as its file ends, not failed."""
    model = red_means_dog_model(tmp_path / "reddog.onnx")
    video = make_video(tmp_path / "v.mp4", 12)  # red, green, blue, red, ...: 4 red frames of 12
    data = base_config(tmp_path, model, str(video))
    data["pipelines"][0]["preprocess"] = {"size": [64, 64], "resize": "stretch", "color": "rgb", "scale": 1 / 255}
    data["pipelines"][0]["postprocess"] = {"type": "detect", "format": "boxes", "labels": ["person", "car"]}
    path = write_config(tmp_path / "edged.yaml", data)
    check_config(path)  # the noise frame names class 0: nothing to refuse yet
    daemon = Daemon(load_config(path))
    daemon.start()
    daemon.wait()  # the file ended
    snap = daemon.report.snapshot()
    daemon.stop()
    (p,) = snap["pipelines"]
    assert p["state"] == "ended"  # not failed: the next frames went on
    assert p["refused"] == 4
    published = results(tmp_path / "state")
    assert [m["seq"] for m in published] == list(range(1, 9))  # the 8 other frames, seqs unbroken
    labels = {d["label"] for m in published for d in m["result"]["detections"]}
    assert labels == {"person"}  # never "2"
    assert snap["state"] == "degraded"
    (line,) = [r for r in snap["reasons"] if "refused" in r]
    assert line.startswith("pipeline cam0 refused 4 result(s) in the last 60 s, not published: ")
    assert "classes [2] beyond its 2 labels" in line


def test_an_output_whose_shape_changes_under_the_decoder_is_refused() -> None:
    """The declared shapes are checked on every frame before a decoder reads them: another rank, or another size
    where the model declares a fixed one, refuses that frame's result."""
    shapes = OutputShapes(["scores", "boxes"], [[1, 10], ["N", 4]])
    shapes.check([np.zeros((1, 10)), np.zeros((7, 4))])  # a dynamic count is the model's business
    with pytest.raises(RefusedResultError, match=r"output scores is \[1, 12\] on this frame, not \[1, 10\]"):
        shapes.check([np.zeros((1, 12)), np.zeros((7, 4))])
    with pytest.raises(RefusedResultError, match=r"output boxes is \[7, 4, 1\] on this frame, not \['\?', 4\]"):
        shapes.check([np.zeros((1, 10)), np.zeros((7, 4, 1))])
    with pytest.raises(RefusedResultError, match="gave 1 outputs, not the 2"):
        shapes.check([np.zeros((1, 10))])


def test_check_config_says_what_each_decoder_reads(tmp_path: Path) -> None:
    """A decoder states what it reads (the output, the layout it decided) and check-config shows it."""
    model = face_like_model(tmp_path / "face.onnx")
    path = config(tmp_path, model, {"type": "segment", "output": "faces", "labels": ["background", "face"]}, NHWC)
    argv = [sys.executable, "-m", "edged", "check-config", str(path)]
    done = subprocess.run(argv, check=False, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].endswith("OK (1 pipeline(s), device " + load_config(path).device_id + ")")
    said = "  cam0: segment: map faces ['N', 'M5', 'M6', 2] (this frame: [1, 48, 64, 2]) read as [1, H, W, C]; 2 labels"
    assert lines[1] == said  # the layout its real shape showed, not the one its dynamic axes suggest
