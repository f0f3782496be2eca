"""`edged ingest --report`: which device lost which results, and whether the device says why.

Everything is computed from the rows (first, last, count and the missing ranges per device and pipeline)
and matched against what each device said: the gaps it declared after an unclean stop (gaps topic: each
seq there was delivered before the stop, lost with it, or never used: *uncertain*), and its last stats
message: the spool counts what it dropped, by reason (`expired`, `full_evicted_oldest`, ...), and what it
set aside as dead letters. Missing seqs the device accounts for are *explained*; any beyond that were
lost between the device and the database, and the report says so (exit 1). Messages the ingest quarantined
(ingestparse.py) are counted per device their topic names. What the ingest asked devices to send again
(replayer.py) shows as `recovered` (rows that arrived in a range asked for) and `gone` (seqs the device no
longer had: lost, counted in `unexplained` unless the device accounts for them otherwise).
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

from edged.fleet.ingestdb import Database, Gap, Stream

GAPS_SHOWN = 5


def _ranges(gaps: list[Gap]) -> list[list[int]]:
    return [[g.first, g.last] for g in gaps]


def _inside(gaps: list[Gap], declared: list[Gap]) -> int:
    """How many missing seqs lie in a range the device declared uncertain."""
    marked: set[int] = set()
    for d in declared:
        for g in gaps:
            lo, hi = max(g.first, d.first), min(g.last, d.last)
            if lo <= hi:
                marked.update(range(lo, hi + 1))
    return len(marked)


def _stream_entry(stream: Stream, gaps: list[Gap], declared: list[Gap]) -> dict[str, Any]:
    contiguous = gaps[0].first - 1 if gaps else stream.last
    return {
        "pipeline": stream.pipeline,
        "results": stream.count,
        "first_seq": stream.first,
        "last_seq": stream.last,
        "contiguous_to": contiguous,  # every seq from first_seq to this is in the database
        "missing": stream.missing,
        "uncertain": _inside(gaps, declared),  # missing, in a gap the device declared after an unclean stop
        "gaps": _ranges(gaps),
        "declared_gaps": _ranges(declared),
        "before_first": stream.first - 1,  # seqs before the first row seen (the ingest may have joined late)
    }


def _count(value: object) -> int:
    """A count a device reported (its stats message is its word: anything but a sane count is 0)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63 else 0


def _device_accounting(stats: dict[str, Any] | None) -> dict[str, Any]:
    if stats is None:
        return {"stats_ts": None, "dropped_by_reason": {}, "dead_letters": 0, "accounted": 0}
    spool = stats.get("spool")
    spool = spool if isinstance(spool, dict) else {}
    by_reason = spool.get("dropped_by_reason")
    by_reason = by_reason if isinstance(by_reason, dict) else {}
    reasons = {str(k)[:64]: _count(v) for k, v in by_reason.items() if _count(v)}
    dead = _count(spool.get("dead_letters"))
    return {"stats_ts": stats.get("ts"), "dropped_by_reason": reasons, "dead_letters": dead,
            "accounted": sum(reasons.values()) + dead}  # fmt: skip


def build_report(db: Database) -> dict[str, Any]:
    """The report as a dict (`--json` prints it)."""
    gaps_by_stream: dict[tuple[str, str], list[Gap]] = {}
    for gap in db.gaps():
        gaps_by_stream.setdefault((gap.device, gap.pipeline), []).append(gap)
    declared: dict[tuple[str, str], list[Gap]] = {}
    for gap in db.declared():
        declared.setdefault((gap.device, gap.pipeline), []).append(gap)
    stats = db.device_stats()
    quarantined = db.quarantined()
    replays = db.replays()
    clocks = db.clocks()
    devices: dict[str, dict[str, Any]] = {}
    for stream in db.streams():
        entry = devices.setdefault(stream.device, {"device": stream.device, "pipelines": []})
        key = (stream.device, stream.pipeline)
        entry["pipelines"].append(_stream_entry(stream, gaps_by_stream.get(key, []), declared.get(key, [])))
    for device in sorted((set(stats) | set(quarantined)) - set(devices) - {""}):
        devices[device] = {"device": device, "pipelines": []}  # stats or refused messages seen, no result yet
    total_unexplained = 0
    for device, entry in devices.items():
        accounting = _device_accounting(stats.get(device))
        missing = sum(p["missing"] for p in entry["pipelines"])
        uncertain = sum(p["uncertain"] for p in entry["pipelines"])
        unexplained = max(0, missing - uncertain - accounting["accounted"])
        replayed = replays.get(device, {})
        entry |= {"missing": missing, "uncertain": uncertain, "unexplained": unexplained, **accounting,
                  "quarantined": quarantined.get(device, {}), "recovered": replayed.get("recovered", 0),
                  "gone": replayed.get("gone", 0),
                  "clock": clocks.get(device, {"unsynced": 0, "corrected": 0})}  # fmt: skip
        total_unexplained += unexplained
    rows = sum(p["results"] for e in devices.values() for p in e["pipelines"])
    recovered = sum(e["recovered"] for e in devices.values())
    return {"database": db.url, "devices": list(devices.values()), "results": rows, "unexplained": total_unexplained,
            "recovered": recovered,
            "quarantined": {device or "(no device in the topic)": n for device, n in quarantined.items()}}  # fmt: skip


def _why(entry: dict[str, Any]) -> str:
    verdict = _verdict(entry)
    if entry.get("recovered"):
        verdict += f"; {entry['recovered']} recovered by replay"
    if entry.get("gone"):
        verdict += f"; {entry['gone']} gone at the device (out of its replay window)"
    return verdict


def _verdict(entry: dict[str, Any]) -> str:
    if not entry["pipelines"]:  # known from its stats message or its quarantined messages only
        return "no rows (seen only in its stats or quarantined messages)"
    if not entry["missing"]:
        late = [p for p in entry["pipelines"] if p["before_first"] > 0]
        if late:  # seqs before the first row never arrived: the ingest joined late, or they were lost before
            where = ", ".join(f"{p['pipeline']} at seq {p['first_seq']}" for p in late)
            return f"complete from where its rows start ({where}: earlier seqs never arrived here)"
        return "complete"
    parts = [f"{n} {reason}" for reason, n in sorted(entry["dropped_by_reason"].items())]
    if entry["dead_letters"]:
        parts.append(f"{entry['dead_letters']} dead letters")
    if entry["uncertain"]:
        parts.append(f"{entry['uncertain']} uncertain after unclean stops")
    said = ("device says: " + ", ".join(parts)) if parts else "the device reports no drops"
    if entry["stats_ts"] is None:
        said = "no stats message from the device"
    if entry["unexplained"]:
        return f"{entry['unexplained']} LOST unexplained; {said}"
    return f"explained; {said}"


def render_report(report: dict[str, Any], console: Console) -> None:
    """The report, one block per device (its name and verdict), one line per pipeline under it: names stay
    whole whatever the width; the verdict and the gaps wrap at the console's width (80 when piped)."""
    console.print(f"{report['results']} results in {report['database']}")
    for entry in report["devices"]:
        console.print(Text.assemble((entry["device"], "bold"), f": {_why(entry)}"))
        clock = entry.get("clock") or {}
        if clock.get("unsynced") or clock.get("corrected"):
            console.print(f"  clock not synchronized at capture: {clock.get('corrected', 0)} result(s) corrected, "
                          f"{clock.get('unsynced', 0)} waiting for a correction (ts as stamped)")  # fmt: skip
        if entry["quarantined"]:
            refused = ", ".join(f"{n} {reason}" for reason, n in sorted(entry["quarantined"].items()))
            console.print(f"  quarantined messages on its topics: {refused}")
        for p in entry["pipelines"]:
            seq = f"seq {p['first_seq']}..{p['last_seq']}" if p["results"] else "no results"
            started = f"  started at seq {p['first_seq']}" if p["results"] and p["before_first"] > 0 else ""
            console.print(f"  {p['pipeline']}  results {p['results']}  {seq}  missing {p['missing']}{started}")
            if p["gaps"]:
                gaps = ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in p["gaps"][:GAPS_SHOWN])
                more = f" (+{len(p['gaps']) - GAPS_SHOWN} more)" if len(p["gaps"]) > GAPS_SHOWN else ""
                console.print(f"    gaps {gaps}{more}")
    lost = report["unexplained"]
    console.print(f"{lost} result(s) lost without a reason" if lost else "no result lost without a reason")
