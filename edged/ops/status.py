"""The status socket (server side, in the daemon) and the `edged status` client."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import socket
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edged.core import safejson
from edged.core.errors import InputError, StatusError
from edged.core.threads import Restart, Supervised
from edged.core.waker import Waker

log = logging.getLogger(__name__)

EXIT_HEALTHY, EXIT_DEGRADED, EXIT_NOT_RUNNING = 0, 1, 2
MAX_SOCKET_PATH = 107
CLIENT_DEADLINE_S = 2.0  # the most one status client can hold the status thread
CLIENT_READ_MAX = 1 << 20  # bytes read from a client before closing on it (it sends nothing that matters)
MAX_STATUS_BYTES = 16 << 20  # `edged status` reads at most this much (a status is a few KiB)


def accept_until_halted(
    sock: socket.socket, wake: Waker, halt: threading.Event, handle: Callable[[socket.socket, Any], None]
) -> None:
    """One connection at a time to `handle` (closed after it), asleep in select() until a client connects
    or `wake` is poked with `halt` set. `sock` is a listening, non-blocking socket."""
    with selectors.DefaultSelector() as sel:
        sel.register(sock, selectors.EVENT_READ)
        sel.register(wake, selectors.EVENT_READ)
        while not halt.is_set():
            ready = {key.fileobj for key, _ in sel.select()}
            if halt.is_set() or wake in ready:
                break
            try:
                conn, addr = sock.accept()
            except (BlockingIOError, InterruptedError):
                continue  # the client gave up between select and accept
            except OSError:
                if halt.is_set():
                    break
                raise
            with conn:
                handle(conn, addr)


class StatusServer(Supervised):
    """Answers every connection on a Unix socket with one JSON snapshot, then closes it."""

    def __init__(self, path: Path, snapshot: Callable[[], dict[str, Any]], mode: int = 0o660) -> None:
        super().__init__("edged-status", restart=Restart())  # the socket outlives the body
        self.path = path
        self.snapshot = snapshot
        self._halt = threading.Event()
        self._inode = 0
        self._sock = self._bind(path, mode)
        self._wake = Waker()

    def _bind(self, path: Path, mode: int) -> socket.socket:
        if len(os.fsencode(path)) > MAX_SOCKET_PATH:
            raise StatusError(f"status socket path is too long for a Unix socket ({path}); set status.socket")
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
        problem = socket_path_problem(path)
        if problem is not None:
            raise StatusError(f"status socket {path}: {problem}")
        if path.exists():
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.settimeout(1.0)
                try:
                    probe.connect(str(path))
                except OSError:
                    path.unlink()  # left behind by a daemon that died
                else:
                    raise StatusError(f"another edged is already running (it answers on {path})")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o777 & ~mode)  # no window in which the socket is more open than `mode`
        try:
            sock.bind(str(path))
        except OSError as exc:
            sock.close()
            raise StatusError(f"cannot create status socket {path}: {exc.strerror}") from exc
        finally:
            os.umask(old)
        path.chmod(mode)
        self._inode = path.lstat().st_ino  # stop() removes this socket, and nothing that replaced it
        sock.listen(8)
        sock.setblocking(False)  # body() accepts only what select() reported
        return sock

    def body(self) -> None:
        """Serve until stopped: asleep in select() until a client connects or `stop` pokes the waker."""
        accept_until_halted(self._sock, self._wake, self._halt, lambda conn, _addr: self._answer(conn))

    def _answer(self, conn: socket.socket) -> None:
        """One snapshot to one client, within CLIENT_DEADLINE_S whatever the client does (a client that reads
        slowly or keeps sending cannot hold the thread; the next one waits at most that long)."""
        deadline = time.monotonic() + CLIENT_DEADLINE_S
        try:
            body = json.dumps(self.snapshot(), separators=(",", ":")).encode() + b"\n"
        except Exception:  # a bug in a snapshot must not end the status thread (edged status would go dark)
            log.exception("status: building the snapshot failed")
            return
        try:
            conn.settimeout(max(0.01, deadline - time.monotonic()))
            conn.sendall(body)  # the timeout bounds the whole sendall: what is left of the deadline
            # whatever the client sent is ignored, but read it: closing with unread data resets the
            # connection, and the client could lose the answer. Bounded in time and bytes.
            conn.shutdown(socket.SHUT_WR)
            unread = CLIENT_READ_MAX
            while unread > 0 and (left := deadline - time.monotonic()) > 0:
                conn.settimeout(left)
                chunk = conn.recv(65536)
                if not chunk:
                    break
                unread -= len(chunk)
        except (OSError, ValueError) as exc:
            log.debug("status client went away: %s", exc)

    def stop(self) -> None:
        """Stop serving and remove the socket file."""
        self.end_restarts()
        self._halt.set()
        self._wake.poke()
        if self.is_alive():
            self.join(timeout=CLIENT_DEADLINE_S + 1)
        self._sock.close()
        self._wake.close()
        with contextlib.suppress(OSError):
            st = self.path.lstat()
            if stat.S_ISSOCK(st.st_mode) and st.st_ino == self._inode:  # ours, never a file put there since
                self.path.unlink()


def socket_path_problem(path: Path) -> str | None:
    """Why `path` cannot be the status socket: something that is not a socket is there (edged removes only a
    socket a dead daemon left, never a file, a folder or a link: status.socket set to the spool's path must
    not delete the spool)."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot look at it: {exc.strerror}"
    if stat.S_ISSOCK(st.st_mode):
        return None
    kind = "a folder" if stat.S_ISDIR(st.st_mode) else "a link" if stat.S_ISLNK(st.st_mode) else "a file"
    return f"{kind} is there, not a socket; edged removes only a socket it left, so pick another path"


def query(path: Path, timeout: float = 3.0) -> dict[str, Any]:
    """Read one snapshot from a running daemon; StatusError with advice when that is impossible."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(str(path))
            sock.shutdown(socket.SHUT_WR)  # no request: the server answers at once and sees EOF
            chunks, size = [], 0
            while size <= MAX_STATUS_BYTES and (chunk := sock.recv(65536)):
                chunks.append(chunk)
                size += len(chunk)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise StatusError(f"edged is not running (nothing answers on {path})") from exc
        except PermissionError as exc:
            raise StatusError(
                f"permission denied on {path}: run as root or as a member of the daemon's group "
                "(sudo usermod -aG edged $USER, then log in again)"
            ) from exc
        except OSError as exc:
            raise StatusError(f"cannot read status from {path}: {exc}") from exc
    try:  # bounded like any bytes from outside: whatever answers on the socket may not be edged
        data = safejson.loads_object(b"".join(chunks), max_bytes=MAX_STATUS_BYTES, what="status")
    except InputError as exc:
        raise StatusError(f"the daemon on {path} sent a malformed status: {exc}") from exc
    return data


def exit_code(snapshot: dict[str, Any]) -> int:
    """0 healthy (running), 1 anything else (degraded, starting, stopping)."""
    return EXIT_HEALTHY if snapshot.get("state") == "running" else EXIT_DEGRADED
