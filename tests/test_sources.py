"""Sources: real OpenCV decoding of real files; a fake capture stands in for a V4L2 camera (none here)."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import StartDaemon, base_config, make_tiny_model, make_video, wait_for, write_config

from edged.capture import SOURCES, Frame, FrameSlot, make_source
from edged.capture.camera import CameraSource, CameraSourceConfig, source_kind
from edged.core.backoff import Backoff
from edged.core.stats import PipelineStats


def camera(uri: str | int, **kw: Any) -> CameraSourceConfig:
    return CameraSourceConfig.model_validate(
        {"type": "camera", "uri": uri, "reconnect_min_s": 0.02, "reconnect_max_s": 0.1, **kw}
    )


def drain(slot: FrameSlot, timeout: float = 20.0) -> list[Frame]:
    frames: list[Frame] = []
    deadline = time.monotonic() + timeout
    while not slot.closed and time.monotonic() < deadline:
        frame = slot.get(0.1)
        if frame is not None:
            frames.append(frame)
    return frames


def test_slot_latest_frame_wins_and_counts_drops() -> None:
    slot = FrameSlot()
    img = np.zeros((1, 1, 3), np.uint8)
    assert slot.put(Frame(img, 1.0, 0)) == 0
    assert slot.put(Frame(img, 2.0, 1)) == 1  # frame 0 was never seen: dropped
    got = slot.get(0.1)
    assert got is not None
    assert got.index == 1
    assert slot.get(0.01) is None
    slot.put(Frame(img, 3.0, 2))
    slot.close()
    assert not slot.closed  # a frame is still waiting
    assert slot.get(0.1) is not None
    assert slot.closed


def test_source_kinds() -> None:
    assert source_kind(0) == "device"
    assert source_kind("/dev/video2") == "device"
    assert source_kind("rtsp://cam/stream") == "stream"
    assert source_kind("v4l2src ! videoconvert ! appsink") == "gstreamer"
    assert source_kind("/data/clip.mp4") == "file"


def test_file_at_model_pace_delivers_every_frame_in_order(tmp_path: Path) -> None:
    video = make_video(tmp_path / "v.mp4", 40)
    slot, stats = FrameSlot(), PipelineStats("p", str(video))
    src = make_source(camera(str(video), stop_at_end=True), slot=slot, stats=stats)
    assert isinstance(src, CameraSource)
    src.start()
    frames = []
    while not slot.closed:
        frame = slot.get(0.2)
        if frame is not None:
            time.sleep(0.002)  # a model slower than decoding
            frames.append(frame)
    src.join(5)
    assert [f.index for f in frames] == list(range(40))
    assert stats.dropped_frames == 0
    assert stats.state == "ended"
    assert frames[1].image[0, 0, 1] > 200  # frame 1 is green: real decoding
    assert frames[0].ts <= frames[-1].ts


def test_loop_restarts_the_file(tmp_path: Path) -> None:
    video = make_video(tmp_path / "v.mp4", 5)
    slot, stats = FrameSlot(), PipelineStats("p", str(video))
    src = CameraSource(camera(str(video), loop=True), slot=slot, stats=stats)
    src.start()
    seen: list[int] = []
    while len(seen) < 12:
        frame = slot.get(1.0)
        assert frame is not None
        seen.append(frame.index)
    src.stop()
    src.join(5)
    assert seen == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1]
    assert stats.reconnects == 0


@pytest.mark.integration
def test_vanished_path_reconnects_with_backoff_and_stops_cleanly(tmp_path: Path) -> None:
    missing = make_video(tmp_path / "gone.mp4", 4)
    cfg = camera(str(missing))  # there when the config was checked (a missing file is refused there) ...
    missing.unlink()  # ... and gone when the source opens it
    slot, stats = FrameSlot(), PipelineStats("p", str(missing))
    src = CameraSource(cfg, slot=slot, stats=stats, name="edged-source-test")
    src.start()
    wait_for(lambda: stats.reconnects >= 3, 10, "three reconnect attempts")
    assert stats.state == "reconnecting"
    assert "file not found" in (stats.error or "")
    # the path comes back: the source picks it up without a restart
    make_video(missing, 4)
    wait_for(lambda: stats.frames_captured >= 1, 10, "frames after the file came back")
    src.stop()
    src.join(5)
    assert not src.is_alive()
    assert slot.closed or slot.get(0.1) is not None


@pytest.mark.parametrize(("name", "readable"), [("v.avi", True), ("v.mp4", False)])
def test_truncated_video_counts_reconnects_and_does_not_crash(tmp_path: Path, name: str, readable: bool) -> None:
    # a cut AVI still yields its first frames; a cut MP4 lost its index (moov atom) and cannot be opened
    video = make_video(tmp_path / name, 60, size=(160, 120))
    data = video.read_bytes()
    video.write_bytes(data[: len(data) // 2])  # cut the file in the middle
    slot, stats = FrameSlot(), PipelineStats("p", str(video))
    src = CameraSource(camera(str(video)), slot=slot, stats=stats)
    src.start()
    collected: list[Frame] = []
    stop_collect = threading.Event()

    def consume() -> None:
        while not stop_collect.is_set():
            frame = slot.get(0.1)
            if frame is not None:
                collected.append(frame)

    consumer = threading.Thread(target=consume, name="test-consumer")
    consumer.start()
    wait_for(lambda: stats.reconnects >= 2, 20, "reconnects after the truncated end")
    src.stop()
    src.join(5)
    stop_collect.set()
    consumer.join(5)
    assert not src.is_alive()
    assert (stats.frames_captured > 0) is readable
    if readable:
        assert 0 < len({f.index for f in collected}) < 60
        assert "end of file after" in (stats.error or "")


class FakeCamera:
    """Stands in for a V4L2 device (this machine has none): frames as fast as asked, optional failure."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.n = 0
        self.fail_after = fail_after
        self.released = False

    def isOpened(self) -> bool:  # noqa: N802  (OpenCV's name)
        return True

    def read(self) -> tuple[bool, np.ndarray | None]:
        if self.fail_after is not None and self.n >= self.fail_after:
            return False, None
        self.n += 1
        time.sleep(0.001)
        return True, np.full((4, 4, 3), self.n % 256, np.uint8)

    def release(self) -> None:
        self.released = True


@pytest.mark.integration
def test_slow_model_never_makes_a_live_source_lag() -> None:
    slot, stats = FrameSlot(), PipelineStats("p", "/dev/video0")
    src = CameraSource(camera("/dev/video0"), slot=slot, stats=stats, capture_factory=lambda _c: FakeCamera())
    src.start()
    taken = []
    for _ in range(5):
        frame = slot.get(1.0)
        assert frame is not None
        taken.append(frame.index)
        time.sleep(0.05)  # a slow model
    src.stop()
    src.join(5)
    assert stats.dropped_frames > 0
    gaps = np.diff(taken)
    assert (gaps > 1).all()  # each take skipped to the latest frame


@pytest.mark.integration
def test_live_source_failure_reconnects_without_busy_looping() -> None:
    opened = []

    def factory(_cfg: CameraSourceConfig) -> FakeCamera:
        cam = FakeCamera(fail_after=2)
        opened.append(cam)
        return cam

    slot, stats = FrameSlot(), PipelineStats("p", "0")
    cfg = camera(0, reconnect_min_s=0.05, reconnect_max_s=0.05)
    src = CameraSource(cfg, slot=slot, stats=stats, capture_factory=factory)
    src.start()
    time.sleep(0.5)
    src.stop()
    src.join(5)
    # 0.5 s with a delay of 0.025..0.05 s between attempts: at most ~20 opens, never thousands
    assert 2 <= len(opened) <= 25
    assert stats.reconnects == len(opened) or stats.reconnects == len(opened) - 1
    assert all(c.released for c in opened)


def test_registry_can_be_swapped_by_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    made = []

    class Dummy(threading.Thread):
        def __init__(self, cfg: Any, **kw: Any) -> None:
            super().__init__(name="dummy")
            made.append(cfg)

    monkeypatch.setitem(SOURCES.factories, "camera", Dummy)
    make_source(camera(0), slot=FrameSlot(), stats=PipelineStats("p", "0"))
    assert len(made) == 1


def test_backoff_is_capped_exponential_with_jitter() -> None:
    b = Backoff(0.5, 4.0, random.Random(1))
    delays = [b.next_delay() for _ in range(8)]
    ceilings = [0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0, 4.0]
    assert all(c / 2 <= d <= c for d, c in zip(delays, ceilings, strict=True))
    assert len(set(delays)) == len(delays)  # jittered
    b.reset()
    assert b.next_delay() <= 0.5


@pytest.mark.integration
def test_http_stream_is_read_through_ffmpeg_and_reconnected_when_it_ends(tmp_path: Path) -> None:
    # a real HTTP server on loopback stands in for an IP camera's stream
    import functools
    import http.server

    make_video(tmp_path / "stream.avi", 20)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    serving = threading.Thread(target=server.serve_forever, name="test-http", daemon=True)
    serving.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/stream.avi"
    slot, stats = FrameSlot(), PipelineStats("p", url)
    src = CameraSource(camera(url), slot=slot, stats=stats)
    assert src.kind == "stream"
    src.start()
    try:
        wait_for(lambda: stats.frames_captured >= 20 and stats.reconnects >= 1, 20, "a stream read and reconnected")
    finally:
        src.stop()
        src.join(5)
        server.shutdown()
        server.server_close()
    assert "read failed" in (stats.error or "")


def test_gstreamer_pipeline_without_gstreamer_support_says_what_to_do() -> None:
    from edged.capture.camera import has_backend

    if has_backend("GStreamer"):
        pytest.skip("this OpenCV has GStreamer; the message is for builds without it")
    slot, stats = FrameSlot(), PipelineStats("p", "gst")
    src = CameraSource(camera("videotestsrc ! videoconvert ! appsink"), slot=slot, stats=stats)
    src.start()
    wait_for(lambda: stats.reconnects >= 1, 10, "a failed open")
    src.stop()
    src.join(5)
    assert "no GStreamer support" in (stats.error or "")
    assert "python3-opencv" in (stats.error or "")


@pytest.mark.integration
def test_a_device_path_with_a_typo_is_named_as_no_such_device_everywhere(
    tmp_path: Path, start_daemon: StartDaemon
) -> None:
    """`/dev/vidoe0` is valid (an absent camera is waited for), but check-config notes it and status says no such
    device ever appeared, with the devices there are; OpenCV is not asked, so no warning line per retry."""
    model = make_tiny_model(tmp_path / "tiny.onnx")
    cfg = base_config(tmp_path, model, "/dev/vidoe0", stop_at_end=False)
    path = write_config(tmp_path / "edged.yaml", cfg)
    checked = subprocess.run([sys.executable, "-m", "edged", "check-config", str(path)], capture_output=True,
                             text=True, check=False)  # fmt: skip
    assert checked.returncode == 0, checked.stderr
    assert "  note: cam0: no such device /dev/vidoe0 (video devices here: " in checked.stdout
    daemon = start_daemon(path)
    snap = wait_for(lambda: (s := daemon.status()) and s["pipelines"][0]["reconnects"] >= 2 and s, 30, "retries")
    (line,) = [r for r in snap["reasons"] if "/dev/vidoe0" in r]
    assert line.startswith("pipeline cam0 reconnecting: /dev/vidoe0: no such device /dev/vidoe0 (video devices")
    code, err = daemon.stop()
    assert code == 0
    assert "VIDEOIO" not in err  # OpenCV's V4L2 backend was never asked
