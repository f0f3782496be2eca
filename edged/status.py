"""The status socket (server side, in the daemon) and the `edged status` client."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edged.errors import StatusError

log = logging.getLogger(__name__)

EXIT_HEALTHY, EXIT_DEGRADED, EXIT_NOT_RUNNING = 0, 1, 2
MAX_SOCKET_PATH = 107


class StatusServer(threading.Thread):
    """Answers every connection on a Unix socket with one JSON snapshot, then closes it."""

    def __init__(self, path: Path, snapshot: Callable[[], dict[str, Any]], mode: int = 0o660) -> None:
        super().__init__(name="edged-status", daemon=True)
        self.path = path
        self.snapshot = snapshot
        self._halt = threading.Event()
        self._sock = self._bind(path, mode)

    @staticmethod
    def _bind(path: Path, mode: int) -> socket.socket:
        if len(os.fsencode(path)) > MAX_SOCKET_PATH:
            raise StatusError(f"status socket path is too long for a Unix socket ({path}); set status.socket")
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
        if path.exists() or path.is_symlink():
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
        sock.listen(8)
        sock.settimeout(0.25)
        return sock

    def run(self) -> None:
        """Serve until stopped."""
        while not self._halt.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._halt.is_set():
                    break
                raise
            with conn:
                try:
                    body = json.dumps(self.snapshot(), separators=(",", ":")).encode() + b"\n"
                    conn.settimeout(2.0)
                    conn.sendall(body)
                except (OSError, ValueError) as exc:
                    log.debug("status client went away: %s", exc)

    def stop(self) -> None:
        """Stop serving and remove the socket file."""
        self._halt.set()
        if self.is_alive():
            self.join(timeout=2)
        self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def query(path: Path, timeout: float = 3.0) -> dict[str, Any]:
    """Read one snapshot from a running daemon; StatusError with advice when that is impossible."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(str(path))
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise StatusError(f"edged is not running (nothing answers on {path})") from exc
        except PermissionError as exc:
            raise StatusError(
                f"permission denied on {path}: run as root or as a member of the daemon's group "
                "(sudo usermod -aG edged $USER, then log in again)"
            ) from exc
        except OSError as exc:
            raise StatusError(f"cannot read status from {path}: {exc}") from exc
    try:
        data: dict[str, Any] = json.loads(b"".join(chunks))
    except json.JSONDecodeError as exc:
        raise StatusError(f"the daemon on {path} sent a malformed status: {exc}") from exc
    return data


def exit_code(snapshot: dict[str, Any]) -> int:
    """0 healthy (running), 1 anything else (degraded, starting, stopping)."""
    return EXIT_HEALTHY if snapshot.get("state") == "running" else EXIT_DEGRADED


def _age(ts: float | None) -> str:
    if not ts:
        return "never"
    return f"{max(0.0, time.time() - ts):.0f} s ago"


def _mib(n: float | None) -> str:
    return "?" if n is None else f"{n / 2**20:.1f} MiB"


def _render_spool(console: Any, spool: dict[str, Any]) -> None:
    reasons = spool.get("dropped_by_reason") or {}
    dropped = ", ".join(f"{k} {v}" for k, v in sorted(reasons.items())) or "0"
    console.print(
        f"spool  depth {spool.get('depth', 0)}  {_mib(spool.get('bytes', 0))} of {_mib(spool.get('max_bytes'))}"
        f"  oldest {spool.get('oldest_age_s', 0):.0f} s  disk free {_mib(spool.get('disk_free_bytes'))}"
    )
    line = f"       dropped {dropped}  dead letters {spool.get('dead_letters', 0)}"
    if spool.get("recovered_from"):
        line += f"  [red]damaged spool moved to {spool['recovered_from']}[/]"
    if spool.get("error"):
        line += f"  [red]{spool['error']}[/]"
    console.print(line)


def render(snapshot: dict[str, Any], *, color: bool | None = None) -> None:
    """Print the snapshot as compact tables (fits 80 columns; colour only on a TTY)."""
    from rich.console import Console  # noqa: PLC0415  (only the client needs rich)
    from rich.table import Table  # noqa: PLC0415

    console = Console(no_color=color is False, highlight=False)
    state = snapshot.get("state", "?")
    style = {"running": "green", "degraded": "yellow"}.get(state, "red")
    console.print(
        f"edged [{style}]{state}[/]  device {snapshot.get('device_id')}  up {snapshot.get('uptime_s', 0):.0f} s"
        f"  v{snapshot.get('version', '?')}"
    )
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("pipeline", "state", "fps", "frames", "drops", "reconn", "provider", "p50/p95/p99 ms"):
        table.add_column(col)
    for p in snapshot.get("pipelines", []):
        lat = p.get("latency_ms", {})
        table.add_row(
            p.get("name", "?"),
            p.get("state", "?"),
            f"{p.get('fps', 0):.1f}",
            str(p.get("frames", 0)),
            str(p.get("dropped_frames", 0)),
            str(p.get("reconnects", 0)),
            (p.get("provider") or "-").replace("ExecutionProvider", ""),
            f"{lat.get('p50', 0):.1f}/{lat.get('p95', 0):.1f}/{lat.get('p99', 0):.1f}",
        )
    console.print(table)
    for p in snapshot.get("pipelines", []):
        model = p.get("model") or {}
        line = f"  {p.get('name')}: {p.get('source')}  model {model.get('name')} {str(model.get('sha256'))[:12]}"
        if p.get("suppressed"):
            line += f"  suppressed {p['suppressed']} (publish filter)"
        console.print(line + (f"  [yellow]{p['error']}[/]" if p.get("error") else ""), soft_wrap=True)
    _render_spool(console, snapshot.get("spool", {}))
    mqtt = snapshot.get("mqtt", {})
    if not mqtt.get("enabled", True):
        console.print("mqtt   disabled (results stay in the spool)")
        return
    conn = "[green]connected[/]" if mqtt.get("connected") else "[yellow]disconnected[/]"
    console.print(
        f"mqtt   {conn} {mqtt.get('broker', '')}  published {mqtt.get('published', 0)}"
        f"  last {_age(mqtt.get('last_publish_ts'))}"
        + (f"  [yellow]{mqtt['last_error']}[/]" if mqtt.get("last_error") else "")
    )
