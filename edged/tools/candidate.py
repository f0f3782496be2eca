"""Is a rollout's new model fit to replace the running one? `python -m edged.tools.candidate SPEC.json`.

The device's control plane runs this in a child process (a malformed model may crash ONNX Runtime; the
daemon must not go with it), after it has recorded the frames its pipeline's model saw. Two gates:

- the answers: `edged validate CURRENT CANDIDATE --data FRAMES`, with the gates the command gave;
- the speed: both models on the same recorded frame, runs interleaved (so a busy device slows both alike),
  one thread each; the candidate's median latency may be at most `max_slowdown` times the current one's.

It prints one JSON report on stdout and exits 0 when both pass, 1 when a gate fails, 2 when it cannot judge.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from edged.control.rolloutspec import CandidateSpec, Gates
from edged.core.errors import EdgedError
from edged.model.settings import PreprocessConfig
from edged.tools.common import open_model
from edged.tools.frames import load_inputs
from edged.tools.validate import Thresholds, ValidateOptions, pair_preprocessor, validate_models


def thresholds(gates: Gates) -> Thresholds:
    """Validate's thresholds with the rollout's gates set."""
    return Thresholds(**{k: v for k, v in gates.model_dump().items() if v is not None})


def check_candidate(spec: CandidateSpec) -> dict[str, Any]:
    """Both gates; `report["passed"]` and, when not, `report["failed"]` ("validation" or "speed")."""
    pre = PreprocessConfig.model_validate(spec.preprocess) if spec.preprocess else None
    opts = ValidateOptions(data=spec.frames, limit=500, preprocess=pre, ref_provider=spec.provider,
                           provider=spec.provider, progress=False)  # fmt: skip
    validation = validate_models(spec.current, spec.candidate, opts, thresholds(spec.gates))
    speed = _speed(spec, pre)
    report: dict[str, Any] = {
        "validation": {
            "passed": validation["passed"],
            "frames": validation["data"]["frames"],
            "checks": validation.get("checks", []),
        },
        "speed": speed,
        "passed": bool(validation["passed"] and speed["passed"]),
    }
    if not report["passed"]:
        report["failed"] = "validation" if not validation["passed"] else "speed"
    return report


def _speed(spec: CandidateSpec, overrides: PreprocessConfig | None) -> dict[str, Any]:
    with open_model(spec.current, spec.provider, 1) as a, open_model(spec.candidate, spec.provider, 1) as b:
        pre = pair_preprocessor(a, b, overrides, spec.frames)
        x = load_inputs(spec.frames, pre, a.input_shape, 1)[0]
        times: dict[str, list[float]] = {"current": [], "candidate": []}
        for _ in range(3):  # warm both
            a.run(x)
            b.run(x)
        for _ in range(spec.speed_runs):
            for name, model in (("current", a), ("candidate", b)):
                started = time.perf_counter()
                model.run(x)
                times[name].append(time.perf_counter() - started)
    cur, cand = (float(np.median(times[k])) * 1000 for k in ("current", "candidate"))
    ratio = cand / max(cur, 1e-9)
    return {"current_p50_ms": round(cur, 4), "candidate_p50_ms": round(cand, 4), "ratio": round(ratio, 3),
            "max_slowdown": spec.max_slowdown, "passed": ratio <= spec.max_slowdown}  # fmt: skip


def main(argv: list[str]) -> int:
    """Read the spec file, print the report; the exit code says the verdict."""
    try:
        spec = CandidateSpec.model_validate_json(Path(argv[0]).read_text(encoding="utf-8"))
        report = check_candidate(spec)
    except (EdgedError, OSError, ValueError, IndexError) as exc:
        sys.stdout.write(json.dumps({"passed": False, "failed": "error", "error": str(exc)}) + "\n")
        return 2
    sys.stdout.write(json.dumps(report, default=str) + "\n")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
