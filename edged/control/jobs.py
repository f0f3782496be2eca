"""The one command that runs at a time on the `edged-control-job` thread, so that a slow one (a reload with a
model build, a recording, a rollout) never holds up MQTT, the pipelines or a `status`; a command that comes
while it runs is told what runs and for how long instead of waiting behind it."""

from __future__ import annotations

import threading
from collections.abc import Callable

from edged.core.threads import Supervised


class JobSlot:
    """One job at a time: busy from its start until `done` (called before its answer goes)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._job: Supervised | None = None  # the running job, until done
        self._thread: Supervised | None = None  # its thread, until it ended (a stop waits for it)
        self._what = ""
        self._since = 0.0

    def start(self, what: str, started: float, run: Callable[[], None], on_death: Callable[[str], None]) -> str | None:
        """Start `run` on a new edged-control-job thread; or, while a job runs, say what runs (and start
        nothing)."""
        with self._lock:
            job = self._job
            if job is not None and job.is_alive():
                took = started - self._since
                return f"busy with {self._what} for {took:.0f} s; send it again once that is answered"
            self._what, self._since = what, started
            job = self._job = self._thread = Supervised("edged-control-job", target=run, on_death=on_death)
        job.start()
        return None

    def done(self) -> None:
        """The job is over (its answer goes next: whoever reads it may send the next command at once)."""
        with self._lock:
            self._job = None

    def join(self, timeout: float) -> None:
        """Wait for the job's thread to end, at most `timeout` seconds."""
        thread = self._thread
        if thread is not None and thread.is_alive():
            thread.join(max(0.0, timeout))
