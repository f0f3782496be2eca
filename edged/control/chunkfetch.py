"""A rollout's model over MQTT: its retained chunks collected through the publisher's connection, which
subscribes to them for the download only (and again on a new connection while it lasts)."""

from __future__ import annotations

from pathlib import Path

from edged.control.context import SideSender
from edged.control.modelfetch import MQTT_PREFIX, ChunkCollector, write_chunks
from edged.core.errors import CommandError
from edged.uplink.hooks import Incoming
from edged.uplink.sidechannel import SideMessage


class ChunkFetch:
    """At most one download at a time (commands run one at a time); `offer` is called on paho's thread."""

    def __init__(self, side: SideSender | None, state_dir: Path) -> None:
        self.side = side
        self.models = state_dir / "models"
        self._collector: ChunkCollector | None = None

    def fetch(self, sha256: str, max_bytes: int, timeout: float) -> Path:
        """The model's file, once every chunk came and its hash is the one named (CommandError if not)."""
        if self.side is None:
            raise CommandError("failed", "no MQTT connection to fetch the model over")
        collector = ChunkCollector(sha256, max_bytes)
        topic = f"{MQTT_PREFIX}/{sha256}/#"
        self._collector = collector
        self.side.send(SideMessage(topic, b"", op="subscribe", on_message=self._message))
        try:
            collector.done.wait(timeout)
        finally:
            self._collector = None
            self.side.send(SideMessage(topic, b"", op="unsubscribe"))
        return write_chunks(collector, self.models, max_bytes=max_bytes)

    @staticmethod
    def wants(topic: str) -> bool:
        """Whether a message belongs to the model topics (then `offer` takes it, and nothing else does)."""
        return topic.startswith(MQTT_PREFIX + "/")

    def offer(self, topic: str, payload: bytes) -> None:
        """A message on the model topics: to the download in progress when it is that model's, else dropped."""
        collector = self._collector
        if collector is not None and topic.startswith(f"{MQTT_PREFIX}/{collector.sha256}/"):
            collector.offer(topic, payload)

    def resubscribe(self) -> None:
        """A new connection while a download runs: subscribe to its chunks again."""
        collector = self._collector
        if collector is not None and self.side is not None:
            self.side.send(SideMessage(f"{MQTT_PREFIX}/{collector.sha256}/#", b"", op="subscribe",
                                       on_message=self._message))  # fmt: skip

    def _message(self, message: Incoming) -> None:
        """A chunk (paho's thread): to the download, routed here and only here."""
        if message.topic is not None:
            self.offer(message.topic, message.payload)
