"""Every boundary where bytes come in, fuzzed (Hypothesis, a fixed budget, derandomized) and fed the hostile
corpus (tests/hostile_bytes.py): the bounded JSON reader, the command gate, the ingest's parser, the config
loader (a YAML file and a pushed JSON config), and the status reader and view. A boundary may refuse, with its own
error and a reason; it may never raise anything else, and what it accepts is within range."""

from __future__ import annotations

import contextlib
import io
import json
import math
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import make_tiny_model
from control_stubs import Outbox
from hostile_bytes import CORPUS, FUZZ, json_values, result
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from edged.config import parse_config
from edged.control.controller import Controller
from edged.control.gate import CommandGate
from edged.control.remoteconfig import apply_remote_config
from edged.control.settings import ControlConfig
from edged.core import safejson
from edged.core.clock import MARK, ClockConfig, ClockWatch
from edged.core.errors import CommandError, ConfigError, InputError, StatusError
from edged.core.signing import generate_key, load_private_key, sign
from edged.fleet.ingestparse import (
    SEQ_MAX,
    Identity,
    RefusedError,
    parse_clock,
    parse_gap,
    parse_results,
    parse_stats,
)
from edged.fleet.replayer import Replayer
from edged.ops.checkconfig import check_config
from edged.ops.status import query
from edged.ops.statusview import build_view
from edged.store.spool import Spool
from edged.uplink.replay import ReplayRequests

DEVICE = Identity("d", "p")


# -- the bounded JSON reader --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_the_corpus_is_refused_or_read_within_bounds(name: str) -> None:
    try:
        value = safejson.loads(CORPUS[name], max_bytes=1 << 20)
    except InputError as exc:
        assert exc.reason in {"too_large", "not_utf8", "too_deep", "not_json", "not_finite", "out_of_range", "nul"}
        return
    json.dumps(value, allow_nan=False)  # what it reads is plain, finite JSON


@FUZZ
@given(st.binary(max_size=300))
def test_any_bytes_are_read_or_refused_never_raised(data: bytes) -> None:
    with contextlib.suppress(InputError):  # anything else fails the test
        safejson.loads(data, max_bytes=256)


@FUZZ
@given(json_values, st.integers(min_value=0, max_value=40))
def test_json_of_any_shape_comes_back_as_it_was_or_is_refused(value: Any, depth: int) -> None:
    text = "[" * depth + json.dumps(value) + "]" * depth
    try:
        back = safejson.loads(text, max_bytes=1 << 20, max_depth=20)
    except InputError as exc:
        assert exc.reason in {"too_deep", "not_finite", "out_of_range", "nul"}
        return
    assert safejson.nesting_depth(text.encode()) <= 20
    assert json.dumps(back, allow_nan=False) == json.dumps(json.loads(text))


def test_nesting_depth_ignores_brackets_in_strings() -> None:
    assert safejson.nesting_depth(b'{"a": "[[[[{{{{", "b": [1, [2]]}') == 3
    assert safejson.nesting_depth(b'["\\"[[[", [[]]]') == 3


# -- the command gate -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gate_and_key(tmp_path_factory: pytest.TempPathFactory) -> tuple[CommandGate, Any]:
    folder = tmp_path_factory.mktemp("gate")
    public = generate_key(folder / "k")
    cfg = ControlConfig.model_validate({"public_keys": [public]})
    return CommandGate(cfg, "dev1", folder), load_private_key(folder / "k")


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_the_gate_refuses_the_corpus_with_a_reason(gate_and_key: tuple[CommandGate, Any], name: str) -> None:
    gate, _ = gate_and_key
    with pytest.raises(CommandError) as err:
        gate.admit("edged/dev1/cmd/status", CORPUS[name])
    assert err.value.reason in {"malformed", "too_large", "unsigned", "bad_signature"}


@FUZZ
@given(st.binary(max_size=400), st.text(max_size=40))
def test_the_gate_refuses_any_bytes_on_any_topic(
    gate_and_key: tuple[CommandGate, Any], data: bytes, topic: str
) -> None:
    gate, _ = gate_and_key
    with pytest.raises(CommandError):
        gate.admit(topic, data)


@FUZZ
@given(st.dictionaries(st.sampled_from(["v", "cmd", "id", "target", "ts", "nonce", "args", "x"]), json_values))
def test_a_signed_envelope_of_any_fields_is_refused_or_admitted_whole(
    gate_and_key: tuple[CommandGate, Any], fields: dict[str, Any]
) -> None:
    gate, key = gate_and_key
    envelope = {"v": 1, "cmd": "status", "id": "x1", "target": "dev1", "ts": 1.0, "nonce": "n" * 16, **fields}
    try:
        payload = json.dumps(sign(envelope, key), allow_nan=False).encode()
    except ValueError:
        payload = json.dumps(sign(envelope, key)).encode()  # NaN and Infinity: sent as JSON's non-standard words
    try:
        command = gate.admit("edged/dev1/cmd/status", payload, now=1.0)
    except CommandError:
        return
    assert math.isfinite(float(envelope["ts"]))
    assert command.name == "status"


def test_a_signed_nan_timestamp_is_refused_not_kept_forever(gate_and_key: tuple[CommandGate, Any]) -> None:
    gate, key = gate_and_key
    envelope = {"v": 1, "cmd": "status", "id": "x2", "target": "dev1", "ts": float("nan"), "nonce": "m" * 16}
    payload = json.dumps(sign(envelope, key)).encode()  # json writes NaN; the signature is over that text
    with pytest.raises(CommandError) as err:
        gate.admit("edged/dev1/cmd/status", payload)
    assert err.value.reason == "malformed"


# -- the controller: whatever comes, it answers, and its queue never blocks paho ---------------------------


class NoTarget:
    """The daemon's side of the controller is not reached by refused commands; anything asked of it fails."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a refused command reached the daemon ({name})")


def test_a_full_command_queue_answers_busy_once_a_second_and_counts_every_refusal(tmp_path: Path) -> None:
    public = generate_key(tmp_path / "k")
    out = Outbox()
    controller = Controller(ControlConfig.model_validate({"public_keys": [public]}), "dev1", tmp_path,
                            target=NoTarget(), side=out)  # fmt: skip  # not started: its queue fills up
    for _ in range(16 + 5):
        controller.deliver("edged/dev1/cmd/status", b"[" * 100, None, None)
    busy = [r for r in out.replies() if r.get("reason") == "busy"]
    assert len(busy) == 1  # a flood gets one answer, not one each
    assert controller.snapshot()["refused"]["busy"] == 5
    controller.start()  # aftermath: the queued ones are answered (refused: not JSON commands) and it idles
    try:
        deadline = threading.Event()
        while len([r for r in out.replies() if r.get("reason") == "malformed"]) < 16 and not deadline.wait(0.05):
            pass
        assert len([r for r in out.replies() if r.get("reason") == "malformed"]) == 16
        assert controller.trouble() is None
    finally:
        controller.stop(5.0)
    assert not controller.is_alive()


# -- the ingest's parser ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_ingest_refuses_the_corpus_as_results_and_gaps_and_reads_stats_within_range(name: str) -> None:
    for parse in (lambda b: parse_results(b, DEVICE), lambda b: parse_gap(b, DEVICE)):
        with pytest.raises(RefusedError) as err:
            parse(CORPUS[name])
        assert err.value.reason
    try:  # a stats message needs only its device: some of the corpus is one
        stats = parse_stats(CORPUS[name], DEVICE, 1.0)
    except RefusedError as exc:
        assert exc.reason
    else:
        assert stats.device == "d"
        assert math.isfinite(stats.ts)


@FUZZ
@given(st.binary(max_size=300))
def test_ingest_refuses_any_bytes_with_a_reason(data: bytes) -> None:
    for parse in (lambda b: parse_results(b, DEVICE), lambda b: parse_gap(b, DEVICE)):
        try:
            parse(data)
        except RefusedError as exc:
            assert exc.reason


@FUZZ
@given(st.dictionaries(st.sampled_from(["device", "pipeline", "seq", "ts", "stream", "result"]), json_values),
       st.sampled_from(["d", "p", "other"]))  # fmt: skip
def test_what_ingest_accepts_is_in_range_and_from_the_topic_s_device(fields: dict[str, Any], device: str) -> None:
    payload = json.dumps({"device": "d", "pipeline": "p", "seq": 1, "ts": 1.0, **fields}).encode()
    try:
        rows = parse_results(payload, Identity(device, "p"))
    except RefusedError:
        return
    for row in rows:
        assert row.device == device  # identity: the topic's, or refused
        assert 1 <= row.seq <= SEQ_MAX
        assert math.isfinite(row.ts)
        assert row.ts >= 0


NOW = 1_800_000_000.0  # the ingest's clock in the clock-message property (fixed: the same examples every run)


@FUZZ
@given(st.one_of(st.binary(max_size=300), st.sampled_from(list(CORPUS.values()))))
def test_a_clock_message_of_any_bytes_is_read_or_refused_with_a_reason(data: bytes) -> None:
    try:
        corrections = parse_clock(data, DEVICE, NOW)
    except RefusedError as exc:
        assert exc.reason
    else:  # a correction never puts a moment before 2020 or past tomorrow
        assert all(c.device == "d" and 1_577_836_800 <= c.mono + c.offset <= NOW + 86_400 for c in corrections)


@FUZZ
@given(st.dictionaries(st.sampled_from(["synced", "boot", "mono", "corrected", "ts_original", "x"]), json_values))
def test_a_result_s_clock_object_of_any_fields_is_read_in_range_or_refused(clock: dict[str, Any]) -> None:
    payload = json.dumps({"device": "d", "pipeline": "p", "seq": 1, "ts": 1.0, "clock": clock}).encode()
    try:
        (row,) = parse_results(payload, Identity("d", "p"))
    except RefusedError as exc:
        assert exc.reason
        return
    assert row.clock in {None, "unsynced", "corrected"}
    if row.clock is not None:
        assert row.clock_boot
        assert row.clock_mono is not None
        assert math.isfinite(row.clock_mono)


@FUZZ
@given(st.binary(max_size=200), json_values)
def test_a_spooled_payload_the_device_corrects_is_corrected_or_sent_as_it_is(tail: bytes, value: Any) -> None:
    """The uplink corrects a flagged result's time on its way out (core/clock.py): whatever the spool holds
    (a torn or foreign row), it goes out, corrected or as it was, never an exception in the edged-mqtt thread."""
    watch = ClockWatch(ClockConfig(sync="assume"))
    for payload in (MARK + tail, b"{" + MARK + b"," + json.dumps(value).encode() + b"}"):
        out = watch.correct(payload)
        assert out == payload or json.loads(out)["clock"]["corrected"] is True


def test_a_result_on_another_device_s_topic_is_refused_as_an_identity_mismatch() -> None:
    with pytest.raises(RefusedError) as err:
        parse_results(result("victim", "cam0", 5), Identity("attacker", "x"))
    assert err.value.reason == "identity_mismatch"


# -- the config loader: a YAML file and a pushed JSON config ------------------------------------------------


@FUZZ
@given(st.text(max_size=400))
def test_any_yaml_text_is_a_config_or_a_config_error(text: str) -> None:
    try:
        parse_config(text, "fuzz.yaml")
    except ConfigError as exc:
        assert all(line.startswith("fuzz.yaml:") for line in exc.problems)


BASE = "device_id: d\nstate_dir: state\npipelines:\n  - name: cam0\n    source: {{type: camera, uri: /dev/video9}}\n" \
    "    model: {{path: {model}}}\n"  # fmt: skip


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("model") / "tiny.onnx")


@FUZZ
@given(st.dictionaries(st.sampled_from(["device_id", "state_dir", "status", "mqtt", "pipelines", "spool", "x"]),
                       json_values))  # fmt: skip
def test_a_pushed_config_of_any_shape_is_refused_and_changes_nothing(
    tmp_path_factory: pytest.TempPathFactory, model: Path, fields: dict[str, Any]
) -> None:
    folder = tmp_path_factory.mktemp("push")
    path = folder / "edged.yaml"
    path.write_text(BASE.format(model=model), encoding="utf-8")
    before = path.read_bytes()
    for replace in (False, True):
        try:
            apply_remote_config(path, fields, replace=replace, check=check_config)
        except CommandError as exc:
            assert exc.reason in {"invalid_config", "failed"}
            assert path.read_bytes() == before
        else:
            check_config(path)  # what was written is a valid config
            path.write_bytes(before)


def test_a_pushed_config_that_names_a_system_folder_the_spool_as_socket_or_a_text_model_is_refused(
    tmp_path: Path, model: Path
) -> None:
    path = tmp_path / "edged.yaml"
    path.write_text(BASE.format(model=model), encoding="utf-8")
    (tmp_path / "notes.txt").write_text("not a model\n")
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "spool.db").write_bytes(b"results")
    before = path.read_bytes()
    text_model = {"pipelines": [{"name": "cam0", "model": {"path": str(tmp_path / "notes.txt")}}]}
    for patch, key in (({"state_dir": "/etc"}, "state_dir=/etc"),
                       ({"status": {"socket": str(tmp_path / "state" / "spool.db")}}, "status.socket="),
                       (text_model, "pipelines[0].model")):  # fmt: skip
        with pytest.raises(CommandError) as err:
            apply_remote_config(path, patch, replace=False, check=lambda p: check_config(p, as_daemon=True))
        assert err.value.reason == "invalid_config"
        assert key in str(err.value)
        assert path.read_bytes() == before
    assert (tmp_path / "state" / "spool.db").read_bytes() == b"results"


# -- the status reader --------------------------------------------------------------------------------------


@pytest.fixture
def fake_daemon(tmp_path: Path) -> Iterator[tuple[Path, list[bytes]]]:
    """Whatever answers on a status socket (not necessarily edged): a server that sends what it is given."""
    path = tmp_path / "s.sock"
    answers: list[bytes] = []
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(4)

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.sendall(answers.pop(0) if answers else b"")

    thread = threading.Thread(target=serve, daemon=True, name="fake-status")
    thread.start()
    yield path, answers
    server.shutdown(socket.SHUT_RDWR)  # wakes the accept() (close alone does not, on Linux)
    server.close()
    thread.join(5)
    assert not thread.is_alive()


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_the_status_reader_refuses_what_is_not_a_status(fake_daemon: tuple[Path, list[bytes]], name: str) -> None:
    path, answers = fake_daemon
    answers.append(CORPUS[name])
    try:
        snapshot = query(path)
    except StatusError as exc:
        assert "malformed status" in str(exc)
    else:
        assert isinstance(snapshot, dict)


@FUZZ
@given(st.dictionaries(st.sampled_from(["state", "reasons", "version", "device_id", "uptime_s", "pipelines", "spool",
                                        "mqtt", "reload", "control"]), json_values))  # fmt: skip
def test_a_status_of_any_shape_is_shown_or_said_to_be_unshowable(snapshot: dict[str, Any]) -> None:
    out = io.StringIO()
    Console(file=out, width=80).print(build_view(snapshot))  # never a traceback for `edged status`
    assert out.getvalue().startswith("edged ")


# -- replay requests (uplink/replay.py) and answers (fleet/replayer.py) ------------------------------------


@pytest.fixture(scope="module")
def replay_hook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplayRequests]:
    spool = Spool(tmp_path_factory.mktemp("replay") / "spool.db")
    yield ReplayRequests(spool.replay, "dev1", "edged/dev1/replay", bytes_per_hour=2**20)
    spool.close()


@FUZZ
@given(st.one_of(st.binary(max_size=600), st.sampled_from(list(CORPUS.values()))))
def test_a_replay_request_of_any_bytes_is_answered_never_raised(replay_hook: ReplayRequests, data: bytes) -> None:
    answer = replay_hook.answer(data)
    assert answer["device"] == "dev1"
    assert "refused" in answer or ("replayed" in answer and "gone" in answer)


@FUZZ
@given(st.dictionaries(st.sampled_from(["v", "id", "pipeline", "ranges", "x"]), json_values))
def test_a_replay_request_of_any_fields_is_answered_with_bounded_ranges(
    replay_hook: ReplayRequests, fields: dict[str, Any]
) -> None:
    body = {"v": 1, "id": "r", "pipeline": "cam0", "ranges": [[1, 3]], **fields}
    try:
        payload = json.dumps(body, allow_nan=False).encode()
    except ValueError:
        return
    answer = replay_hook.answer(payload)
    if "refused" not in answer:
        asked = sum(b - a + 1 for a, b in answer["replayed"] + answer["gone"] + answer["pending"])
        assert asked <= 5000


@FUZZ
@given(json_values)
def test_a_replay_answer_of_any_shape_never_breaks_the_replayer(body: Any) -> None:
    replayer = Replayer("ing", "edged/{device_id}/replay", lambda _t, _p: None, 1.0)
    replayer.note([("dev1", "cam0", 1), ("dev1", "cam0", 10)])
    answer = {"id": "ing-1", "pipeline": "cam0", "gone": body} if not isinstance(body, dict) else body
    replayer.answered("dev1", answer)
    assert replayer.snapshot()["missing_now"] in range(9)
