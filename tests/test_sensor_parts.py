"""Sensor source parts without threads: windowing arithmetic, formats, the sample clock, window -> tensor."""

from __future__ import annotations

import json
import logging
import struct
import textwrap
from pathlib import Path

import numpy as np
import pytest

from edged.capture.sensor import MalformedLog
from edged.capture.sensor_parse import MAX_LINE, BinaryParser, CsvParser, JsonParser, SampleClock, Windower
from edged.config import load_config
from edged.core.errors import ConfigError, ModelError
from edged.core.stats import PipelineStats
from edged.model.window import WindowSpec, WindowTransform
from edged.ops.statusview import render

REPO = Path(__file__).resolve().parent.parent


def column(n: int, start: int = 0) -> np.ndarray:
    """n samples of 2 channels: (i, 100 + i)."""
    i = np.arange(start, start + n, dtype=np.float64)
    return np.stack([i, 100 + i], axis=1)


# -- windowing -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("window", "hop"), [(4, 4), (4, 2), (4, 1), (3, 5)])
def test_windows_start_every_hop_samples_whatever_the_chunking(window: int, hop: int) -> None:
    n = 23
    data = column(n)
    stamps = np.arange(n, dtype=np.float64) * 0.5
    for chunks in ([n], [1] * n, [5, 7, 11], [2, 20, 1]):
        w = Windower(window, hop, 2)
        got = []
        pos = 0
        for size in chunks:
            got += w.push(data[pos : pos + size], stamps[pos : pos + size])
            pos += size
        starts = list(range(0, n - window + 1, hop))
        assert [int(win[0, 0]) for win, _ in got] == starts, chunks
        for (win, ts), s in zip(got, starts, strict=True):
            assert win.shape == (window, 2)
            assert np.array_equal(win, data[s : s + window])
            assert ts == stamps[s + window - 1]  # the window's last sample


def test_windower_reset_drops_the_partial_window() -> None:
    w = Windower(4, 4, 2)
    assert w.push(column(3), np.zeros(3)) == []
    w.reset()
    out = w.push(column(4, start=10), np.zeros(4))
    assert [int(win[0, 0]) for win, _ in out] == [10]


def test_transform_normalises_per_channel_and_lays_out_for_the_model() -> None:
    samples = column(4)  # channel 0: 0..3, channel 1: 100..103
    fixed = WindowSpec(channels=("a", "b"), window=4, hop=4, normalize="fixed", mean=(1.0, 100.0), std=(2.0, 0.5))
    x = WindowTransform(fixed)(samples)
    assert x.shape == (1, 2, 4)
    assert x.dtype == np.float32
    assert np.allclose(x[0, 0], [-0.5, 0, 0.5, 1.0])
    assert np.allclose(x[0, 1], [0, 2, 4, 6])
    last = WindowTransform(WindowSpec(channels=("a", "b"), window=4, hop=4, layout="channels_last"))(samples)
    assert last.shape == (1, 4, 2)
    assert np.array_equal(last[0], samples)
    z = WindowTransform(WindowSpec(channels=("a", "b"), window=4, hop=4, normalize="window"))(samples)
    assert np.allclose(z[0].mean(axis=1), 0, atol=1e-6)
    assert np.allclose(z[0].std(axis=1), 1, atol=1e-5)
    flat = np.zeros((4, 2))
    assert np.isfinite(WindowTransform(WindowSpec(("a", "b"), 4, 4, normalize="window"))(flat)).all()


def test_window_spec_merges_model_metadata_under_the_config_and_checks_the_model_input() -> None:
    meta = {
        "edged.window": json.dumps(
            {"channels": ["x", "y"], "window": 8, "normalize": "fixed", "mean": 1, "std": [2, 4]}
        )
    }
    spec = WindowSpec.resolve({"hop": 2}, meta, [1, 2, 8], "tensor(float)")
    assert (spec.channels, spec.window, spec.hop, spec.mean, spec.std) == (("x", "y"), 8, 2, (1.0,), (2.0, 4.0))
    assert spec.tensor_shape == (1, 2, 8)
    # window inferred from the model input, reshaped to a rank-4 input of the same size
    assert WindowSpec.resolve({"channels": ["a", "b"]}, {}, [1, 2, 16], "tensor(float)").window == 16
    assert WindowSpec.resolve({"channels": ["a"], "window": 8}, {}, [1, 1, 1, 8], "tensor(float)").tensor_shape == (
        1,
        1,
        1,
        8,
    )
    with pytest.raises(ModelError, match=r"model input shape is \[1, 2, 8\].*produces \[1, 3, 8\].*source.channels"):
        WindowSpec.resolve({"channels": ["a", "b", "c"]}, meta, [1, 2, 8], "tensor(float)")
    with pytest.raises(ModelError, match=r"source.channels"):
        WindowSpec.resolve({}, {}, [1, 2, 8], "tensor(float)")
    with pytest.raises(ModelError, match=r"float32 or float16"):
        WindowSpec.resolve({"channels": ["a", "b"]}, {}, [1, 2, 8], "tensor(uint8)")
    with pytest.raises(ModelError, match=r"source.mean has 3 values"):
        WindowSpec.resolve({"mean": [0, 0, 0]}, meta, [1, 2, 8], "tensor(float)")
    with pytest.raises(ModelError, match=r"edged.window"):
        WindowSpec.resolve({}, {"edged.window": '{"window": -3}'}, [1, 2, 8], "tensor(float)")


# -- formats ----------------------------------------------------------------------------------------------


def test_csv_header_names_channel_order_and_time() -> None:
    p = CsvParser(["z", "x"], time_field="t", time_scale=1e-3)
    got = p.feed(b"t,x,y,z\n1000,1,2,3\n2000,4,5")
    assert got.malformed == 0
    assert got.values.tolist() == [[3.0, 1.0]]
    assert got.clock is not None
    assert got.clock.tolist() == [1.0]
    got = p.feed(b",6\nt,x,y,z\n")  # the rest of the line; the header again (a writer reopened the pipe)
    assert got.values.tolist() == [[6.0, 4.0]]
    assert got.malformed == 0


def test_csv_malformed_lines_are_counted_and_skipped() -> None:
    p = CsvParser([0, 2], delimiter=";")
    lines = [b"1;2;3", b"1;x;3;", b"4;5", b"nan;1;2", b"\xff\xfe;1;2", b"7;8;9", b"", b"abc;def"]
    got = p.feed(b"\n".join(lines) + b"\n")
    assert got.values.tolist() == [[1.0, 3.0], [1.0, 3.0], [7.0, 9.0]]
    # "1;x;3;" is fine: column 1 is not a channel; "abc;def" is the header (no number in it)
    assert got.malformed == 3
    assert p.feed(b"q;r;s\n").malformed == 1  # a second, different "header" is just bad input
    long = p.feed(b"1" * (MAX_LINE + 10))
    assert long.malformed == 1
    assert p.feed(b";2;3\n").malformed == 1  # the tail of the dropped line
    assert p.feed(b"5;6;7\n").values.tolist() == [[5.0, 7.0]]
    named = CsvParser(["b"])
    assert named.feed(b"1,2\n").malformed == 1  # names but no header yet
    assert named.feed(b"a,b\n1,2\n").values.tolist() == [[2.0]]


def test_json_lines_with_nested_keys() -> None:
    p = JsonParser(["acc.x", "temp"], time_field="ts")
    lines = [
        {"ts": 5.0, "acc": {"x": 1.5}, "temp": 20},
        {"ts": 6.0, "acc": {"x": True}, "temp": 20},
        {"ts": 7.0, "temp": 20},
        [1, 2],
        {"ts": 8.0, "acc": {"x": -1}, "temp": 21.5, "extra": "ok"},
    ]
    got = p.feed(b"".join(json.dumps(x).encode() + b"\n" for x in lines) + b"{not json\n")
    assert got.values.tolist() == [[1.5, 20.0], [-1.0, 21.5]]
    assert got.clock is not None
    assert got.clock.tolist() == [5.0, 8.0]
    assert got.malformed == 4
    assert "{not json" in got.problem


def test_binary_records_endianness_channels_and_partial_records() -> None:
    p = BinaryParser([2, 1], dtype="int16", endian="big", record_values=3, time_field=0, time_scale=1e-3)
    data = b"".join(struct.pack(">3h", t, t * 10, -t) for t in range(1, 6))
    a = p.feed(data[:7])  # one record and a bit
    b = p.feed(data[7:])
    assert a.values.tolist() == [[-1.0, 10.0]]
    assert b.values.tolist() == [[-2.0, 20.0], [-3.0, 30.0], [-4.0, 40.0], [-5.0, 50.0]]
    assert b.clock is not None
    assert np.allclose(b.clock, [0.002, 0.003, 0.004, 0.005])
    little = BinaryParser([0], dtype="float32", record_values=2)
    rec = struct.pack("<2f", 1.25, 0.0) + struct.pack("<2f", float("nan"), 0.0) + struct.pack("<2f", 2.5, 0.0)
    got = little.feed(rec)
    assert got.values.tolist() == [[1.25], [2.5]]
    assert got.malformed == 1
    dgram = little.feed(rec[:10], final=True)
    assert dgram.malformed == 1
    assert len(dgram.values) == 0
    assert "not a whole number" in dgram.problem


def test_sample_clock_epoch_device_and_arrival() -> None:
    assert SampleClock(epoch=True).stamps(np.array([5.0, 6.0]), 100.0, 2).tolist() == [5.0, 6.0]
    assert SampleClock(epoch=True).stamps(None, 100.0, 2).tolist() == [100.0, 100.0]
    dev = SampleClock(epoch=False)
    assert dev.stamps(np.array([10.0, 11.0]), 1000.0, 2).tolist() == [999.0, 1000.0]  # last sample = arrival
    assert dev.stamps(np.array([12.0]), 5000.0, 1).tolist() == [1001.0]  # the device clock, not arrival
    assert dev.stamps(np.array([1.0]), 2000.0, 1).tolist() == [2000.0]  # clock went back: device restarted


def test_status_table_shows_malformed_input(capsys: pytest.CaptureFixture[str]) -> None:
    stats = PipelineStats("vib0", "fifo:/run/x")
    stats.count_malformed(3)
    stats.set_state("waiting", "waiting for data")
    render({"state": "degraded", "pipelines": [stats.snapshot()], "mqtt": {"enabled": False}}, color=False)
    out = capsys.readouterr().out
    assert "malformed 3" in out
    assert "waiting for data" in out


def test_malformed_log_is_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="edged.capture.sensor")
    m = MalformedLog("source x", every_s=3600)
    for _ in range(50):
        m.note(2, "bad")
    assert len(caplog.records) == 1
    assert "skipped 2 malformed" in caplog.text


# -- config -----------------------------------------------------------------------------------------------


def write(tmp_path: Path, source: str, model: Path, extra: str = "") -> Path:
    path = tmp_path / "edged.yaml"
    body = f"""\
    pipelines:
      - name: s0
        source: {source}
        model: {{path: {model}}}
    """
    path.write_text(textwrap.dedent(body) + extra, encoding="utf-8")
    return path


def problems(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return info.value.problems


def test_sensor_config_validates_and_resolves_paths(tmp_path: Path, tiny_model: Path) -> None:
    good = write(tmp_path, "{type: sensor, transport: fifo, path: in.fifo, format: csv, channels: [x, y]}", tiny_model)
    src = load_config(good).pipelines[0].source
    assert src.type == "sensor"
    assert src.path == tmp_path / "in.fifo"
    assert src.uri == f"fifo:{tmp_path / 'in.fifo'}"
    cases = {
        "{type: sensor, transport: fifo, format: csv}": "transport fifo needs path",
        "{type: sensor, transport: fifo, path: p, baud: 9600, format: csv}": "baud applies to transport serial",
        "{type: sensor, transport: serial, path: p, baud: 1234, format: csv}": "baud must be a standard rate",
        "{type: sensor, transport: udp, address: nowhere, format: csv}": "address must be host:port",
        "{type: sensor, transport: udp, address: ':9', format: binary, channels: [0]}": "address must be host:port",
        "{type: sensor, transport: command, command: [x], format: binary, channels: [0]}": "needs dtype",
        "{type: sensor, transport: command, command: [x], format: json, channels: [0]}": "key names",
        "{type: sensor, transport: file, path: f, format: json, dtype: int8}": "dtype applies to format binary",
        "{type: sensor, transport: file, path: f, format: csv, columns: [a], channels: [b]}": "not one of columns",
        "{type: sensor, transport: file, path: f, format: csv, windw: 3}": "unknown key",
    }
    for source, message in cases.items():
        path = write(tmp_path, source, tiny_model)
        got = problems(path)
        assert len(got) == 1, got
        assert got[0].startswith(f"{path}:3 pipelines[0].source"), got
        assert message in got[0], got
    pre = write(
        tmp_path,
        "{type: sensor, transport: file, path: f, format: csv, channels: [0]}",
        tiny_model,
        "    preprocess: {size: [8, 8]}\n",
    )
    assert "preprocess applies to images" in problems(pre)[0]


def test_example_sensor_config_is_valid() -> None:
    cfg = load_config(REPO / "deploy" / "edged.sensor.yaml")
    src = cfg.pipelines[0].source
    assert src.type == "sensor"
    assert src.transport == "fifo"
    assert cfg.pipelines[0].model.path.name == "vibration.int8.onnx"
