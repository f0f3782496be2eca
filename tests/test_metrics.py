"""Prometheus metrics: a real daemon serves /metrics (and writes the textfile) that the official parser
reads back with the same counts `edged status` shows; off unless configured; bad settings are refused."""

from __future__ import annotations

import socket
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import base_config, free_port, make_video
from prometheus_client.parser import text_string_to_metric_families

from edged.config import config_from_dict
from edged.core.errors import ConfigError, EdgedError
from edged.daemon import Daemon


def families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(fams: dict[str, Any], name: str, sample: str | None = None, **labels: str) -> float:
    family = fams[name]
    for s in family.samples:
        if (sample is None or s.name == sample) and all(s.labels.get(k) == v for k, v in labels.items()):
            return float(s.value)
    raise AssertionError(f"no sample {sample or name} {labels} in {family.samples}")


@pytest.mark.integration
def test_metrics_match_the_status_and_parse_with_the_prometheus_parser(tmp_path: Path, tiny_model: Path) -> None:
    port = free_port()
    cfg = base_config(tmp_path, tiny_model, str(make_video(tmp_path / "v.mp4", 30)))
    cfg["metrics"] = {"listen": f"127.0.0.1:{port}", "textfile": str(tmp_path / "edged.prom")}
    daemon = Daemon(config_from_dict(cfg))
    daemon.start()
    try:
        daemon.wait()  # the video ends
        status = daemon.report.snapshot()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            fams = families(reply.read().decode())
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=10)
        assert missing.value.code == 404
        missing.value.close()
    finally:
        daemon.stop()
    frames = status["pipelines"][0]["frames"]
    assert frames == 30
    assert value(fams, "edged_frames", "edged_frames_total", pipeline="cam0") == frames
    assert value(fams, "edged_stage_latency_seconds", "edged_stage_latency_seconds_count", stage="infer") == frames
    assert (
        value(fams, "edged_stage_latency_seconds", "edged_stage_latency_seconds_bucket", stage="infer", le="+Inf")
        == frames
    )
    assert value(fams, "edged_spool_depth") == status["spool"]["depth"]
    assert value(fams, "edged_model_info", pipeline="cam0", sha256=status["pipelines"][0]["model"]["sha256"]) == 1
    assert fams["edged_stage_latency_seconds"].type == "histogram"
    assert fams["edged_frames"].type == "counter"
    # the textfile: written again on stop, readable by node_exporter (the same parser)
    written = families((tmp_path / "edged.prom").read_text(encoding="utf-8"))
    assert value(written, "edged_frames", "edged_frames_total", pipeline="cam0") == frames
    # aftermath: stopped means the port is closed and the threads are gone
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass
    assert not [t.name for t in threading.enumerate() if t.name.startswith("edged-metrics")]


def test_metrics_are_off_unless_configured(tmp_path: Path, tiny_model: Path) -> None:
    cfg = config_from_dict(base_config(tmp_path, tiny_model, "/dev/video9"))
    assert (cfg.metrics.listen, cfg.metrics.textfile) == (None, None)


@pytest.mark.integration
def test_a_port_in_use_fails_the_start_clearly_and_leaves_nothing(tmp_path: Path, tiny_model: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        cfg = base_config(tmp_path, tiny_model, "/dev/video9")
        cfg["metrics"] = {"listen": f"127.0.0.1:{port}"}
        daemon = Daemon(config_from_dict(cfg))
        with pytest.raises(EdgedError) as err:
            daemon.start()
    assert f"metrics: cannot listen on 127.0.0.1:{port}: Address already in use" in str(err.value)
    assert not (tmp_path / "state" / "status.sock").exists()  # the status socket was closed again


@pytest.mark.parametrize("listen", ["9108", "localhost", ":9108", "127.0.0.1:0", "127.0.0.1:99999"])
def test_a_bad_listen_address_is_a_config_error(tmp_path: Path, tiny_model: Path, listen: str) -> None:
    cfg = base_config(tmp_path, tiny_model, "/dev/video9")
    cfg["metrics"] = {"listen": listen}
    with pytest.raises(ConfigError) as err:
        config_from_dict(cfg)
    assert "metrics.listen" in str(err.value)
    assert "expected host:port" in str(err.value)
