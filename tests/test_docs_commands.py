"""The docs' commands run as written: the shell blocks of getting-started and the models page are executed line
by line in a scratch folder laid out as the page assumes, and every other `edged` command in the docs is either
one of these or named below with the test that runs it (a sudo, systemctl or fleet line cannot run as written
here: it needs root, a device, or a second machine).

The only changes made to a page's lines: `/tmp/` becomes the test's own folder and the broker port 1883 a free
one, so that runs beside each other (and a broker already on 1883) do not meet.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import cv2
import pytest
from conftest import ASSETS, REPO, Broker, wait_for
from test_docs import PAGES, edged_commands, shell_lines

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent  # the venv's bin: `edged` is on PATH as after `. .venv/bin/activate`

# Every other `edged` command of the docs, by its first words, and where it runs for real.
ELSEWHERE = {
    "status --socket": "tests/test_lifecycle.py (and --watch until Ctrl-C)",
    "status --config /etc/edged/edged.yaml": "an installed device; the same command on another path runs below",
    "check-config /etc/edged/edged.yaml": "an installed device; the same command on another path runs below",
    "status --json": "tests/test_daemon.py; here with --config",
    "status --watch": "tests/test_lifecycle.py",
    "run --config deploy/edged.sensor.yaml": "here (getting-started); configuration.md shows the same line",
    "fleet send": "tests/test_control.py (signed commands to real daemons over Mosquitto)",
    "fleet rollout": "tests/test_rollout.py (canary, then the rest, with real daemons)",
    "ingest --db": "tests/test_ingest.py (SQLite and PostgreSQL; --report)",
}


def lines_of(page: str, first: str) -> list[str]:
    """The shell lines of the block in `page` that holds a line starting with `first`."""
    lines = shell_lines(REPO / "docs" / page)
    start = next(i for i, line in enumerate(lines) if line.startswith(first))
    return lines[start:]


def localised(line: str, scratch: Path, port: int) -> str:
    return line.replace("/tmp/", f"{scratch}/").replace("1883", str(port))


def sh(line: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
    return subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)  # fmt: skip


def background(line: str, cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    """The line as the page runs it in the background (`&`) or in another shell; its output goes to `log`."""
    env = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
    with log.open("wb") as out:
        return subprocess.Popen(["bash", "-c", f"exec {line.rstrip(' &')}"], cwd=cwd, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip


@pytest.fixture
def checkout(tmp_path: Path, own_broker: Broker) -> Path:
    """A folder that looks like the checkout the page speaks of: deploy/ (its files with /tmp/ and the port
    made the test's own), edged/ and scripts/ linked."""
    own_broker.start()
    root = tmp_path / "checkout"
    (root / "deploy").mkdir(parents=True)
    for name in ("edged", "scripts"):
        (root / name).symlink_to(REPO / name)
    for example in (REPO / "deploy").glob("*.yaml"):
        text = localised(example.read_text(encoding="utf-8"), tmp_path, own_broker.port)
        (root / "deploy" / example.name).write_text(text, encoding="utf-8")
    return root


def test_the_getting_started_commands_run_as_written(checkout: Path, own_broker: Broker) -> None:
    scratch = checkout.parent
    block = [
        line
        for line in lines_of("getting-started.md", "scripts/setup")[:6]  # the block of "Running it for real"
        if line.split()[0] not in ("scripts/setup", ".")
    ]
    assert [line.split()[:2] for line in block] == [
        ["edged", "check-config"], ["scripts/vibration_feed.py", "--out"], ["edged", "run"], ["edged", "status"],
    ]  # fmt: skip
    check, feed, run, status = (localised(line, scratch, own_broker.port) for line in block)
    checked = sh(check, checkout)
    assert checked.returncode == 0, checked.stderr
    assert "deploy/edged.sensor.yaml: OK (1 pipeline(s), device motor-bay-01)" in checked.stdout
    logs = [scratch / "feed.log", scratch / "run.log"]
    procs = [background(feed, checkout, logs[0]), background(run, checkout, logs[1])]
    try:

        def healthy() -> bool:
            got = sh(status + " --json", checkout, timeout=30)
            answer = json.loads(got.stdout) if got.stdout.strip() else {}
            return got.returncode == 0 and int(answer["mqtt"]["published"]) >= 3

        wait_for(healthy, 60, "the sensor example running and publishing")
        shown = sh(status, checkout, timeout=30)
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert "running" in shown.stdout
        # the feed's backlog at the start comes as one burst of windows: each waits for the model (0.3 ms)
        pipeline = json.loads(sh(status + " --json", checkout, timeout=30).stdout)["pipelines"][0]
        assert pipeline["frames_captured"] >= 3
        assert pipeline["dropped_frames"] == 0, pipeline
    finally:
        for proc in reversed(procs):
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
    assert procs[1].returncode == 0, logs[1].read_text(encoding="utf-8")


@pytest.fixture
def model_folder(tmp_path: Path) -> Path:
    """The files the models page's block names: model.onnx (the bundled fp32 classifier), calib-frames/ (images)
    and held-out.mp4 (the sample video)."""
    shutil.copy(ASSETS / "digits.fp32.onnx", tmp_path / "model.onnx")
    shutil.copy(ASSETS / "sample.mp4", tmp_path / "held-out.mp4")
    (tmp_path / "calib-frames").mkdir()
    cap = cv2.VideoCapture(str(ASSETS / "sample.mp4"))
    index = 0
    while True:
        ok, frame = cap.read()
        if not ok:
            break
        if index % 3 == 0:
            cv2.imwrite(str(tmp_path / "calib-frames" / f"{index:04d}.png"), frame)
        index += 1
    cap.release()
    return tmp_path


def test_the_models_page_commands_run_as_written(model_folder: Path) -> None:
    block = lines_of("models.md", "edged inspect model.onnx")[:5]
    assert [line.split()[1] for line in block] == ["inspect", "quantize", "validate", "bench", "budget"]
    inspect, quantize, validate, bench, budget = block
    out = sh(inspect, model_folder)
    assert out.returncode == 0, out.stderr
    assert "edged.precision" in out.stdout
    out = sh(quantize, model_folder, timeout=600)
    if out.returncode == 3:  # documented: int8 is not faster on this machine; the message says what to add
        assert "--accept-slower writes it" in " ".join(out.stderr.split()), out.stderr
        out = sh(quantize + " --accept-slower", model_folder, timeout=600)
    assert out.returncode == 0, out.stderr
    assert (model_folder / "model.int8.onnx").is_file()
    out = sh(validate, model_folder)
    assert out.returncode == 0, out.stdout + out.stderr
    out = sh(bench, model_folder)
    assert out.returncode == 0, out.stderr
    assert (model_folder / "latency.png").stat().st_size > 0
    out = sh(budget, model_folder)
    assert out.returncode == 0, out.stderr
    assert "break-even" in out.stdout.lower()


@pytest.mark.parametrize(
    "command",
    [
        "edged inspect gone.onnx",
        "edged quantize gone.onnx -o out.onnx --calib calib-frames/",
        "edged validate gone.onnx model.onnx --data held-out.mp4",
        "edged validate model.onnx gone.onnx --data held-out.mp4",
        "edged bench model.onnx gone.onnx",
        "edged budget --model gone.onnx",
    ],
)
def test_a_model_file_that_is_not_there_is_one_line_not_a_traceback(model_folder: Path, command: str) -> None:
    out = sh(command, model_folder)
    assert out.returncode == 1
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("edged: error: model file not found: ")
    assert line.endswith("gone.onnx")


def test_the_fleet_keygen_line_runs_as_written(tmp_path: Path) -> None:
    (line,) = [line for line in shell_lines(REPO / "docs" / "fleet.md") if line.startswith("edged fleet keygen")]
    out = sh(line, tmp_path)
    assert out.returncode == 0, out.stderr
    key = tmp_path / line.split()[-1]
    assert key.stat().st_mode & 0o777 == 0o600
    assert "public_keys" in out.stdout


RUN_HERE = ("check-config deploy/edged.sensor.yaml", "run --config deploy/edged.sensor.yaml",
            "status --config deploy/edged.sensor.yaml", "inspect model.onnx", "quantize model.onnx",
            "validate model.onnx", "bench model.onnx", "budget --model", "fleet keygen")  # fmt: skip


def test_every_edged_command_in_the_docs_runs_here_or_in_a_named_test() -> None:
    unaccounted = []
    for page in PAGES:
        for line in shell_lines(page):
            for argv in edged_commands(line):
                words = " ".join(argv)
                if not any(words.startswith(known) for known in (*RUN_HERE, *ELSEWHERE)):
                    unaccounted.append(f"{page.name}: edged {words}")
    assert not unaccounted, unaccounted
    for where in ELSEWHERE.values():
        named = re.findall(r"tests/\w+\.py", where)
        assert all((REPO / path).is_file() for path in named), where
