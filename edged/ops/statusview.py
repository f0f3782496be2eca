"""`edged status` on a terminal: compact tables that fit 80 columns, colour only on a TTY, `--watch`."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from edged.core.errors import StatusError
from edged.ops.status import EXIT_NOT_RUNNING, exit_code, query


def _age(ts: float | None) -> str:
    if not ts:
        return "never"
    return f"{max(0.0, time.time() - ts):.0f} s ago"


def _mib(n: float | None) -> str:
    return "?" if n is None else f"{n / 2**20:.1f} MiB"


def _ms(lat: dict[str, Any]) -> str:
    return f"{lat.get('p50', 0):.1f}/{lat.get('p95', 0):.1f}/{lat.get('p99', 0):.1f}"


def _pipelines(snapshot: dict[str, Any]) -> list[Any]:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("pipeline", "state", "fps", "frames", "drops", "reconn", "provider", "p50/p95/p99 ms"):
        table.add_column(col)
    lines: list[Any] = [table]
    for p in snapshot.get("pipelines", []):
        lat = p.get("latency_ms", {})
        table.add_row(
            p.get("name", "?"),
            p.get("state", "?"),
            f"{p.get('fps', 0):.1f}",
            str(p.get("frames", 0)),
            str(p.get("dropped_frames", 0)),
            str(p.get("reconnects", 0)),
            (p.get("provider") or "-").replace("ExecutionProvider", ""),
            _ms(lat),
        )
        model = p.get("model") or {}
        stages = lat.get("stages") or {}
        split = "  ".join(f"{k} {_ms(v)}" for k, v in stages.items())
        int8 = model.get("int8")
        precision = "" if int8 is None else (" int8" if int8 else " fp")
        sha = str(model.get("sha256"))[:12]
        line = f"  {p.get('name')}: {p.get('source')}\n    model {model.get('name')} {sha}{precision}"
        line += f"  {split}" if split else ""
        e2e = lat.get("e2e")
        line += f"\n    capture->PUBACK {_ms(e2e)} ms" if e2e and e2e.get("p50") else ""
        line += f"  malformed {p['malformed']}" if p.get("malformed") else ""  # sensor input it had to skip
        line += f"  suppressed {p['suppressed']} (publish filter)" if p.get("suppressed") else ""
        line += f"  no motion {p['motion_skipped']} (frames not run)" if p.get("motion_skipped") else ""
        if p.get("tracks") is not None:  # a tracking pipeline
            line += f"\n    tracks {p['tracks']}  events {p.get('events', 0)} ({p.get('events_per_min', 0):.0f}/min)"
        line += f"  [yellow]{p['error']}[/]" if p.get("error") else ""
        lines.append(Text.from_markup(line))
    return lines


def _spool(spool: dict[str, Any]) -> list[Any]:
    reasons = spool.get("dropped_by_reason") or {}
    dropped = ", ".join(f"{k} {v}" for k, v in sorted(reasons.items())) or "0"
    first = (
        f"spool  depth {spool.get('depth', 0)}  {_mib(spool.get('bytes', 0))} of {_mib(spool.get('max_bytes'))}"
        f"  oldest {spool.get('oldest_age_s', 0):.0f} s  disk free {_mib(spool.get('disk_free_bytes'))}"
    )
    second = f"       dropped {dropped}  dead letters {spool.get('dead_letters', 0)}"
    if spool.get("uncertain"):  # seqs skipped after unclean stops: sent before, lost, or never used
        second += f"  uncertain {spool['uncertain']}"
    if spool.get("recovered_from"):
        second += f"  [red]damaged spool moved to {spool['recovered_from']}[/]"
    if spool.get("error"):
        second += f"  [red]{spool['error']}[/]"
    if spool.get("space_warning"):
        second += f"  [yellow]{spool['space_warning']}[/]"
    return [Text(first), Text.from_markup(second)]


def _mqtt(mqtt: dict[str, Any]) -> list[Any]:
    if not mqtt.get("enabled", True):
        return [Text("mqtt   disabled (results stay in the spool)")]
    conn = "[green]connected[/]" if mqtt.get("connected") else "[yellow]disconnected[/]"
    line = (
        f"mqtt   {conn} {mqtt.get('broker', '')}  published {mqtt.get('published', 0)}"
        f" ({mqtt.get('published_per_s', 0):.1f}/s)  last {_age(mqtt.get('last_publish_ts'))}"
    )
    line += f"  [yellow]{mqtt['last_error']}[/]" if mqtt.get("last_error") else ""
    return [Text.from_markup(line)]


def build_view(snapshot: dict[str, Any]) -> Group:
    """Everything `edged status` shows, as one rich renderable."""
    state = snapshot.get("state", "?")
    style = {"running": "green", "degraded": "yellow"}.get(state, "red")
    head = Text.from_markup(
        f"edged [{style}]{state}[/]  device {snapshot.get('device_id')}  up {snapshot.get('uptime_s', 0):.0f} s"
        f"  v{snapshot.get('version', '?')}"
    )
    if snapshot.get("reasons"):
        head.append(Text.from_markup(f"\n[{style}]" + "; ".join(snapshot["reasons"]) + "[/]"))
    reload = snapshot.get("reload") or {}
    parts: list[Any] = [
        head,
        *_pipelines(snapshot),
        *_spool(snapshot.get("spool", {})),
        *_mqtt(snapshot.get("mqtt", {})),
    ]
    if reload.get("result"):
        parts.append(
            Text(f"reload {reload['result']} {_age(reload.get('last'))}: " + "; ".join(reload.get("notes", [])))
        )
    control = snapshot.get("control")
    if control:
        refused = ", ".join(f"{n} {why}" for why, n in sorted(control.get("refused", {}).items())) or "none"
        rollouts = control.get("rollouts") or {}
        rolled = ", ".join(f"{n} {what}" for what, n in rollouts.items() if n)
        parts.append(Text(f"control: {control.get('accepted', 0)} commands taken; refused: {refused}"
                          + (f"; rollouts: {rolled}" if rolled else "")))  # fmt: skip
    return Group(*parts)


def render(snapshot: dict[str, Any], *, color: bool | None = None) -> None:
    """Print the snapshot once."""
    Console(no_color=color is False, highlight=False, soft_wrap=True).print(build_view(snapshot))


def watch(path: Path, interval: float, *, color: bool | None = None) -> int:
    """Refresh in place until Ctrl-C; the exit code is the last state's (2 when the daemon went away)."""
    console = Console(no_color=color is False, highlight=False)
    code = EXIT_NOT_RUNNING
    # A shell starts background jobs with SIGINT ignored and Python then leaves it ignored: take Ctrl-C back, and
    # end on SIGTERM the same way, so the watch always stops when asked.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with Live(Text("connecting..."), console=console, auto_refresh=False) as live:
        try:
            while True:
                try:
                    snapshot = query(path)
                    code = exit_code(snapshot)
                    live.update(build_view(snapshot), refresh=True)
                except StatusError as exc:
                    code = EXIT_NOT_RUNNING
                    live.update(Text(f"{exc} (retrying)"), refresh=True)
                time.sleep(interval)
        except KeyboardInterrupt:
            pass
    return code
