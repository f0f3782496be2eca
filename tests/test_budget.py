"""`edged budget`: the edge-versus-cloud arithmetic against cases computed by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from edged.core.errors import ToolError
from edged.tools.budget import BudgetInputs, compute_budget, jpeg_payload_bytes
from edged.tools.networks import PRESETS, Network

# 100 kB up at 8 Mbit/s = 100 ms; 1 kB back at 8 Mbit/s = 1 ms; RTT 40 ms = 20 ms each way.
NET = Network(uplink_mbps=8.0, downlink_mbps=8.0, rtt_ms=40.0)


def inputs(edge_ms: float, **kw: float) -> BudgetInputs:
    return BudgetInputs(
        edge_infer_ms=edge_ms,
        payload_bytes=100_000,
        network=NET,
        response_bytes=1_000,
        cloud_infer_ms=5.0,
        queue_ms=10.0,
        **kw,
    )


def test_cloud_total_is_the_sum_of_its_terms() -> None:
    r = compute_budget(inputs(30.0))
    c = r["cloud"]
    assert c["t_up_transfer_ms"] == pytest.approx(100.0)
    assert c["t_up_ms"] == pytest.approx(120.0)  # 20 + 100
    assert c["t_down_ms"] == pytest.approx(21.0)  # 20 + 1
    assert c["total_ms"] == pytest.approx(156.0)  # 120 + 5 + 21 + 10
    assert r["edge"]["total_ms"] == 30.0


def test_edge_wins_when_its_compute_penalty_is_below_network_plus_queue() -> None:
    r = compute_budget(inputs(30.0))
    assert r["compute_penalty_ms"] == pytest.approx(25.0)  # 30 - 5
    assert r["network_and_queue_ms"] == pytest.approx(151.0)  # 120 + 21 + 10
    assert r["winner"] == "edge"
    assert r["margin_ms"] == pytest.approx(126.0)
    # RTT + download + cloud + queue = 56 ms > 30 ms: no uplink is fast enough for the cloud to catch up
    assert r["break_even_uplink_mbps"] is None


def test_cloud_wins_on_a_slow_edge_and_the_break_even_uplink_is_exact() -> None:
    r = compute_budget(inputs(200.0))
    assert r["winner"] == "cloud"
    assert r["margin_ms"] == pytest.approx(44.0)  # 200 - 156
    # slack = 200 - (40 + 1 + 5 + 10) = 144 ms; B* = 800,000 bit / 0.144 s = 5.5556 Mbit/s
    assert r["break_even_uplink_mbps"] == pytest.approx(800_000 / 0.144 / 1e6)
    at_break_even = BudgetInputs(
        edge_infer_ms=200.0,
        payload_bytes=100_000,
        network=Network(r["break_even_uplink_mbps"], 8.0, 40.0),
        response_bytes=1_000,
        cloud_infer_ms=5.0,
        queue_ms=10.0,
    )
    assert compute_budget(at_break_even)["cloud"]["total_ms"] == pytest.approx(200.0)


def test_monthly_costs() -> None:
    r = compute_budget(inputs(30.0, fps=0.5, price_per_1k_calls=2.0, data_price_per_gb=10.0, edge_monthly_cost=15.0))
    m = r["monthly"]
    assert m["calls"] == pytest.approx(1_296_000)  # 0.5/s x 30 days
    assert m["uplink_gb"] == pytest.approx(129.6)  # 1,296,000 x 100 kB
    assert m["cloud_usd"] == pytest.approx(2_592.0 + 1_296.0)  # calls + metered data
    assert m["saving_usd"] == pytest.approx(3_873.0)
    assert m["edge_busy_fraction"] == pytest.approx(0.015)
    assert compute_budget(inputs(30.0))["monthly"] is None  # no price, no frame rate: no monthly figures


def test_jpeg_payload_estimate_and_bad_inputs() -> None:
    assert jpeg_payload_bytes(640, 480) == pytest.approx(46_080)
    with pytest.raises(ToolError, match="bandwidths"):
        compute_budget(BudgetInputs(edge_infer_ms=1, payload_bytes=1, network=Network(0, 1, 1)))


def test_presets_are_ordered_as_the_links_are() -> None:
    assert {"lte", "wifi", "satellite"} <= PRESETS.keys()
    assert PRESETS["satellite"].rtt_ms > PRESETS["lte"].rtt_ms > PRESETS["wifi"].rtt_ms


@pytest.mark.integration
def test_budget_cli_json() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "edged", "budget", "--edge-ms", "30", "--preset", "satellite", "--payload-kb", "50",
         "--fps", "1", "--price-per-1k", "0.5", "--json"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert {"cloud", "edge", "winner", "margin_ms", "break_even_uplink_mbps", "monthly", "inputs"} <= r.keys()
    assert r["inputs"]["network"]["rtt_ms"] == 600.0
    # 50 kB at 3 Mbit/s = 133.33 ms; 500 B at 25 Mbit/s = 0.16 ms; + 600 RTT + 5 + 20
    assert r["cloud"]["total_ms"] == pytest.approx(600 + 400_000 / 3e6 * 1000 + 4_000 / 25e6 * 1000 + 25)
    assert r["winner"] == "edge"


@pytest.mark.integration
def test_budget_with_a_model_sizes_the_upload_from_the_models_input(tmp_path: Path) -> None:
    # it assumed a 640x480 JPEG whatever the model took
    from tools_models import SIZE, make_conv_model

    from edged.tools.budget import jpeg_payload_bytes

    model = make_conv_model(tmp_path / "conv.onnx")  # 16 x 16 input, from its metadata
    proc = subprocess.run(
        [sys.executable, "-m", "edged", "budget", "--model", str(model), "--preset", "lte", "--json"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["inputs"]["payload_bytes"] == pytest.approx(jpeg_payload_bytes(SIZE, SIZE))
