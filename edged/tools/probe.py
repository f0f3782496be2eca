"""Does a pipeline's model load and run here? `python -m edged.tools.probe CONFIG PIPELINE`.

The daemon runs this in a child process at start for a model that died with the daemon before it ran cleanly
(pipeline/lastgood.py): the same loader as the daemon's, warm-up runs included, so a model that crashes ONNX
Runtime (a native crash: SIGSEGV, an abort) takes this process down, not the daemon. Exit 0: it loads and runs;
1: it does not (why on stderr); killed by a signal: it crashed.
"""

from __future__ import annotations

import sys
from pathlib import Path

from edged.config import load_config
from edged.core.errors import EdgedError
from edged.pipeline.model import load_pipeline_model


def main(argv: list[str]) -> int:
    """Load the pipeline's model as `edged run` would."""
    if len(argv) != 3:
        sys.stderr.write("usage: python -m edged.tools.probe CONFIG PIPELINE\n")
        return 2
    try:
        config = load_config(Path(argv[1]))
        pipeline = next((p for p in config.pipelines if p.name == argv[2]), None)
        if pipeline is None:
            sys.stderr.write(f"no pipeline {argv[2]!r} in {argv[1]}\n")
            return 2
        load_pipeline_model(pipeline, config.state_dir, cores=1)
    except EdgedError as exc:
        sys.stderr.write(f"{exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
