"""Pipelines in-process: several workers keep capture order; a failing model stops only its pipeline."""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import base_config, make_video

from edged.capture import Frame, FrameSlot
from edged.config import config_from_dict
from edged.daemon import Daemon
from edged.model.session import LoadedModel
from edged.pipeline.worker import Turnstile


def rows(state_dir: Path) -> list[dict[str, Any]]:
    with sqlite3.connect(state_dir / "spool.db") as conn:
        return [json.loads(p) for (p,) in conn.execute("SELECT payload FROM results ORDER BY id")]


@pytest.mark.parametrize("concurrency", [1, 3])
def test_results_keep_capture_order_with_several_workers(tmp_path: Path, tiny_model: Path, concurrency: int) -> None:
    video = make_video(tmp_path / "v.mp4", 90)
    cfg = base_config(tmp_path, tiny_model, str(video))
    cfg["pipelines"][0]["model"]["concurrency"] = concurrency
    daemon = Daemon(config_from_dict(cfg))
    daemon.start()
    assert len(daemon.pipelines[0].workers) == concurrency
    daemon.wait()  # the file ends (stop_at_end): the daemon finishes by itself
    daemon.stop()
    msgs = rows(tmp_path / "state")
    assert [m["seq"] for m in msgs] == list(range(1, 91))
    assert [m["frame"] for m in msgs] == list(range(90))  # seq follows the frames
    colours = ["red", "green", "blue"]
    assert all(m["result"]["top"][0]["label"] == colours[m["frame"] % 3] for m in msgs)


def test_turnstile_serves_tickets_in_order() -> None:
    slot = FrameSlot()
    gate = Turnstile(slot)
    order: list[int] = []
    img = np.zeros((1, 1, 3), np.uint8)
    tickets = []
    for i in range(3):
        slot.put(Frame(img, 0.0, i))
        taken = gate.take(0.1)
        assert taken is not None
        tickets.append(taken[1])
    assert tickets == [0, 1, 2]

    def serve(ticket: int) -> None:
        with gate.turn(ticket):
            order.append(ticket)

    threads = [threading.Thread(target=serve, args=(t,), name=f"test-{t}") for t in (2, 0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert order == [0, 1, 2]


def test_a_failing_model_stops_its_pipeline_and_the_daemon_reports_it(
    tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    video = make_video(tmp_path / "v.mp4", 30)
    cfg = base_config(tmp_path, tiny_model, str(video), loop=True, stop_at_end=False)
    cfg["pipelines"][0]["model"]["concurrency"] = 2
    daemon = Daemon(config_from_dict(cfg))
    daemon.start()
    calls = {"n": 0}
    real_run = LoadedModel.run

    def flaky(self: LoadedModel, tensor: Any) -> Any:
        # stands in for a model run that breaks at run time (e.g. a GPU error); the model itself is real
        calls["n"] += 1
        if calls["n"] > 5:
            raise RuntimeError("device lost")
        return real_run(self, tensor)

    monkeypatch.setattr(LoadedModel, "run", flaky)
    daemon.wait()  # returns once every worker has stopped
    snap = daemon.report.snapshot()
    daemon.stop()
    (p,) = snap["pipelines"]
    assert p["state"] == "failed"
    assert "device lost" in p["error"]
    assert snap["state"] == "degraded"
    assert [m["seq"] for m in rows(tmp_path / "state")] == list(range(1, len(rows(tmp_path / "state")) + 1))
    assert not [t.name for t in threading.enumerate() if t.name.startswith("edged-")]
