"""A wake-up a thread can sleep on in select(), poked from anywhere: other threads and signal handlers.

A socket pair: `poke()` sends one byte (non-blocking, no lock taken, so it is safe in a signal handler,
where an Event's set() could deadlock against the main thread entering Event.wait); the sleeper selects
on `fileno()` and calls `drain()` after it wakes. A poke on a closed waker fails quietly (a late signal).
"""

from __future__ import annotations

import contextlib
import socket


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
