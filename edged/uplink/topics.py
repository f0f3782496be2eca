"""Every topic the device publishes its own messages on, from the `mqtt` section's templates: the uplink
names them, and the daemon only hands them to the parts (a pipeline's results and events, the gaps, the stats,
the availability, the clock and replay topics). Remote control's topics come from `control:` (control/)."""

from __future__ import annotations

from dataclasses import dataclass

from edged.uplink.mqttclient import topic_for
from edged.uplink.settings import MqttConfig


@dataclass(frozen=True)
class Topics:
    """The topics of one device."""

    cfg: MqttConfig
    device_id: str

    def results(self, pipeline: str) -> str:
        """Where a pipeline's results go (`mqtt.topic`)."""
        return topic_for(self.cfg.topic, self.device_id, pipeline)

    def events(self, pipeline: str) -> str:
        """Where a pipeline's tracking events go (`mqtt.events_topic`)."""
        return topic_for(self.cfg.events_topic, self.device_id, pipeline)

    def gaps(self, pipeline: str) -> str:
        """Where a pipeline's seq gaps are announced (`mqtt.gaps_topic`)."""
        return topic_for(self.cfg.gaps_topic, self.device_id, pipeline)

    @property
    def stats(self) -> str:
        return topic_for(self.cfg.stats_topic, self.device_id)

    @property
    def availability(self) -> str:
        return topic_for(self.cfg.availability_topic, self.device_id)

    @property
    def clock(self) -> str:
        return topic_for(self.cfg.clock_topic, self.device_id)

    @property
    def replay(self) -> str:
        return topic_for(self.cfg.replay_topic, self.device_id)
