"""The uplink's config section: `mqtt`, the broker, TLS, auth, topics and the drain."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from edged.core.settings import NAME_MAX, Size, Strict, check_order


class TlsConfig(Strict):
    """TLS to the broker. Certificates are checked, host name included, unless `insecure` says otherwise."""

    ca_file: Path | None = Field(None, description="CA bundle that signed the broker's certificate.")
    cert_file: Path | None = Field(None, description="Client certificate (mutual TLS).")
    key_file: Path | None = Field(None, description="Client key; must not be readable by others.")
    insecure: bool = Field(False, description="Skip the host-name check (a warning is logged). Testing only.")

    @model_validator(mode="after")
    def _pair(self) -> TlsConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together (mutual TLS needs both)")
        return self


TOPIC_MAX_BYTES = 65_535  # MQTT: a topic name is a UTF-8 string with a 16-bit length


def check_topic_template(template: str) -> str:
    """A topic edged can publish to whatever the names: MQTT forbids wildcards, NUL and more than 65,535
    bytes in a topic name; `$...` topics are the broker's own (Mosquitto refuses publishes to them)."""
    longest = template.replace("{device_id}", "x" * NAME_MAX).replace("{pipeline}", "x" * NAME_MAX)
    if not template:
        raise ValueError("a topic cannot be empty")
    if "+" in template or "#" in template:
        raise ValueError("a topic to publish to cannot hold the wildcards + or #")
    if template.startswith("$"):
        raise ValueError("topics starting with $ belong to the broker ($SYS/...); brokers refuse publishes there")
    if "\x00" in template:
        raise ValueError("a topic cannot hold the NUL character")
    try:
        size = len(longest.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ValueError("a topic must be valid UTF-8 text") from exc
    if size > TOPIC_MAX_BYTES:
        raise ValueError(f"{size} bytes with the longest names ({NAME_MAX} characters); MQTT allows {TOPIC_MAX_BYTES}")
    return template


class MqttConfig(Strict):
    """The broker results are published to."""

    enabled: bool = Field(True, description="false: only spool (results wait on disk).")
    host: str = Field("localhost", description="Broker host name or address.")
    port: int = Field(1883, ge=1, le=65535, description="Broker port (8883 is usual with TLS).")
    protocol: Literal["3.1.1", "5"] = Field("5", description="MQTT protocol version.")

    @field_validator("protocol", mode="before")
    @classmethod
    def _protocol_as_text(cls, value: object) -> object:
        return str(value) if isinstance(value, int | float) else value  # `protocol: 5` in YAML is a number

    qos: Literal[0, 1] = Field(1, description="1 = at-least-once: rows leave the spool on PUBACK only.")
    client_id: str | None = Field(None, description="Default edged-<device_id>.")
    keepalive_s: int = Field(30, ge=5, le=3600, description="MQTT keep-alive interval.")
    topic: str = Field(
        "edged/{device_id}/{pipeline}/results",
        description="Result topic template. Every topic is checked: not empty, no + or #, not under $ (the "
        "broker's), at most 65,535 UTF-8 bytes with 64-character names.",
    )
    events_topic: str = Field(
        "edged/{device_id}/{pipeline}/events", description="Track and zone events topic template (tracking on)."
    )
    gaps_topic: str = Field(
        "edged/{device_id}/{pipeline}/gaps",
        description="Seq ranges skipped after an unclean stop (kill -9, power cut), spooled like results: "
        "each seq in one was delivered before the stop, lost, or never used.",
    )
    availability_topic: str = Field("edged/{device_id}/status", description="Retained online/offline.")
    max_inflight: int = Field(
        32,
        ge=1,
        le=1000,
        description="Unacknowledged messages at most (every result stays in the spool until acknowledged).",
    )
    reconnect_min_s: float = Field(
        0.5, gt=0, description="First reconnect delay (capped exponential backoff with jitter)."
    )
    reconnect_max_s: float = Field(30.0, gt=0, description="Cap of the reconnect delay; at least reconnect_min_s.")
    reconnect_spread_s: float = Field(
        15.0,
        ge=0,
        description="After a lost connection, the first attempt waits a random 0..this many seconds, so a fleet "
        "does not reconnect all at once when the broker comes back (0 = at once).",
    )
    shutdown_grace_s: float = Field(3.0, ge=0, description="On stop, publish what can go within this.")
    tls: TlsConfig | None = Field(None, description="Connect with TLS (port 8883 usually).")
    username: str | None = Field(None, description="MQTT user name.")
    password_file: Path | None = Field(None, description="File holding the password; must not be readable by others.")
    password_credential: str | None = Field(
        None, description="Name of a systemd credential (LoadCredential=) holding the password."
    )
    dead_letter_after: int = Field(5, ge=1, description="A result the broker refuses this many times is set aside.")
    batch: int = Field(1, ge=1, le=1000, description="Results per message (>1: a JSON array) for slow links.")
    max_rate: float = Field(0.0, ge=0, description="Messages/s at most while draining a backlog; 0 = no limit.")
    stats_interval_s: float = Field(60.0, ge=0, description="Stats message every this many seconds; 0 = off.")
    stats_topic: str = Field("edged/{device_id}/stats", description="Stats message topic template.")
    stats_retain: bool = Field(True, description="Retain the stats message.")
    replay_topic: str = Field(
        "edged/{device_id}/replay",
        description="Replay requests come on <this>/request and are answered on <this>/answer (docs/mqtt.md: a "
        "consumer asks for results a broker lost after acknowledging them); empty: no replay.",
    )
    replay_max_bytes_per_hour: Size = Field(
        32 * 2**20,
        description="Payload bytes sent again on replay requests per hour at most, beside 1,000 results a second "
        "(twice the default window: a broker crash that lost the whole window gets it back twice an hour); what "
        "is over it is answered over_budget and comes when asked again; 0 = no hourly bound.",
    )
    clock_topic: str = Field(
        "edged/{device_id}/clock",
        description="Retained: the clock's state and the corrections for times stamped while it was not "
        'synchronized (docs/mqtt.md, "Time"); empty: not published.',
    )
    message_expiry: bool = Field(True, description="MQTT 5: messages expire when their spool TTL would.")

    @field_validator("topic", "events_topic", "gaps_topic", "availability_topic", "stats_topic")
    @classmethod
    def _publishable_topic(cls, value: str) -> str:
        return check_topic_template(value)

    @field_validator("replay_topic", "clock_topic")
    @classmethod
    def _replay_topic(cls, value: str) -> str:
        return check_topic_template(value) if value else value

    @model_validator(mode="after")
    def _backoff_order(self) -> MqttConfig:
        check_order(self, "reconnect_min_s", "reconnect_max_s")
        return self

    @model_validator(mode="after")
    def _one_password(self) -> MqttConfig:
        if self.password_file is not None and self.password_credential is not None:
            raise ValueError("give password_file or password_credential, not both")
        if (self.password_file or self.password_credential) and not self.username:
            raise ValueError("a password needs a username")
        return self
