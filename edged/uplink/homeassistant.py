"""Home Assistant MQTT discovery (`homeassistant:`; off by default).

One Home Assistant device per edged device, and per pipeline the entities a user would pick, each a
retained config on `<prefix>/<component>/<node_id>/<object_id>/config` in Home Assistant's MQTT
discovery schema (`unique_id`, `object_id`, `device`, `availability`, `state_topic`, `value_template`):

- a classifier: its top label and top score (from the results topic);
- a detector: the detections in the frame, and per label (`homeassistant.labels`, else the pipeline's
  `postprocess.classes` names) a count and a binary sensor ("person detected"); per zone and label a
  count; a tracking pipeline's active tracks (from the stats message);
- every pipeline: its frames/s and provider; the device: spool depth and dropped results (diagnostic
  entities, from the retained stats message `edged/{device_id}/stats`).

Availability is edged's retained `online` / `offline` (the last will). The configs go out, retained, on
every connection. The topics of the last set are kept in `<state_dir>/homeassistant.json`: a config
whose entity is gone (a pipeline removed, a label dropped) gets an empty retained payload, which is how
Home Assistant deletes an entity.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import Field

from edged import __version__
from edged.core.durable import read_json, write_atomic
from edged.core.settings import Strict
from edged.model.postprocess import CLASSES, DETECTIONS, SEGMENTS, produces
from edged.pipeline.settings import PipelineConfig

log = logging.getLogger(__name__)

STATE_FILE = "homeassistant.json"
Message = tuple[str, bytes]  # (topic, retained payload)


class HomeAssistantConfig(Strict):
    """Home Assistant MQTT discovery: the device and its entities appear in Home Assistant by themselves."""

    enabled: bool = Field(False, description="Publish discovery configs (retained) on every connection.")
    prefix: str = Field("homeassistant", pattern=r"^[A-Za-z0-9_-]+$", description="Home Assistant's discovery prefix.")
    name: str | None = Field(None, description="The device's name in Home Assistant (default: device_id).")
    labels: list[str] = Field(
        default_factory=list,
        description="Labels that get a count and a binary sensor on detection pipelines (default: the pipeline's "
        "postprocess.classes names).",
    )


def node_id(device_id: str) -> str:
    """Home Assistant's node and object ids allow [a-zA-Z0-9_-]: anything else becomes `_`."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", device_id)


def _label_filter(label: str) -> str:
    return f"selectattr('label', 'eq', {json.dumps(label)}) | list | count"


class Discovery:
    """The discovery configs of one device (see the module docstring)."""

    def __init__(
        self,
        cfg: HomeAssistantConfig,
        *,
        device_id: str,
        pipelines: Sequence[PipelineConfig],
        results_topic: dict[str, str],
        stats_topic: str,
        availability_topic: str,
        stats_interval_s: float = 0.0,
    ) -> None:
        self.cfg = cfg
        self.device_id = device_id
        self.node = node_id(device_id)
        self.pipelines = list(pipelines)
        self.results_topic = results_topic
        self.stats_topic = stats_topic
        # the stats message comes every stats_interval_s: its entities go unavailable when three are missed, so a
        # device gone while its broker still holds its retained `online` (ejabberd across a clean restart: the
        # will never fired) does not look alive for ever (docs/mqtt.md: availability)
        self.stats_expiry = {"expire_after": round(3 * stats_interval_s)} if stats_interval_s > 0 else {}
        self.device = {
            "identifiers": [f"edged_{self.node}"],
            "name": cfg.name or device_id,
            "manufacturer": "edged",
            "model": "edged inference daemon",
            "sw_version": __version__,
        }
        self.availability = [
            {"topic": availability_topic, "payload_available": "online", "payload_not_available": "offline"}
        ]

    def _entity(self, component: str, object_id: str, name: str, **fields: Any) -> tuple[str, dict[str, Any]]:
        oid = f"{self.node}_{node_id(object_id)}"
        payload = {
            "name": name,
            "unique_id": f"edged_{oid}",
            "object_id": oid,
            "device": self.device,
            "availability": self.availability,
            **fields,
        }
        return f"{self.cfg.prefix}/{component}/{self.node}/{node_id(object_id)}/config", payload

    def _stats(self, pipeline: str, key: str) -> str:
        return f"{{{{ (value_json.pipelines | selectattr('name', 'eq', {json.dumps(pipeline)}) | first).{key} }}}}"

    def configs(self) -> list[tuple[str, dict[str, Any]]]:
        """Every entity's (config topic, config), in a stable order."""
        out = []
        for p in self.pipelines:
            out += self._pipeline(p)
        diag = {"state_topic": self.stats_topic, "entity_category": "diagnostic", "state_class": "measurement",
                **self.stats_expiry}  # fmt: skip
        out.append(self._entity("sensor", "spool_depth", "Spool depth", value_template="{{ value_json.spool.depth }}",
                                unit_of_measurement="results", **diag))  # fmt: skip
        out.append(self._entity("sensor", "spool_dropped", "Results dropped",
                                value_template="{{ value_json.spool.dropped }}", unit_of_measurement="results",
                                **{**diag, "state_class": "total_increasing"}))  # fmt: skip
        return out

    def _pipeline(self, p: PipelineConfig) -> list[tuple[str, dict[str, Any]]]:
        name, results = p.name, self.results_topic[p.name]
        out = []
        kind = produces(p.postprocess)
        if kind == CLASSES:
            out.append(self._entity("sensor", f"{name}_top_label", f"{name} top label", state_topic=results,
                                    value_template="{{ value_json.result.top[0].label if value_json.result.top "
                                                   "else 'none' }}"))  # fmt: skip
            out.append(self._entity("sensor", f"{name}_top_score", f"{name} top score", state_topic=results,
                                    state_class="measurement", value_template="{{ value_json.result.top[0].score "
                                    "| round(3) if value_json.result.top else 0 }}"))  # fmt: skip
        elif kind == DETECTIONS:  # detect, centernet, gfl, text, detr, a plugin's
            out += self._detections(p, results)
        elif kind == SEGMENTS:
            out += self._segments(p, results)
        diag = {"state_topic": self.stats_topic, "entity_category": "diagnostic", **self.stats_expiry}
        out.append(self._entity("sensor", f"{name}_fps", f"{name} frames/s", value_template=self._stats(name, "fps"),
                                unit_of_measurement="fps", state_class="measurement", **diag))  # fmt: skip
        out.append(self._entity("sensor", f"{name}_provider", f"{name} provider",
                                value_template=self._stats(name, "provider"), **diag))  # fmt: skip
        if p.tracking.enabled:
            out.append(self._entity("sensor", f"{name}_tracks", f"{name} tracked objects", state_class="measurement",
                                    value_template=self._stats(name, "tracks"), state_topic=self.stats_topic,
                                    **self.stats_expiry))  # fmt: skip
        return out

    def labels(self, p: PipelineConfig) -> list[str]:
        """The labels a detection pipeline's per-label entities are for."""
        if self.cfg.labels:
            return list(self.cfg.labels)
        classes = getattr(p.postprocess, "classes", None) or []
        return [c for c in classes if isinstance(c, str)]

    def _detections(self, p: PipelineConfig, results: str) -> list[tuple[str, dict[str, Any]]]:
        name = p.name
        count = "{{ value_json.result.detections | count }}"
        out = [self._entity("sensor", f"{name}_detections", f"{name} detections", state_topic=results,
                            value_template=count, state_class="measurement")]  # fmt: skip
        for label in self.labels(p):
            n = f"value_json.result.detections | {_label_filter(label)}"
            out.append(self._entity("sensor", f"{name}_{label}_count", f"{name} {label} count", state_topic=results,
                                    value_template=f"{{{{ {n} }}}}", state_class="measurement"))  # fmt: skip
            out.append(self._entity("binary_sensor", f"{name}_{label}", f"{name} {label} detected",
                                    state_topic=results, value_template=f"{{{{ 'ON' if ({n}) > 0 else 'OFF' }}}}",
                                    payload_on="ON", payload_off="OFF",
                                    **({"device_class": "occupancy"} if label == "person" else {})))  # fmt: skip
            for zone in p.zones:
                if zone.labels and label not in zone.labels:
                    continue
                z = json.dumps(zone.name)
                template = f"{{{{ value_json.result.zones[{z}].labels.get({json.dumps(label)}, 0) }}}}"
                out.append(self._entity("sensor", f"{name}_{zone.name}_{label}_count",
                                        f"{name} {zone.name} {label} count", state_topic=results,
                                        value_template=template, state_class="measurement"))  # fmt: skip
        return out

    def _segments(self, p: PipelineConfig, results: str) -> list[tuple[str, dict[str, Any]]]:
        """Per label (homeassistant.labels, else the classes the pipeline reports): the share of the frame it
        covers (%) and whether it is there at all."""
        name, out = p.name, []
        for label in self.labels(p):
            area = (
                f"(value_json.result.segments | selectattr('label', 'eq', {json.dumps(label)}) "
                "| map(attribute='area') | first | default(0))"
            )
            out.append(self._entity("sensor", f"{name}_{label}_area", f"{name} {label} area", state_topic=results,
                                    value_template=f"{{{{ ({area} * 100) | round(2) }}}}", unit_of_measurement="%",
                                    state_class="measurement"))  # fmt: skip
            out.append(self._entity("binary_sensor", f"{name}_{label}", f"{name} {label} present",
                                    state_topic=results, value_template=f"{{{{ 'ON' if {area} > 0 else 'OFF' }}}}",
                                    payload_on="ON", payload_off="OFF"))  # fmt: skip
        return out

    def messages(self, state_dir: Path) -> list[Message]:
        """The retained messages for this connection: every config, and an empty one for each config
        published before whose entity is gone; remembers the set in `<state_dir>/homeassistant.json`."""
        current = (
            [(t, json.dumps(c, separators=(",", ":")).encode()) for t, c in self.configs()] if self.cfg.enabled else []
        )
        path = state_dir / STATE_FILE
        saved = read_json(path, "homeassistant")  # absent or torn: nothing to delete is remembered
        before = {str(t) for t in saved} if isinstance(saved, list) else set()
        topics = {t for t, _ in current}
        gone = sorted(before - topics)
        try:
            write_atomic(path, json.dumps(sorted(topics)).encode("utf-8"), mode=0o640)
        except OSError as exc:
            log.warning("homeassistant: cannot remember the discovery topics in %s: %s", path, exc.strerror)
        if gone:
            log.info("homeassistant: removing %d entities that are gone", len(gone))
        return current + [(t, b"") for t in gone]
