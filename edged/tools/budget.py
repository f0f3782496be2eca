"""`edged budget`: the edge-versus-cloud decision from first principles.

Cloud path, per frame:  T_cloud = t_up + t_infer_cloud + t_down + t_queue
    t_up   = RTT/2 + payload_bits / uplink_bps        (one-way propagation + serialisation)
    t_down = RTT/2 + response_bits / downlink_bps
Edge path:              T_edge = t_infer_edge
Edge wins when t_infer_edge - t_infer_cloud  <  t_up + t_down + t_queue (the network-plus-queue cost).
Break-even uplink: the bandwidth at which T_cloud = T_edge,
    B* = payload_bits / (T_edge - RTT - response_bits/downlink_bps - t_infer_cloud - t_queue);
when that denominator is <= 0 no uplink is fast enough and the edge wins at any bandwidth.

A persistent connection is assumed (no TCP/TLS handshake per frame, which would add 1-2 RTT more).
Months are 30 days.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from edged.core.errors import ToolError
from edged.tools.common import available_providers, stdout_console
from edged.tools.networks import Network

SECONDS_PER_MONTH = 30 * 24 * 3600
# A typical camera JPEG at quality ~85 is about 1.2 bits per pixel (0.15 byte); 640x480 -> ~46 KB.
JPEG_BYTES_PER_PIXEL = 0.15


@dataclass(frozen=True)
class BudgetInputs:
    """Everything the comparison needs; times in ms, sizes in bytes."""

    edge_infer_ms: float
    payload_bytes: float
    network: Network
    response_bytes: float = 500.0
    cloud_infer_ms: float = 5.0
    queue_ms: float = 20.0
    fps: float | None = None  # frames per second sent to the cloud (for the monthly figures)
    price_per_1k_calls: float | None = None  # cloud inference price, USD per 1000 calls
    data_price_per_gb: float = 0.0  # metered uplink (cellular), USD per GB (10^9 bytes)
    edge_monthly_cost: float = 0.0  # device amortisation + power, USD per month


def jpeg_payload_bytes(width: int, height: int, bytes_per_pixel: float = JPEG_BYTES_PER_PIXEL) -> float:
    """Estimated JPEG size of a frame of this resolution."""
    return width * height * bytes_per_pixel


def compute_budget(b: BudgetInputs) -> dict[str, Any]:
    """Both totals with their terms, the winner and margin, break-even uplink, and monthly costs."""
    net = b.network
    if net.uplink_mbps <= 0 or net.downlink_mbps <= 0:
        raise ToolError("bandwidths must be > 0 Mbit/s")
    if min(b.edge_infer_ms, b.payload_bytes, b.response_bytes, b.cloud_infer_ms, b.queue_ms, net.rtt_ms) < 0:
        raise ToolError("times and sizes must be >= 0")
    up_transfer = b.payload_bytes * 8 / (net.uplink_mbps * 1e6) * 1000
    down_transfer = b.response_bytes * 8 / (net.downlink_mbps * 1e6) * 1000
    t_up = net.rtt_ms / 2 + up_transfer
    t_down = net.rtt_ms / 2 + down_transfer
    cloud_total = t_up + b.cloud_infer_ms + t_down + b.queue_ms
    edge_total = b.edge_infer_ms
    slack_ms = edge_total - (net.rtt_ms + down_transfer + b.cloud_infer_ms + b.queue_ms)
    break_even = b.payload_bytes * 8 / (slack_ms / 1000) / 1e6 if slack_ms > 0 else None
    winner = "edge" if edge_total < cloud_total else ("cloud" if cloud_total < edge_total else "tie")
    return {
        "inputs": {**asdict(b), "network": asdict(net)},
        "cloud": {
            "t_up_ms": t_up,
            "t_up_transfer_ms": up_transfer,
            "t_infer_cloud_ms": b.cloud_infer_ms,
            "t_down_ms": t_down,
            "t_down_transfer_ms": down_transfer,
            "t_queue_ms": b.queue_ms,
            "total_ms": cloud_total,
        },
        "edge": {"t_infer_edge_ms": edge_total, "total_ms": edge_total},
        "compute_penalty_ms": b.edge_infer_ms - b.cloud_infer_ms,
        "network_and_queue_ms": t_up + t_down + b.queue_ms,
        "winner": winner,
        "margin_ms": abs(cloud_total - edge_total),
        "speedup": (max(cloud_total, edge_total) / min(cloud_total, edge_total))
        if min(cloud_total, edge_total) > 0
        else None,
        "break_even_uplink_mbps": break_even,
        "monthly": _monthly(b),
    }


def _monthly(b: BudgetInputs) -> dict[str, Any] | None:
    if b.fps is None or b.price_per_1k_calls is None:
        return None
    calls = b.fps * SECONDS_PER_MONTH
    uplink_gb = calls * b.payload_bytes / 1e9
    cloud = calls / 1000 * b.price_per_1k_calls + uplink_gb * b.data_price_per_gb
    return {
        "calls": calls,
        "uplink_gb": uplink_gb,
        "cloud_usd": cloud,
        "edge_usd": b.edge_monthly_cost,
        "saving_usd": cloud - b.edge_monthly_cost,
        "edge_busy_fraction": b.fps * b.edge_infer_ms / 1000,  # > 1: the device cannot keep up at this rate
    }


def measure_edge_ms(
    model: Path, provider: str | None, runs: int, shape: tuple[int, ...] | None
) -> tuple[float, str, tuple[int, int]]:
    """p50 latency of `model` here on `provider` (default: the best this machine offers), the provider, and
    the image size (width, height) the model takes: what a cloud call would have to upload instead."""
    from edged.tools.bench import BenchOptions, bench_models  # noqa: PLC0415

    chosen = provider or available_providers()[0]
    report = bench_models([model], BenchOptions(providers=[chosen], runs=runs, warmup=5, shape=shape, progress=False))
    row = report["results"][0]
    dims = [int(d) for d in row["input_shape"]]
    nchw = len(dims) == 4 and dims[1] in (1, 3)
    size = (dims[3], dims[2]) if nchw else (dims[2], dims[1]) if len(dims) == 4 else (640, 480)
    return float(row["p50_ms"]), str(row["provider"]), size


def render_budget(report: dict[str, Any]) -> None:
    """Print both paths term by term, the verdict, the break-even bandwidth and the monthly costs."""
    console = stdout_console()
    c, e, i = report["cloud"], report["edge"], report["inputs"]
    net = i["network"]
    console.print(
        f"network: {net['uplink_mbps']:g} Mbit/s up, {net['downlink_mbps']:g} Mbit/s down, RTT {net['rtt_ms']:g} ms"
        + (f" ({net['description']})" if net["description"] else "")
        + f"; payload {i['payload_bytes'] / 1000:.1f} kB up, {i['response_bytes'] / 1000:.1f} kB back"
    )
    console.print(
        f"cloud: T = t_up {c['t_up_ms']:.1f} (RTT/2 + {c['t_up_transfer_ms']:.1f} transfer) + t_infer "
        f"{c['t_infer_cloud_ms']:.1f} + t_down {c['t_down_ms']:.1f} + t_queue {c['t_queue_ms']:.1f} = "
        f"[bold]{c['total_ms']:.1f} ms[/]"
    )
    source = f" ({e['source']})" if e.get("source") else ""
    console.print(f"edge:  T = t_infer_edge = [bold]{e['total_ms']:.2f} ms[/]{source}")
    console.print(
        f"compute penalty of the edge {report['compute_penalty_ms']:.1f} ms vs network + queue "
        f"{report['network_and_queue_ms']:.1f} ms -> [bold]{report['winner']}[/] wins by {report['margin_ms']:.1f} ms"
        + (f" ({report['speedup']:.2f}x)" if report["speedup"] else "")
    )
    be = report["break_even_uplink_mbps"]
    if be is None:
        console.print(
            "break-even uplink: none; the edge is faster at any uplink bandwidth "
            "(RTT, queue and cloud time alone exceed it)"
        )
    else:
        console.print(f"break-even uplink: {be:.2f} Mbit/s (the cloud is faster above it, the edge below it)")
    m = report["monthly"]
    if m is not None:
        console.print(
            f"per month (30 days): {m['calls']:,.0f} calls, {m['uplink_gb']:.1f} GB up; cloud ${m['cloud_usd']:,.2f} "
            f"vs edge ${m['edge_usd']:,.2f} -> "
            + (
                f"the edge saves ${m['saving_usd']:,.2f}"
                if m["saving_usd"] >= 0
                else f"the cloud is ${-m['saving_usd']:,.2f} cheaper"
            )
        )
        if m["edge_busy_fraction"] > 1:
            console.print(
                f"[yellow]note:[/] at this frame rate the edge would be busy {m['edge_busy_fraction']:.0%} "
                "of the time: it cannot keep up"
            )
