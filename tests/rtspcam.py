"""A real RTSP camera the tests start and stop: GStreamer's RTSP server (tests/rtsp_server.py, run by the
system python3 that has PyGObject) serving the sample video's frames at rtsp://127.0.0.1:PORT/cam."""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import pytest
from conftest import ASSETS, free_port

SERVER = Path(__file__).resolve().parent / "rtsp_server.py"
SYSTEM_PYTHON = "/usr/bin/python3"


@dataclass
class RtspCamera:
    """The server process; `url` for edged, `freeze()` / `thaw()` (SIGSTOP / SIGCONT: the stream stalls
    with its connection open, the classic frozen camera), `stop()` / `start()` (it goes away and comes back)."""

    workdir: Path
    fps: int = 10
    user: str | None = None
    password: str | None = None
    port: int = field(default_factory=free_port)
    push_log: Path | None = None  # the server appends "FRAME UNIX_TIME" per frame pushed (tests/rtsp_server.py)
    codec: str = "mjpeg"  # or h264, h265: what IP cameras send (tests/rtsp_server.py's ENCODERS)
    transports: str | None = None  # "tcp" or "udp": the one RTSP transport it offers (None: both)
    proc: subprocess.Popen[str] | None = None

    def __post_init__(self) -> None:
        self.frames = self.workdir / "frames"
        self.frames.mkdir(parents=True, exist_ok=True)
        cap = cv2.VideoCapture(str(ASSETS / "sample.mp4"))
        index = 0
        while True:
            ok, frame = cap.read()
            if not ok or frame is None:
                break
            cv2.imwrite(str(self.frames / f"{index:04d}.jpg"), frame)
            index += 1
        cap.release()
        assert index, "the sample video gave no frames"

    def url(self, path: str = "/cam", user: str | None = None, password: str | None = None) -> str:
        auth = f"{user}:{password}@" if user is not None else ""
        return f"rtsp://{auth}127.0.0.1:{self.port}{path}"

    def start(self) -> None:
        if not Path(SYSTEM_PYTHON).exists():
            pytest.fail(
                "no /usr/bin/python3 with PyGObject: run scripts/setup dev (it installs GStreamer's RTSP server)"
            )
        args = [SYSTEM_PYTHON, str(SERVER), str(self.port), str(self.frames), str(self.fps)]
        if self.user is not None and self.password is not None:
            args += [self.user, self.password]
        env = {
            **os.environ,
            "RTSP_CODEC": self.codec,
            **({"RTSP_TRANSPORTS": self.transports} if self.transports else {}),
        }
        if self.push_log:
            env["RTSP_PUSH_LOG"] = str(self.push_log)
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            self.proc.kill()
            _, err = self.proc.communicate(timeout=10)
            pytest.fail(f"the RTSP server did not start: {line!r} {err[-2000:]}")

    def freeze(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGCONT)  # a frozen server cannot die of SIGTERM
            self.proc.kill()
            self.proc.communicate(timeout=10)
            self.proc = None
