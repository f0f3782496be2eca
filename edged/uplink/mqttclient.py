"""Building blocks of the MQTT connection: the paho client as edged configures it, topics, properties, rate."""

from __future__ import annotations

import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edged.core.secrets import read_credential, read_secret
from edged.uplink.settings import MqttConfig

CONNECT_TIMEOUT_S = 10.0


def topic_for(template: str, device_id: str, pipeline: str = "") -> str:
    """Fill a topic template's `{device_id}` and `{pipeline}`."""
    return template.replace("{device_id}", device_id).replace("{pipeline}", pipeline)


@dataclass(frozen=True)
class BrokerAccess:
    """How to get in: credentials and TLS (the daemon's `mqtt:` section, or a fleet tool's flags)."""

    username: str | None = None
    password: str | None = None
    tls: bool = False  # verify the broker's certificate (against `ca_file`, or the system's CAs)
    ca_file: Path | None = None
    cert_file: Path | None = None  # mutual TLS
    key_file: Path | None = None
    insecure: bool = False  # skip the host-name check (testing only)

    @classmethod
    def of(cls, cfg: MqttConfig, password: str | None) -> BrokerAccess:
        """The daemon's."""
        tls = cfg.tls
        if tls is None:
            return cls(cfg.username, password)
        return cls(cfg.username, password, True, tls.ca_file, tls.cert_file, tls.key_file, tls.insecure)


def make_client(client_id: str, access: BrokerAccess, *, protocol: str = "5", **options: Any) -> paho.Client:
    """A paho client as every part of edged builds one (the daemon, `edged ingest`, `edged fleet`): paho's
    version 2 callbacks, the MQTT version, credentials, TLS that verifies the broker (no plaintext fallback).
    `options` go to paho.Client (clean_session, manual_ack, reconnect_on_failure)."""
    client = paho.Client(
        callback_api_version=CallbackAPIVersion.VERSION2,
        client_id=client_id,
        protocol=paho.MQTTv5 if protocol == "5" else paho.MQTTv311,
        **options,
    )
    if access.username:
        client.username_pw_set(access.username, access.password)
    if access.tls:
        client.tls_set(
            ca_certs=str(access.ca_file) if access.ca_file else None,
            certfile=str(access.cert_file) if access.cert_file else None,
            keyfile=str(access.key_file) if access.key_file else None,
            cert_reqs=ssl.CERT_REQUIRED,
        )
        client.tls_insecure_set(access.insecure)
    return client


def load_password(cfg: MqttConfig) -> str | None:
    """The broker password from `mqtt.password_file` or a systemd credential (never from the config itself)."""
    if cfg.password_file is not None:
        return read_secret(cfg.password_file, "MQTT password file")
    if cfg.password_credential is not None:
        return read_credential(cfg.password_credential, "MQTT password")
    return None


def new_client(
    cfg: MqttConfig, client_id: str, will_topic: str, password: str | None, *, retain: bool = True, will_qos: int = 1
) -> paho.Client:
    """A fresh paho client for one of the daemon's connections: protocol, in-flight window, last will
    (retained unless the broker refused retained messages; QoS 1 unless it refused or does not grant that),
    auth, TLS."""
    client = make_client(client_id, BrokerAccess.of(cfg, password), protocol=cfg.protocol, reconnect_on_failure=False)
    client.connect_timeout = CONNECT_TIMEOUT_S
    client.max_inflight_messages_set(cfg.max_inflight)
    client.will_set(will_topic, "offline", qos=will_qos, retain=retain)
    return client


MAX_INCOMING_BYTES = 2 << 20  # what edged takes from the broker: commands (control.max_bytes <= 1 MiB), a model's
# 256 KiB chunks; announced in CONNECT (MQTT 5 Maximum Packet Size) so that the broker drops a larger message
# instead of making the device read it whole (a 200 MiB "command" cost 218 MiB of memory, never returned)


def connect_properties(protocol: str) -> Properties | None:
    """The CONNECT properties of the daemon's connection (MQTT 5; 3.1.1 has none)."""
    if protocol != "5":
        return None
    props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
    props.MaximumPacketSize = MAX_INCOMING_BYTES
    return props


class TokenBucket:
    """Token bucket: at most `rate` messages per second (0 = unlimited), bursts of `burst` (default: one
    second's worth)."""

    def __init__(self, rate: float, burst: float | None = None) -> None:
        self.rate = rate
        self.burst = burst if burst is not None else max(1.0, rate)
        self.tokens = self.burst
        self.stamp = time.monotonic()

    def allow(self) -> int:
        """How many messages may go now."""
        if not self.rate:
            return 1 << 30
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        return int(self.tokens)

    def take(self, n: int) -> None:
        """Spend `n` messages."""
        if self.rate:
            self.tokens -= n

    def wait_s(self) -> float:
        """Seconds until one more message may go (0 when one may go now)."""
        if not self.rate or self.tokens >= 1.0:
            return 0.0
        return (1.0 - self.tokens) / self.rate


class PackedProperties(Properties):
    """MQTT 5 PUBLISH properties (content type, message expiry) packed once, not for every message.

    paho packs a message's properties each time it sends it; for a backlog that shares one object, that
    packing was about a tenth of the drain's time. The object must not change after it is built.
    """

    def __init__(self, *, content_type: str, expiry: int) -> None:
        super().__init__(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        self.ContentType = content_type
        if expiry:
            self.MessageExpiryInterval = expiry
        # Properties.__setattr__ accepts only MQTT property names
        object.__setattr__(self, "_packed", super().pack())  # type: ignore[no-untyped-call]

    def pack(self) -> bytes:
        """The packed form, as paho puts it in the PUBLISH packet."""
        packed: bytes = self.__dict__["_packed"]
        return packed


class ExpiryProperties:
    """MQTT 5 properties per distinct expiry (to the minute), built and packed once each."""

    def __init__(self, cfg: MqttConfig) -> None:
        self.cfg = cfg
        self._cache: dict[int, Properties] = {}

    def __call__(self, ttl: float) -> Properties | None:
        """Content type and expiry for a message with `ttl` seconds left to live (None for MQTT 3.1.1)."""
        if self.cfg.protocol != "5":
            return None
        expiry = 0
        if self.cfg.message_expiry:
            # the message is worth no more than its row: it expires when the spool's TTL would drop it
            # (rounded down to the minute, so one Properties object serves a whole backlog)
            remaining = max(0, int(ttl))
            expiry = max(1, remaining - remaining % 60) if remaining >= 60 else max(1, remaining)
        props = self._cache.get(expiry)
        if props is None:
            props = PackedProperties(content_type="application/json", expiry=expiry)
            self._cache = {expiry: props}  # one entry: the expiry only counts down
        return props
