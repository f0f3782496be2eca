"""A stand-in MQTT 5 server that speaks just enough of the protocol to enforce a Receive Maximum.

Why a stand-in: no broker we can install enforces it (Mosquitto 2.0 advertises `ReceiveMaximum` in its
CONNACK and tolerates QoS 1 publishes beyond it; HiveMQ and EMQX disconnect with 0x93, but are not in
Debian). This server accepts one client at a time: it answers CONNECT with a CONNACK carrying the properties
it is given, acknowledges each QoS 1 PUBLISH after `ack_delay_s` (so that a client that ignores the limit
gets far past it), answers PINGREQ, and, like those brokers, disconnects with reason 0x93 (Receive Maximum
exceeded) as soon as more publishes than its Receive Maximum are unacknowledged. It records the most it saw
in flight, the payloads, and whether it ever had to disconnect.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from dataclasses import dataclass, field

RECEIVE_MAXIMUM = 0x21  # CONNACK property identifiers (MQTT 5, 3.2.2.3)
MAXIMUM_PACKET_SIZE = 0x27


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def read_varint(sock: socket.socket) -> int:
    value, shift = 0, 0
    while True:
        byte = recv_exact(sock, 1)[0]
        value += (byte & 0x7F) << shift
        if not byte & 0x80:
            return value
        shift += 7


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


@dataclass
class StandIn:
    """The server; `start()` binds a free loopback port (`port`)."""

    receive_maximum: int
    max_packet_size: int | None = None
    ack_delay_s: float = 0.02
    port: int = 0
    max_in_flight: int = 0
    exceeded: bool = False
    payloads: list[bytes] = field(default_factory=list)
    connections: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _listener: socket.socket | None = None

    def start(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, name="mqtt5-standin", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        if self._listener is not None:
            self._listener.close()

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except (TimeoutError, OSError):
                continue
            with self._lock:
                self.connections += 1
            try:
                self._serve(conn)
            except (ConnectionError, OSError):
                pass
            finally:
                conn.close()

    def _connack(self) -> bytes:
        props = bytes([RECEIVE_MAXIMUM]) + struct.pack(">H", self.receive_maximum)
        if self.max_packet_size is not None:
            props += bytes([MAXIMUM_PACKET_SIZE]) + struct.pack(">I", self.max_packet_size)
        body = b"\x00\x00" + varint(len(props)) + props  # no session present, success
        return b"\x20" + varint(len(body)) + body

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(5)
        send = threading.Lock()
        pending: set[int] = set()

        def ack(pid: int) -> None:
            with self._lock:
                pending.discard(pid)
            with send, contextlib.suppress(OSError):
                conn.sendall(b"\x40\x02" + struct.pack(">H", pid))

        while not self._stop.is_set():
            first = recv_exact(conn, 1)[0]
            body = recv_exact(conn, read_varint(conn))
            kind = first >> 4
            if kind == 1:  # CONNECT
                with send:
                    conn.sendall(self._connack())
            elif kind == 3:  # PUBLISH
                qos = (first >> 1) & 3
                topic_len = struct.unpack(">H", body[:2])[0]
                at = 2 + topic_len
                pid = struct.unpack(">H", body[at : at + 2])[0] if qos else 0
                at += 2 if qos else 0
                props_len, used = _varint_in(body, at)
                payload = body[at + used + props_len :]
                if qos == 0:
                    continue
                with self._lock:
                    self.payloads.append(payload)
                    pending.add(pid)
                    self.max_in_flight = max(self.max_in_flight, len(pending))
                    over = len(pending) > self.receive_maximum
                    if over:
                        self.exceeded = True
                if over:  # as HiveMQ and EMQX do: DISCONNECT, reason 0x93 Receive Maximum exceeded
                    with send:
                        conn.sendall(b"\xe0\x01\x93")
                    return
                threading.Timer(self.ack_delay_s, ack, (pid,)).start()
            elif kind == 12:  # PINGREQ
                with send:
                    conn.sendall(b"\xd0\x00")
            elif kind == 14:  # DISCONNECT
                return

    def distinct(self) -> int:
        with self._lock:
            return len(set(self.payloads))


def _varint_in(data: bytes, at: int) -> tuple[int, int]:
    value, shift, used = 0, 0, 0
    while True:
        byte = data[at + used]
        used += 1
        value += (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, used
        shift += 7
