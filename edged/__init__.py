"""edged: on-device inference daemon (frames -> int8 ONNX -> durable spool -> MQTT)."""

__version__ = "0.1.0"
MESSAGE_VERSION = 1
