"""Network links for `edged budget`, with named presets. Light on purpose: the CLI reads it to build its parser."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Network:
    """A link to the cloud: bandwidths in Mbit/s (10^6 bit/s), round-trip time in ms."""

    uplink_mbps: float
    downlink_mbps: float
    rtt_ms: float
    description: str = ""


# Typical figures (median-ish measurements reported by speed-test aggregators, 2023-2024), not guarantees:
PRESETS: dict[str, Network] = {
    "lte": Network(10.0, 30.0, 50.0, "4G/LTE: ~10 Mbit/s up, ~30 Mbit/s down, ~50 ms RTT"),
    "5g": Network(20.0, 150.0, 30.0, "5G (non-standalone): ~20 Mbit/s up, ~150 Mbit/s down, ~30 ms RTT"),
    "wifi": Network(20.0, 100.0, 20.0, "home Wi-Fi on cable/fibre: ~20 Mbit/s up, ~100 Mbit/s down, ~20 ms RTT"),
    "satellite": Network(3.0, 25.0, 600.0, "geostationary satellite: ~3 Mbit/s up, ~25 Mbit/s down, ~600 ms RTT"),
    "leo": Network(10.0, 100.0, 45.0, "low-earth-orbit satellite (Starlink-like): ~10 up, ~100 down, ~45 ms RTT"),
}
