"""edged's threads carry their names to the OS, so `top -H` and /proc show which one is busy."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from edged.osthread import comm_name, name_os_thread


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
