"""sd_notify (READY, STATUS, STOPPING, RELOADING, WATCHDOG). Uses systemd-python when installed, else speaks
the protocol itself."""

from __future__ import annotations

import importlib
import logging
import os
import socket

log = logging.getLogger(__name__)


def notify(message: str) -> bool:
    """Send one notify message (e.g. "READY=1") to systemd; False when not started by systemd."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    try:
        daemon = importlib.import_module("systemd.daemon")  # the optional systemd-python extra
    except ImportError:
        pass
    else:
        return bool(daemon.notify(message))
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(message.encode("utf-8"))
    except OSError as exc:
        log.debug("sd_notify to %s failed: %s", address, exc)
        return False
    return True


def watchdog_interval() -> float | None:
    """How often to send WATCHDOG=1 (half of WatchdogSec=), or None when systemd set no watchdog for us."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return max(0.05, int(usec) / 2e6)
    except ValueError:
        return None
