"""What an MQTT 5 broker says it accepts in its CONNACK, and what its reason codes mean to an operator.

A client MUST NOT send a packet larger than the server's Maximum Packet Size [MQTT-3.2.2-15] nor keep more
QoS 1 publishes unacknowledged than its Receive Maximum [MQTT-3.3.4-7]; paho enforces neither, so the
publisher reads them here on every connection: in flight = the smaller of `mqtt.max_inflight` and Receive
Maximum (paho's own in-flight window), and a message larger than Maximum Packet Size is never sent (a result
that cannot fit is a dead letter at once, with both sizes in its reason). Server Keep Alive replaces
`keepalive_s` (paho applies it); Topic Alias Maximum needs nothing (edged sends no aliases); an Assigned Client
Identifier is logged. Maximum QoS 0 (results are acknowledged with QoS 1, so none could be) and Retain
Available 0 (the availability topic and Home Assistant discovery are retained) are status reasons.

MQTT 3.1.1 brokers send no properties: no limits beyond the protocol's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from paho.mqtt.properties import Properties

PROTOCOL_MAX_PACKET = 268_435_460  # a remaining length of 268,435,455 plus the fixed header

# reason codes whose bare name does not tell an operator what happened or what to do
EXPLAINED = {
    0x84: 'the broker does not speak this MQTT version: set mqtt.protocol: "3.1.1"',
    0x85: "the broker refused the client id {client_id!r}: set mqtt.client_id",
    0x86: "the broker refused the user name or password (mqtt.username, mqtt.password_file)",
    0x87: "the broker does not allow this client to connect (its ACL or auth plugin)",
    0x8E: "another client with client id {client_id!r} took the session (two devices with one device_id or "
    "mqtt.client_id?)",
    0x93: "the broker's Receive Maximum was exceeded",
    0x95: "a packet was larger than the broker accepts",
    0x97: "the broker's quota was exceeded",
    0x9A: "the broker does not support retained messages",
    0x9B: "the broker does not support QoS 1",
    0x9C: "the broker asks to use another server",
    0x9D: "the broker has moved",
}


@dataclass(frozen=True)
class BrokerLimits:
    """A CONNACK's limits (None / the protocol's default where the broker said nothing)."""

    max_packet: int | None = None
    receive_max: int | None = None
    topic_alias_max: int = 0
    keepalive_s: int | None = None
    assigned_id: str | None = None
    max_qos: int = 2
    retain: bool = True

    @classmethod
    def from_properties(cls, props: Any) -> BrokerLimits:
        """From paho's CONNACK properties (None or without the attributes under MQTT 3.1.1)."""

        def get(name: str) -> Any:
            return getattr(props, name, None) if props is not None else None

        return cls(
            max_packet=get("MaximumPacketSize"),
            receive_max=get("ReceiveMaximum"),
            topic_alias_max=get("TopicAliasMaximum") or 0,
            keepalive_s=get("ServerKeepAlive"),
            assigned_id=get("AssignedClientIdentifier"),
            max_qos=2 if get("MaximumQoS") is None else int(get("MaximumQoS")),
            retain=get("RetainAvailable") != 0,
        )

    def inflight(self, configured: int) -> int:
        """The in-flight window: `mqtt.max_inflight`, or the broker's Receive Maximum when smaller."""
        return min(configured, self.receive_max) if self.receive_max else configured

    def fits(self, size: int) -> bool:
        """Whether a packet of `size` bytes may be sent."""
        return size <= (self.max_packet or PROTOCOL_MAX_PACKET)

    def problems(self, qos: int) -> list[str]:
        """What the broker cannot do that edged needs (status reasons)."""
        out = []
        if self.max_qos < qos:
            out.append(
                f"the broker grants QoS {self.max_qos} at most (CONNACK Maximum QoS): results need QoS {qos} "
                "acknowledgements, so they stay in the spool"
            )
        if not self.retain:
            out.append(
                "the broker does not keep retained messages (CONNACK Retain Available 0): the availability "
                "topic and Home Assistant discovery are sent without retain"
            )
        return out

    def describe(self) -> dict[str, Any]:
        """The limits the broker set, for `edged status --json` (mqtt.broker_limits)."""
        out: dict[str, Any] = {
            "max_packet": self.max_packet,
            "receive_max": self.receive_max,
            "topic_alias_max": self.topic_alias_max,
            "keepalive_s": self.keepalive_s,
            "max_qos": self.max_qos,
            "retain": self.retain,
        }
        if self.assigned_id:
            out["assigned_client_id"] = self.assigned_id
        return {k: v for k, v in out.items() if v is not None}


def varint_size(n: int) -> int:
    """Bytes of an MQTT variable byte integer."""
    size = 1
    while n >= 128:  # seven bits a byte
        n //= 128
        size += 1
    return size


def publish_size(topic: str, payload: bytes, qos: int, props: Properties | None, *, mqtt5: bool = True) -> int:
    """The size of the PUBLISH packet paho will send: fixed header, topic, packet id, properties (MQTT 5: at
    least their length, 0), payload."""
    remaining = 2 + len(topic.encode("utf-8")) + (2 if qos else 0) + len(payload)
    if props is None:
        remaining += 1 if mqtt5 else 0
    else:
        remaining += len(props.pack())  # type: ignore[no-untyped-call]  # the property length is packed with them
    return 1 + varint_size(remaining) + remaining


# a lost connection's reason as paho reports it: 0x80 is paho's own word for a socket that closed without any
# DISCONNECT (a broker stopped, even cleanly when it speaks 3.1.1 or says nothing; a network that dropped)
CLOSED = {
    0x80: "the connection closed without a DISCONNECT (the broker stopped or restarted, or the network dropped)",
    0x8B: "the broker is shutting down",
}


def describe_disconnect(reason: Any, client_id: str) -> str:
    """Why a connection that worked was lost, in words (see CLOSED), else as describe_reason."""
    value = getattr(reason, "value", None)
    if isinstance(value, int) and value in CLOSED:
        return f"{CLOSED[value]}: {reason} (0x{value:02X})"
    return describe_reason(reason, client_id)


def describe_reason(reason: Any, client_id: str) -> str:
    """A CONNACK or DISCONNECT reason as an operator reads it: its name and code, and what it means when the
    name alone does not say (a takeover, a version the broker does not speak, a limit)."""
    value = getattr(reason, "value", None)
    name = str(reason)
    if not isinstance(value, int):
        return name
    code = f"{name} (0x{value:02X})"
    explained = EXPLAINED.get(value)
    return f"{explained.format(client_id=client_id)}: {code}" if explained else code
