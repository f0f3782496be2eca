"""Supervised threads: every edged thread is one. Its body runs inside a guard, so an exception is never
a silent end: it is logged once with its cause, kept in `death` (the status shows it) and handed to the
owner's `on_death` (which marks the pipeline or the daemon failed). Each thread is named for the OS too
(see osthread.py) and may lower its own priority first.

A thread given a `Restart` policy heals: after a death its body runs again, after a backoff (1 s, 2 s, 4 s …
up to `max_s`), until the owner stops it. While it has not yet run `healthy_after_s` cleanly since its last
death, `trouble()` names the death (so status stays degraded and says why); `loop_deaths` deaths within
`loop_window_s` are a crash loop and said so. Which threads restart and which end the daemon instead is a
choice per thread, written where each is made (docs/security.md lists them).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from edged.core.backoff import Backoff
from edged.core.osthread import name_os_thread, yield_cpu_to_delivery

log = logging.getLogger(__name__)

DeathHook = Callable[[str], object]


@dataclass(frozen=True)
class Restart:
    """How a supervised thread comes back after a death."""

    first_s: float = 1.0  # the first backoff
    max_s: float = 60.0  # the longest backoff (a crash loop waits this long between tries)
    healthy_after_s: float = 60.0  # clean running after which a death is forgotten (status running again)
    loop_deaths: int = 3  # this many deaths …
    loop_window_s: float = 300.0  # … within this long are a crash loop


class Supervised(threading.Thread):
    """A named daemon thread running `body()` (or `target`) under supervision.

    `nice`: raise the thread's nice value by this much first (capture and inference yield to delivery).
    `on_death(why)` is called when the body raises; `on_exit()` whenever it ends, however it ends.
    `restart`: run the body again after a death (see the module docstring); `end_restarts()` stops that.
    """

    def __init__(
        self,
        name: str,
        *,
        target: Callable[[], object] | None = None,
        nice: int = 0,
        on_death: DeathHook | None = None,
        restart: Restart | None = None,
    ) -> None:
        super().__init__(name=name, daemon=True)
        self._body_target = target
        self._nice = nice
        self.on_death = on_death
        self.on_exit: Callable[[], object] | None = None
        self.death: str | None = None  # "<Exception>: <message>" once the body raised
        self.restart = restart
        self.restarts = 0  # how many times the body ran again after a death
        self._deaths: list[float] = []  # monotonic times of the deaths within the crash-loop window
        self._back_since: float | None = None  # when the body last started again after a death
        self._no_restart = threading.Event()

    def body(self) -> None:
        """What the thread does; subclasses override it (or pass `target`)."""
        if self._body_target is not None:
            self._body_target()

    def end_restarts(self) -> None:
        """No restart from now on (the owner is stopping): a thread waiting to restart ends at once."""
        self._no_restart.set()

    def run(self) -> None:
        """The guard around `body()`, and the restarts."""
        name_os_thread()
        if self._nice:
            yield_cpu_to_delivery(self._nice)
        backoff = Backoff(self.restart.first_s, self.restart.max_s) if self.restart else None
        try:
            while True:
                started = time.monotonic()
                if self._guarded_body():
                    return
                if backoff is None or self.restart is None:
                    return
                if time.monotonic() - started >= self.restart.healthy_after_s:
                    backoff.reset()  # it had run well: a new death starts from the short wait again
                if self._no_restart.wait(backoff.next_delay()):
                    return
                self.restarts += 1
                self._back_since = time.monotonic()
                log.warning("thread %s restarted (%d so far) after: %s", self.name, self.restarts, self.death)
        finally:
            if self.on_exit is not None:
                self.on_exit()

    def _guarded_body(self) -> bool:
        """Run the body once: True when it returned, False when it raised (recorded and reported)."""
        try:
            self.body()
        except BaseException as exc:
            self.death = f"{type(exc).__name__}: {exc}"
            self._back_since = None  # not back until it runs again (a healed thread that dies is not healed)
            now = time.monotonic()
            window = self.restart.loop_window_s if self.restart else 0.0
            self._deaths = [t for t in self._deaths if now - t < window] + [now]
            log.exception("thread %s died: %s", self.name, self.death)
            if self.on_death is not None:
                self.on_death(self.death)
            return False
        return True

    def died(self) -> str | None:
        """`thread <name> died: <cause>` when the body raised, else None."""
        return f"thread {self.name} died: {self.death}" if self.death is not None else None

    def trouble(self) -> str | None:
        """The reasons line of this thread, or None while it works: dead (and not coming back), restarting,
        restarted lately, or in a crash loop."""
        if not self.ident or (self.death is None and self.is_alive()):
            return None  # not started yet, or never died
        if self.death is None:
            return f"thread {self.name} died"
        policy = self.restart
        if policy is None or not self.is_alive():
            return self.died()
        return self._healing(policy)

    def _healing(self, policy: Restart) -> str | None:
        back = self._back_since
        if back is not None and time.monotonic() - back >= policy.healthy_after_s:
            return None  # ran cleanly long enough since the last restart: healed
        recent = len(self._deaths)
        if recent >= policy.loop_deaths:
            window = policy.loop_window_s / 60
            return f"thread {self.name} in a crash loop: {recent} deaths in {window:.0f} min; last: {self.death}"
        verb = "restarting" if back is None else "restarted"
        return f"thread {self.name} {verb} after: {self.death}"
