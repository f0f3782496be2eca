"""Sensor transports: serial/character device, named pipe, tailed file, supervised command, UDP.

Every transport reads with a timeout (poll/select on a non-blocking descriptor, or a short sleep for a
regular file), so the source thread sees its stop flag within one poll interval. `read` returns the bytes
that arrived (b"" when none did within the timeout) or None when the input ended for good (device gone,
command exited); it raises OSError on a read error.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import socket
import stat
import subprocess
import termios
import time
import tty
from pathlib import Path

log = logging.getLogger(__name__)

CHUNK = 65536
PROC_TERM_S = 2.0  # a helper command gets this long to exit after SIGTERM, then SIGKILL


class Transport:
    """Base of the transports. `datagrams`: each read is one complete message (UDP)."""

    datagrams = False

    def read(self, timeout: float) -> bytes | None:
        """Bytes that arrived within `timeout` (b"" if none); None once the input has ended."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the descriptor / socket / child process."""


class FdTransport(Transport):
    """A non-blocking descriptor read with poll(): serial ports, ptys, named pipes, pipes from a child."""

    def __init__(self, fd: int, *, keep: tuple[int, ...] = ()) -> None:
        self.fd = fd
        self._keep = keep  # more descriptors to close with this one (a FIFO's keep-alive writer)
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN | select.POLLPRI)

    def read(self, timeout: float) -> bytes | None:
        """poll, then read what is there."""
        events = self._poll.poll(timeout * 1000.0)
        if not events:
            return b""
        try:
            data = os.read(self.fd, CHUNK)
        except BlockingIOError:
            return b""
        except OSError as exc:
            if exc.errno == errno.EIO:  # the other side of a tty/pty went away
                return None
            raise
        return data or None

    def close(self) -> None:
        """Close every descriptor."""
        for fd in (self.fd, *self._keep):
            with contextlib.suppress(OSError):
                os.close(fd)


def baud_constant(baud: int) -> int:
    """termios speed constant of a baud rate; ValueError when this platform has none."""
    value = getattr(termios, f"B{baud}", None)
    if value is None:
        raise ValueError(f"baud rate {baud} is not supported by this platform's termios")
    return int(value)


def open_serial(path: Path, baud: int, raw: bool) -> FdTransport:
    """Open a serial port / character device, set its speed and (optionally) raw mode with termios."""
    fd = os.open(path, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
    try:
        if os.isatty(fd):
            attrs = termios.tcgetattr(fd)
            speed = baud_constant(baud)
            attrs[4] = attrs[5] = speed  # ispeed, ospeed
            attrs[2] |= termios.CLOCAL | termios.CREAD  # no modem control lines; enable the receiver
            attrs[6][termios.VMIN] = 0
            attrs[6][termios.VTIME] = 0
            termios.tcsetattr(fd, termios.TCSANOW, attrs)
            if raw:
                tty.setraw(fd, termios.TCSANOW)  # 8N1, no echo, no line editing, no CR/LF translation
    except (termios.error, ValueError) as exc:
        os.close(fd)
        raise OSError(f"cannot configure {path}: {exc}") from exc
    except BaseException:
        os.close(fd)
        raise
    return FdTransport(fd)


def open_fifo(path: Path) -> FdTransport:
    """Open a named pipe (created when missing) for reading, holding a writer of our own open.

    The keep-alive writer means a producer that exits and comes back is not an end of input for us: the
    data just pauses (the status then says "waiting for data"), and poll() never spins on a hang-up.
    """
    try:
        os.mkfifo(path, 0o660)
        log.info("created named pipe %s", path)
    except FileExistsError:
        pass
    if not stat.S_ISFIFO(path.stat().st_mode):
        raise OSError(f"{path} exists and is not a named pipe")
    rfd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        wfd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        os.close(rfd)
        raise
    return FdTransport(rfd, keep=(wfd,))


class TailTransport(Transport):
    """A regular file that something appends to (`tail -F`): follows truncation and rotation."""

    def __init__(self, path: Path, from_start: bool) -> None:
        self.path = path
        self._fh = path.open("rb")
        self._ino = os.fstat(self._fh.fileno()).st_ino
        if not from_start:
            self._fh.seek(0, os.SEEK_END)

    def read(self, timeout: float) -> bytes | None:
        """Read what was appended; otherwise check for rotation and sleep for `timeout`."""
        data = self._fh.read(CHUNK)
        if data:
            return data
        try:
            st = self.path.stat()
        except FileNotFoundError:
            st = None  # rotated away and not yet recreated: keep reading the old file meanwhile
        if st is not None and (st.st_ino != self._ino or st.st_size < self._fh.tell()):
            log.info("file %s was rotated or truncated; reading it from the start", self.path)
            self._fh.close()
            self._fh = self.path.open("rb")
            self._ino = os.fstat(self._fh.fileno()).st_ino
            return b""
        time.sleep(timeout)
        return b""

    def close(self) -> None:
        """Close the file."""
        self._fh.close()


def parse_address(address: str) -> tuple[str, int]:
    """`host:port` or `[v6addr]:port` -> (host, port); ValueError when malformed."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"address must be host:port (e.g. 127.0.0.1:9000 or [::1]:9000), got {address!r}")
    return host.removeprefix("[").removesuffix("]"), int(port)


class UdpTransport(Transport):
    """A bound UDP socket; each datagram holds whole lines or whole binary records."""

    datagrams = True

    def __init__(self, address: str) -> None:
        host, port = parse_address(address)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind((host, port))
        except OSError:
            self.sock.close()
            raise
        self.sock.setblocking(False)

    @property
    def local_address(self) -> tuple[str, int]:
        """(host, port) actually bound (port 0 in the config picks a free one)."""
        host, port = self.sock.getsockname()[:2]
        return str(host), int(port)

    def read(self, timeout: float) -> bytes | None:
        """One datagram, or b"" after `timeout`."""
        ready, _, _ = select.select([self.sock], [], [], timeout)
        if not ready:
            return b""
        try:
            return self.sock.recv(CHUNK)
        except BlockingIOError:
            return b""

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()


class CommandTransport(Transport):
    """Standard output of a helper command that edged starts, reads and stops (stderr goes to our log)."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, bufsize=0)
        if self.proc.stdout is None:  # pragma: no cover  (stdout=PIPE always gives one)
            raise OSError("no stdout pipe")
        fd = self.proc.stdout.fileno()
        os.set_blocking(fd, False)
        self._fd = FdTransport(fd)
        log.info("started %s (pid %d)", argv[0], self.proc.pid)

    def read(self, timeout: float) -> bytes | None:
        """What the command printed; None once it closed its stdout (it exited)."""
        return self._fd.read(timeout)

    def close(self) -> None:
        """SIGTERM, wait, SIGKILL if it lingers; log how it ended."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(PROC_TERM_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        log.debug("%s (pid %d) exited with %s", self.argv[0], self.proc.pid, self.proc.returncode)
