"""Every `reasons` line the test suite sees, so docs/status.md's troubleshooting table can be held to the code:
each line a status answer or `Report.reasons()` gave in any test must match an entry of edged's reason catalog.

A pass-through recorder, installed by conftest before the test modules import: it wraps `edged.ops.status.query`
(the status answers of daemon processes) and `Report.reasons` (in-process daemons); what they return is
unchanged. `EDGED_REASONS_SEEN=FILE` also writes the lines seen, one per line, at the end of the session.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import edged.ops.status
from edged.ops.health import Report

SEEN: set[str] = set()
_LOCK = threading.Lock()


def _record(lines: Any) -> None:
    if isinstance(lines, list):
        with _LOCK:
            SEEN.update(str(line) for line in lines)


def install() -> None:
    """Wrap the two places reasons come from (idempotent)."""
    if getattr(edged.ops.status.query, "records_reasons", False):
        return
    query = edged.ops.status.query
    reasons = Report.reasons

    @functools.wraps(query)
    def recording_query(*args: Any, **kwargs: Any) -> dict[str, Any]:
        answer = query(*args, **kwargs)
        if isinstance(answer, dict):
            _record(answer.get("reasons"))
        return answer

    @functools.wraps(reasons)
    def recording_reasons(self: Report, spool: dict[str, Any] | None = None) -> list[str]:
        out = reasons(self, spool)
        _record(out)
        return out

    recording_query.records_reasons = True  # type: ignore[attr-defined]
    edged.ops.status.query = recording_query
    Report.reasons = recording_reasons  # type: ignore[method-assign]
