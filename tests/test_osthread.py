"""edged's threads carry their names to the OS, so `top -H` and /proc show which one is busy."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from edged.core.osthread import comm_name, name_os_thread


def test_long_names_lose_the_prefix_first() -> None:
    assert comm_name("edged-mqtt") == "edged-mqtt"
    assert comm_name("edged-spool-writer") == "spool-writer"
    assert len(comm_name("edged-infer-a-very-long-pipeline-name")) == 15


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/<pid>/task/<tid>/comm is Linux's")
def test_a_thread_names_itself_for_the_os() -> None:
    seen: list[str] = []

    def body() -> None:
        name_os_thread()
        seen.append(Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text(encoding="ascii").strip())

    thread = threading.Thread(target=body, name="edged-spool-writer")
    thread.start()
    thread.join(10)
    assert seen == ["spool-writer"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")
def test_a_stage_yields_the_cpu_to_the_ones_after_it_and_its_children_inherit() -> None:
    """Capture and inference threads raise their own nice value (no privilege needed); the threads they start
    (FFmpeg's decoders) inherit it; the calling thread (delivery) keeps its own."""
    import os

    from edged.core.osthread import CAPTURE_NICE, yield_cpu_to_delivery

    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    seen: dict[str, int] = {}

    def child() -> None:
        seen["child"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    def stage() -> None:
        yield_cpu_to_delivery(CAPTURE_NICE)
        seen["stage"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        inner = threading.Thread(target=child, name="test-decoder")
        inner.start()
        inner.join(10)

    thread = threading.Thread(target=stage, name="edged-source-test")
    thread.start()
    thread.join(10)
    assert seen == {"stage": min(19, base + CAPTURE_NICE), "child": min(19, base + CAPTURE_NICE)}
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base
