"""`scripts/demo` as the README writes it, with its arguments: the broker it starts is on the port it is told
(it used 1883 whatever `--port` said, and the demo published nowhere), and Ctrl-C on `--loop` reaches edged
before the throwaway broker goes (one result stayed spooled)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, free_port, wait_for

pytestmark = pytest.mark.integration


def _demo(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(REPO / "scripts" / "demo"), "--state-dir", str(tmp_path / "demo"), *args],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip


def test_the_demo_starts_its_broker_on_the_port_it_is_given(tmp_path: Path) -> None:
    port = free_port()
    demo = _demo(tmp_path, "--port", str(port), "--fps", "0", "--quiet")
    out, _ = demo.communicate(timeout=300)
    assert demo.returncode == 0, out[-3000:]
    assert f"on port {port} for this run" in out, out[-3000:]  # its own broker, on that port
    assert f"published 100 result(s) to localhost:{port}" in out, out[-3000:]


def test_ctrl_c_on_the_looping_demo_publishes_what_is_left_before_the_broker_goes(tmp_path: Path) -> None:
    port = free_port()
    demo = _demo(tmp_path, "--port", str(port), "--loop", "--quiet")
    spool = tmp_path / "demo" / "spool.db"
    wait_for(spool.exists, 120, "the demo running")
    wait_for(lambda: _results_published(tmp_path) >= 20, 60, "results going out")
    os.killpg(demo.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
    out, _ = demo.communicate(timeout=60)
    assert "published " in out, out[-3000:]
    with sqlite3.connect(spool) as conn:  # every result went before the broker did
        assert conn.execute("SELECT COUNT(*) FROM results").fetchone()[0] == 0, out[-3000:]


def _results_published(tmp_path: Path) -> int:
    from edged.core.errors import StatusError
    from edged.ops.status import query

    try:
        return int(query(tmp_path / "demo" / "status.sock", timeout=1.0)["mqtt"]["published"])
    except (StatusError, KeyError, TypeError):
        return 0
