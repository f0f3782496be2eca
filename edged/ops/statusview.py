"""`edged status` on a terminal: compact tables that fit the terminal (80 columns when piped, or $COLUMNS),
colour only on a TTY, `--watch`.

Every line is cut at the width with an ellipsis rather than wrapped mid-figure: the figures are laid out
so that they fit 80 columns, and what can be long (names, sources, errors, reasons, reload notes) sits on
a line of its own. `--wide` prints every line whole; `--json` has everything."""

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


def duration(seconds: float) -> str:
    """A span as a person reads it: `42 s`, `4 min 5 s`, `3 h 12 min`, `2 d 4 h` (two units at most)."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def _age(ts: float | None) -> str:
    if not ts:
        return "never"
    return f"{duration(time.time() - ts)} ago"


def _mib(n: float | None) -> str:
    """A size in MiB, or in GiB from 10 GiB up (a disk's free space)."""
    if n is None:
        return "?"
    return f"{n / 2**30:.1f} GiB" if n >= 10 * 2**30 else f"{n / 2**20:.1f} MiB"


def _ms(lat: dict[str, Any]) -> str:
    return f"{lat.get('p50', 0):.1f}/{lat.get('p95', 0):.1f}/{lat.get('p99', 0):.1f}"


def _line(*parts: str | tuple[str, str]) -> Text:
    """One line (plain strings and (text, style) pairs: what the daemon reports is never read as markup), cut
    at the console's width (unless --wide), never wrapped."""
    return Text.assemble(*parts, overflow="ellipsis", no_wrap=True)


def _packed(indent: str, segments: list[str], width: int = 80) -> list[Text]:
    """Segments ("infer 1.2/3.4/5.6") joined by two spaces into as few lines of `width` as they fit, each
    line after the first under the first's text."""
    lines: list[str] = []
    for seg in segments:
        if lines and len(lines[-1]) + 2 + len(seg) <= width:
            lines[-1] += f"  {seg}"
        else:
            lines.append(f"{indent if not lines else ' ' * len(indent)}{seg}")
    return [_line(line) for line in lines]


def _pipelines(snapshot: dict[str, Any]) -> list[Any]:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("pipeline", "state", "fps", "frames", "drops", "reconn", "provider"):
        table.add_column(col, no_wrap=True, overflow="ellipsis", max_width=16 if col == "pipeline" else None)
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
        )
        model = p.get("model") or {}
        int8 = model.get("int8")
        precision = "" if int8 is None else (" int8" if int8 else " fp")
        sha = str(model.get("sha256"))[:12]
        lines.append(_line(f"  {p.get('name')}: {p.get('source')}"))
        lines.append(_line(f"    model {sha}{precision} {model.get('name')}"))
        figures = [f"all {_ms(lat)}"] + [f"{k} {_ms(v)}" for k, v in (lat.get("stages") or {}).items()]
        e2e = lat.get("e2e")
        figures += [f"capture->PUBACK {_ms(e2e)}"] if e2e and e2e.get("p50") else []
        lines += _packed("    p50/p95/p99 ms  ", figures)
        counts = [f"malformed {p['malformed']}"] if p.get("malformed") else []  # sensor input it had to skip
        counts += [f"refused {p['refused']} (not published)"] if p.get("refused") else []  # outputs that did not fit
        counts += [f"suppressed {p['suppressed']} (publish filter)"] if p.get("suppressed") else []
        counts += [f"no motion {p['motion_skipped']} (frames not run)"] if p.get("motion_skipped") else []
        if p.get("tracks") is not None:  # a tracking pipeline
            counts += [f"tracks {p['tracks']}", f"events {p.get('events', 0)} ({p.get('events_per_min', 0):.0f}/min)"]
        lines += _packed("    ", counts)
        if p.get("error"):
            lines.append(_line("    ", (str(p["error"]), "yellow")))
    return lines


def _spool(spool: dict[str, Any]) -> list[Any]:
    reasons = spool.get("dropped_by_reason") or {}
    dropped = ", ".join(f"{k} {v}" for k, v in sorted(reasons.items())) or "0"
    lines = [
        _line(
            f"spool  depth {spool.get('depth', 0)}  {_mib(spool.get('bytes', 0))} of {_mib(spool.get('max_bytes'))}"
            f"  oldest {duration(spool.get('oldest_age_s') or 0)}"
        ),
        _line(f"       disk free {_mib(spool.get('disk_free_bytes'))}  dead letters {spool.get('dead_letters', 0)}"),
        _line(f"       dropped {dropped}"),
    ]
    if spool.get("uncertain"):  # seqs skipped after unclean stops: sent before, lost, or never used
        lines.append(_line(f"       uncertain {spool['uncertain']} (seqs skipped after an unclean stop)"))
    if spool.get("recovered_from"):
        lines.append(_line("       ", (f"damaged spool moved to {spool['recovered_from']}", "red")))
    if spool.get("error"):
        lines.append(_line("       ", (str(spool["error"]), "red")))
    if spool.get("space_warning"):
        lines.append(_line("       ", (str(spool["space_warning"]), "yellow")))
    return lines


def _mqtt(mqtt: dict[str, Any]) -> list[Any]:
    if not mqtt.get("enabled", True):
        return [_line("mqtt   disabled (results stay in the spool)")]
    conn = ("connected", "green") if mqtt.get("connected") else ("disconnected", "yellow")
    lines = [
        _line("mqtt   ", conn, f" {mqtt.get('broker', '')}"),
        _line(
            f"       published {mqtt.get('published', 0)} ({mqtt.get('published_per_s', 0):.1f}/s)"
            f"  last {_age(mqtt.get('last_publish_ts'))}"
        ),
    ]
    if mqtt.get("last_error"):
        lines.append(_line("       ", (str(mqtt["last_error"]), "yellow")))
    return lines


def _clock(clock: dict[str, Any]) -> list[Any]:
    if not clock:
        return []
    synced = clock.get("state") == "synchronized"
    step = clock.get("last_step") or {}
    steps = f"  steps {clock.get('steps')} (last {step.get('by_s', 0):+.1f} s)" if clock.get("steps") else ""
    lines = [
        _line(
            "clock  ",
            (str(clock.get("state", "?")), "green" if synced else "yellow"),
            f" for {duration(clock.get('since_s') or 0)} ({clock.get('detail', '')}){steps}",
        )
    ]
    if not synced:
        lines.append(_line(f"       {clock.get('flagged', 0)} frames stamped so: their results say so, and are "
                           "corrected once it is synchronized"))  # fmt: skip
    return lines


def build_view(snapshot: dict[str, Any]) -> Group:
    """Everything `edged status` shows, as one rich renderable; a status of a shape this version cannot show
    (another program on the socket, a newer daemon) is said so in one line, never a traceback."""
    try:
        return _view(snapshot)
    except (TypeError, AttributeError, KeyError, ValueError) as exc:
        return Group(
            _line(
                ("edged ?", "red"),
                f"  the status has a shape this edged cannot show ({type(exc).__name__}: {str(exc)[:80]}); "
                "`edged status --json` prints it as it came",
            )
        )


def _view(snapshot: dict[str, Any]) -> Group:
    state = snapshot.get("state", "?")
    style = {"running": "green", "degraded": "yellow"}.get(state, "red")
    head = _line(
        "edged ",
        (str(state), style),
        f"  up {duration(snapshot.get('uptime_s') or 0)}  v{snapshot.get('version', '?')}",
        f"  device {snapshot.get('device_id')}",
    )
    lines: list[Any] = [head]
    lines += [_line((str(reason), style)) for reason in snapshot.get("reasons") or []]
    lines += [*_pipelines(snapshot), *_spool(snapshot.get("spool", {})), *_mqtt(snapshot.get("mqtt", {}))]
    lines += _clock(snapshot.get("clock") or {})
    reload = snapshot.get("reload") or {}
    if reload.get("result"):
        lines.append(_line(f"reload {reload['result']} {_age(reload.get('last'))}"))
        lines += [_line(f"       {note}") for note in reload.get("notes", [])]
    control = snapshot.get("control")
    if control:
        refused = ", ".join(f"{n} {why}" for why, n in sorted(control.get("refused", {}).items())) or "none"
        rollouts = control.get("rollouts") or {}
        rolled = ", ".join(f"{n} {what}" for what, n in rollouts.items() if n)
        lines.append(_line(f"control {control.get('accepted', 0)} commands taken; refused: {refused}"))
        if rolled:
            lines.append(_line(f"        rollouts: {rolled}"))
    return Group(*lines)


def render(snapshot: dict[str, Any], *, color: bool | None = None, wide: bool = False) -> None:
    """Print the snapshot once: cut at the terminal's width ($COLUMNS; 80 when piped), or whole (`wide`)."""
    width = 1 << 16 if wide else None  # None: rich takes $COLUMNS, the terminal's width, or 80
    Console(no_color=color is False, highlight=False, width=width).print(build_view(snapshot))


def watch(path: Path, interval: float, *, color: bool | None = None) -> int:
    """Refresh in place until Ctrl-C; the exit code is the last state's (2 when the daemon went away). Lines
    are cut at the terminal's width: a wrapped line would leave the refresh's cursor arithmetic wrong."""
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
