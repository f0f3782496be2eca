"""`edged check-config`: every check `edged run` makes before it opens a device.

First the schema (every key, every cross-field rule: min/max pairs, TLS pairs, topics, unique names),
then each pipeline's model as `run` would prepare it: ONNX Runtime loads it, its input fits the
preprocessing (or the sensor window), the postprocessing fits its outputs (labels against the classes or
the detection head, a forced head format against the head's layout); on the CPU, without warm-up runs.
Each problem is one line, `file:line key=value: message`, the line of the key at fault.
"""

from __future__ import annotations

from pathlib import Path

from edged.config import Config, ConfigLocator, load_config
from edged.core.errors import ConfigError
from edged.pipeline.model import check_pipeline_model


def check_config(path: Path) -> Config:
    """The validated config, or ConfigError listing every problem (schema first, then the models)."""
    config = load_config(path)
    where = ConfigLocator(path)
    problems = []
    for i, p in enumerate(config.pipelines):
        found = check_pipeline_model(p, config.state_dir)
        if found is not None:
            key, why = found
            at = tuple(int(part) if part.isdigit() else part for part in key.split("."))
            problems.append(where.problem(("pipelines", i, *at), why))
    if problems:
        raise ConfigError(problems)
    return config
