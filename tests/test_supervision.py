"""Supervised threads that heal: a body that dies runs again after a backoff, status names it until it has
run cleanly for a while, a crash loop is said so, and a stop ends a thread that waits to restart at once."""

from __future__ import annotations

import threading

from conftest import wait_for

from edged.core.threads import Restart, Supervised
from edged.ops.reasons import explain, thread_reasons

QUICK = Restart(first_s=0.01, max_s=0.05, healthy_after_s=3.0, loop_deaths=3, loop_window_s=60.0)


class Flaky(Supervised):
    """Dies `deaths` times, then works until stopped."""

    def __init__(self, deaths: int, restart: Restart | None = QUICK) -> None:
        super().__init__("edged-flaky", restart=restart, on_death=self._note)
        self.said_at_death: list[str | None] = []  # what status said the moment each death was reported
        self.left = deaths
        self.runs = 0
        self.halt = threading.Event()
        self.kill = threading.Event()  # one more death, later
        self.wake = threading.Event()

    def body(self) -> None:
        self.runs += 1
        if self.left > 0:
            self.left -= 1
            raise RuntimeError(f"bug {self.left}")
        while not self.halt.is_set():
            self.wake.wait()  # asleep until stopped or killed
            self.wake.clear()
            if self.kill.is_set():
                self.kill.clear()
                raise RuntimeError("again")

    def _note(self, _why: str) -> None:
        self.said_at_death.append(self.trouble())

    def die_again(self) -> None:
        self.kill.set()
        self.wake.set()

    def stop(self) -> None:
        self.end_restarts()
        self.halt.set()
        self.wake.set()
        self.join(5)


def test_a_thread_that_heals_runs_again_and_status_names_it_until_it_ran_cleanly() -> None:
    thread = Flaky(deaths=1)
    thread.start()
    try:
        wait_for(lambda: thread.runs == 2, 10, "the second run")
        line = thread.trouble()
        assert line == "thread edged-flaky restarted after: RuntimeError: bug 0"
        assert explain(line) is not None  # the troubleshooting page explains it
        assert thread_reasons([thread]) == [line]
        wait_for(lambda: thread.trouble() is None, 10, "healed after a clean run")
        assert thread.restarts == 1
        assert thread.is_alive()
        thread.die_again()  # healed, then dead again: named again, not taken for healed
        wait_for(lambda: len(thread.said_at_death) == 2, 10, "the second death")
        assert thread.said_at_death[1] == "thread edged-flaky restarting after: RuntimeError: again"
    finally:
        thread.stop()
    assert not thread.is_alive()


def test_deaths_in_a_row_are_a_crash_loop() -> None:
    thread = Flaky(deaths=3, restart=Restart(first_s=0.01, max_s=0.02, healthy_after_s=60.0))
    thread.start()
    try:
        wait_for(lambda: thread.runs == 4, 10, "the fourth run")
        line = thread.trouble() or ""
        assert line.startswith("thread edged-flaky in a crash loop: 3 deaths in 5 min; last: RuntimeError")
        assert explain(line) is not None
    finally:
        thread.stop()


def test_a_stop_ends_a_thread_waiting_to_restart_at_once() -> None:
    thread = Flaky(deaths=100, restart=Restart(first_s=600.0, max_s=600.0))
    thread.start()
    wait_for(lambda: thread.death is not None, 10, "the first death")
    assert thread.trouble() == "thread edged-flaky restarting after: RuntimeError: bug 99"
    thread.stop()  # not after the 600 s backoff
    assert not thread.is_alive()
    assert thread.runs == 1


def test_a_thread_without_a_restart_policy_stays_dead_and_says_so() -> None:
    thread = Flaky(deaths=1, restart=None)
    thread.start()
    thread.join(5)
    assert not thread.is_alive()
    assert thread.trouble() == "thread edged-flaky died: RuntimeError: bug 0"
