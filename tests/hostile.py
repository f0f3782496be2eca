"""Hostile inputs for check-config and run: configs that blow up a naive loader (an alias bomb, deep nesting,
binary junk), models ONNX Runtime cannot load, and the CLI run under a memory limit so a blow-up fails the
test instead of the machine."""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import onnx

CLI_MEMORY_LIMIT = 3 * 2**30  # the alias bomb took check-config to 6 GB; a bounded loader needs far less


def limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CLI_MEMORY_LIMIT, CLI_MEMORY_LIMIT))


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edged", *args],
        capture_output=True, text=True, timeout=120, check=False, preexec_fn=limit_memory,
    )  # fmt: skip


def run_set_aside(config: Path, env: dict[str, str] | None = None, timeout: float = 120) -> tuple[int, list[str], str]:
    """`edged run` on a config whose pipeline cannot start: the daemon runs on (a model it cannot use sets its
    pipeline aside, pipeline/startup.py) and says why in status; stopped with SIGTERM. (exit code, the status
    reasons seen, stderr)."""
    import yaml

    from edged.core.errors import StatusError
    from edged.ops.status import query

    state = Path(yaml.safe_load(config.read_text())["state_dir"])
    proc = subprocess.Popen([sys.executable, "-m", "edged", "run", "--config", str(config)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    reasons: list[str] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and proc.poll() is None and not any("set aside" in r for r in reasons):
            try:
                reasons = list(query(state / "status.sock", timeout=1.0).get("reasons", []))
            except StatusError:  # noqa: PERF203  (a poll until the daemon answers, not a hot path)
                time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    return proc.returncode, reasons, err


def alias_bomb() -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 10):
        refs = ", ".join([f"*a{i - 1}"] * 9)
        lines.append(f"a{i}: &a{i} [{refs}]")
    return "\n".join(lines) + "\n"


HOSTILE: dict[str, tuple[bytes, int, str]] = {
    # name: (file content, line the error names, what the message says)
    "alias bomb": (alias_bomb().encode(), 1, "aliases are expanded"),
    "deep nesting": (b"device_id: x\nstate_dir: " + b"[" * 100_000 + b"]" * 100_000 + b"\n", 2, "nested deeper"),
    "huge integer": (b"device_id: x\nstatus:\n  mode: " + b"7" * 5000 + b"\n", 3, "more than 20 digits"),
    "not utf-8": (b"device_id: x\nstate_dir: /var/lib/\xff\xfeedged\n", 2, "not UTF-8"),
    "duplicate key": (b"device_id: a\nstate_dir: /tmp/x\ndevice_id: b\n", 3, "key given twice"),
    "50 MB": (b"device_id: x\n# " + b"y" * (50 * 2**20) + b"\n", 1, "larger than"),
    "a name over 255 bytes": (
        b"device_id: x\nstate_dir: /var/lib/" + b"n" * 300 + b"\npipelines:\n  - name: c\n"
        b"    source: {type: camera, uri: /dev/video0}\n    model: {path: /tmp/" + b"m" * 300 + b".onnx}\n",
        6,
        "cannot look up the model file: File name too long",
    ),
    "a video file name over 255 bytes": (
        b"device_id: x\nstate_dir: /tmp/edged-hostile\npipelines:\n  - name: c\n"
        b"    source: {type: camera, uri: /tmp/" + b"v" * 300 + b".mp4}\n"
        b"    model: {path: "
        + str(Path(__file__).resolve().parent.parent / "edged/assets/digits.int8.onnx").encode()
        + b"}\n",
        5,
        "cannot look up the video file: File name too long",
    ),
}


def broken_models(tmp_path: Path, good: Path) -> dict[str, Path]:
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    truncated = tmp_path / "truncated.onnx"
    data = good.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    future = onnx.load(str(good))
    future.opset_import[0].version = 99
    too_new = tmp_path / "opset99.onnx"
    onnx.save(future, str(too_new))
    return {"empty": empty, "truncated": truncated, "opset 99": too_new}
