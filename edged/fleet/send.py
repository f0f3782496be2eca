"""`edged fleet`: make a signing key, and send signed commands to a device or a group, collecting replies.

A command is published on the device's (or the group's) command topic with an MQTT 5 response topic of
this sender's own and the command id as correlation data; every device that runs it answers there. A device
that refuses a command before it can trust it (a key it does not know, a tampered or stale message) sends no
private reply and cannot echo an id it did not verify: it answers on its public replies topic with the
SHA-256 of the bytes it got (`command_sha256`), which the sender matches against what it published.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edged.control.envelope import command_topic
from edged.core.errors import EdgedError, InputError
from edged.core.safejson import loads
from edged.core.secrets import read_secret
from edged.core.signing import sign
from edged.uplink.mqttclient import BrokerAccess, make_client

MAX_REPLY_BYTES = 16 << 20  # a `status` reply carries the status JSON (a few KiB)

REPLY_PREFIX = "edged/fleet/replies"
Listener = Callable[[str, dict[str, Any]], None]


@dataclass
class BrokerOptions:
    """How the fleet tool reaches the broker."""

    host: str = "localhost"
    port: int = 1883
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    username: str | None = None
    password_file: Path | None = None


@dataclass
class Replies:
    """Replies to one command id, by device."""

    by_device: dict[str, dict[str, Any]] = field(default_factory=dict)
    arrived: threading.Condition = field(default_factory=threading.Condition)


class FleetClient:
    """One MQTT 5 connection that sends signed commands and collects the answers."""

    def __init__(self, broker: BrokerOptions, key: Ed25519PrivateKey) -> None:
        self.key = key
        self.client_id = f"edged-fleet-{uuid.uuid4().hex[:8]}"
        self.reply_topic = f"{REPLY_PREFIX}/{self.client_id}"
        self._replies: dict[str, Replies] = {}
        self._by_digest: dict[str, Replies] = {}  # refusals that cannot echo the id: by the command's SHA-256
        self._listeners: list[tuple[str, Listener]] = []
        self._lock = threading.Lock()
        self._ready = threading.Event()
        password = read_secret(broker.password_file, "MQTT password file") if broker.password_file else None
        access = BrokerAccess(broker.username, password, bool(broker.ca_file or broker.cert_file), broker.ca_file,
                              broker.cert_file, broker.key_file)  # fmt: skip
        client = make_client(self.client_id, access)
        client.on_connect = lambda c, _u, _f, _rc, _p: c.subscribe(self.reply_topic, qos=1)
        client.on_subscribe = lambda *_: self._ready.set()
        client.on_message = self._on_message
        try:
            client.connect(broker.host, broker.port)
        except OSError as exc:
            raise EdgedError(f"cannot connect to {broker.host}:{broker.port}: {exc}") from exc
        client.loop_start()
        self.client = client
        if not self._ready.wait(15):
            self.close()
            raise EdgedError(f"no answer from the broker at {broker.host}:{broker.port}")

    def listen(self, topic_filter: str, listener: Listener, timeout: float = 15.0) -> None:
        """Subscribe and call `listener(topic, body)` for each message on it (paho's thread): the JSON
        object, or {"text": ...} for anything else; returns once the broker granted the subscription, so
        retained messages follow."""
        granted = threading.Event()
        with self._lock:
            self._listeners.append((topic_filter, listener))
        self.client.on_subscribe = lambda *_: granted.set()
        self.client.subscribe(topic_filter, qos=1)
        if not granted.wait(timeout):
            raise EdgedError(f"the broker did not grant the subscription to {topic_filter}")

    def _on_message(self, _c: paho.Client, _u: Any, msg: paho.MQTTMessage) -> None:
        try:  # anyone on the broker may publish on a device's events topic: bounded, never a dead paho thread
            body = loads(bytes(msg.payload), max_bytes=MAX_REPLY_BYTES, what="reply")
        except InputError:
            body = None
        if not isinstance(body, dict):  # a listener may want plain text too (edged/<device>/status: online)
            body = {"text": bytes(msg.payload).decode("utf-8", "replace")}
        with self._lock:
            listeners = [fn for f, fn in self._listeners if paho.topic_matches_sub(f, msg.topic)]
            replies = self._replies.get(str(body.get("id"))) if msg.topic == self.reply_topic else None
            if replies is None and body.get("id") is None and body.get("ok") is False:
                replies = self._by_digest.get(str(body.get("command_sha256")))
        for listener in listeners:
            listener(msg.topic, body)
        if replies is None:
            return
        with replies.arrived:
            replies.by_device[str(body.get("device"))] = body
            replies.arrived.notify_all()

    def send(self, envelope: dict[str, Any]) -> Replies:
        """Sign and publish; the Replies fill in as devices answer."""
        replies = Replies()
        with self._lock:
            self._replies[envelope["id"]] = replies
        props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        props.ResponseTopic = self.reply_topic
        props.CorrelationData = envelope["id"].encode()
        signed = json.dumps(sign(envelope, self.key)).encode("utf-8")
        with self._lock:
            self._by_digest[hashlib.sha256(signed).hexdigest()] = replies
        self.client.publish(command_topic(envelope["cmd"], envelope["target"]), signed, qos=1,
                            properties=props).wait_for_publish(10)  # fmt: skip
        return replies

    def wait(self, replies: Replies, *, expect: int, timeout: float) -> dict[str, dict[str, Any]]:
        """Until `expect` devices answered or `timeout` passed; the answers by device."""
        deadline = time.monotonic() + timeout
        with replies.arrived:
            while len(replies.by_device) < expect and (left := deadline - time.monotonic()) > 0:
                replies.arrived.wait(left)
            return dict(replies.by_device)

    def close(self) -> None:
        """Disconnect."""
        self.client.disconnect()
        self.client.loop_stop()
