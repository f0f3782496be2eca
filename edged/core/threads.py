"""Supervised threads: every edged thread is one. Its body runs inside a guard, so an exception is never
a silent end: it is logged once with its cause, kept in `death` (the status shows it) and handed to the
owner's `on_death` (which marks the pipeline or the daemon failed). Each thread is named for the OS too
(see osthread.py) and may lower its own priority first."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from edged.core.osthread import name_os_thread, yield_cpu_to_delivery

log = logging.getLogger(__name__)

DeathHook = Callable[[str], object]


class Supervised(threading.Thread):
    """A named daemon thread running `body()` (or `target`) under supervision.

    `nice`: raise the thread's nice value by this much first (capture and inference yield to delivery).
    `on_death(why)` is called when the body raises; `on_exit()` whenever it ends, however it ends.
    """

    def __init__(
        self,
        name: str,
        *,
        target: Callable[[], object] | None = None,
        nice: int = 0,
        on_death: DeathHook | None = None,
    ) -> None:
        super().__init__(name=name, daemon=True)
        self._body_target = target
        self._nice = nice
        self.on_death = on_death
        self.on_exit: Callable[[], object] | None = None
        self.death: str | None = None  # "<Exception>: <message>" once the body raised

    def body(self) -> None:
        """What the thread does; subclasses override it (or pass `target`)."""
        if self._body_target is not None:
            self._body_target()

    def run(self) -> None:
        """The guard around `body()`."""
        name_os_thread()
        if self._nice:
            yield_cpu_to_delivery(self._nice)
        try:
            self.body()
        except BaseException as exc:
            self.death = f"{type(exc).__name__}: {exc}"
            log.exception("thread %s died: %s", self.name, self.death)
            if self.on_death is not None:
                self.on_death(self.death)
        finally:
            if self.on_exit is not None:
                self.on_exit()

    def died(self) -> str | None:
        """`thread <name> died: <cause>` when the body raised, else None."""
        return f"thread {self.name} died: {self.death}" if self.death is not None else None
