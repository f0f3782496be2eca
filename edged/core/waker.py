"""A wake-up a thread can sleep on in select(), poked from anywhere: other threads and signal handlers.

A socket pair: `poke()` sends one byte (non-blocking, no lock taken, so it is safe in a signal handler,
where an Event's set() could deadlock against the main thread entering Event.wait); the sleeper selects
on `fileno()` and calls `drain()` after it wakes. A poke on a closed waker fails quietly (a late signal).
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from collections.abc import Iterator


class Waker:
    """One read end to sleep on, one write end to poke."""

    def __init__(self) -> None:
        self._r, self._w = socket.socketpair()
        self._r.setblocking(False)
        self._w.setblocking(False)

    def fileno(self) -> int:
        """The read end, for select() and selectors."""
        return self._r.fileno()

    def signal_fd(self) -> int:
        """The write end, for `signal.set_wakeup_fd`: a signal that the kernel hands to another thread
        still wakes the sleeper, so Python runs its handler now instead of when select() times out."""
        return self._w.fileno()

    @contextlib.contextmanager
    def on_signals(self) -> Iterator[None]:
        """While the main thread sleeps on this waker, every signal also pokes it. The kernel may hand
        SIGTERM to any thread; Python runs the handler only in the main thread, so without this a stop asked
        while the main thread slept waited for select() to time out. Does nothing off the main thread (tests
        run the daemon's wait() in a thread; signals are not theirs)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.set_wakeup_fd(self.signal_fd(), warn_on_full_buffer=False)
        try:
            yield
        finally:
            signal.set_wakeup_fd(previous)

    def poke(self) -> None:
        with contextlib.suppress(OSError):  # full (a wake-up is already pending) or closed
            self._w.send(b"!")

    def drain(self) -> None:
        with contextlib.suppress(OSError):
            while self._r.recv(4096):
                pass

    def close(self) -> None:
        self._r.close()
        self._w.close()
