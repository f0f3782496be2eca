"""Hostile inputs for check-config and run: configs that blow up a naive loader (an alias bomb, deep nesting,
binary junk), models ONNX Runtime cannot load, and the CLI run under a memory limit so a blow-up fails the
test instead of the machine."""

from __future__ import annotations

import resource
import subprocess
import sys
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
