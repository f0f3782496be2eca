"""Synthetic motor vibration (3-axis accelerometer) for the demo sensor model; seeded and deterministic.

A motor runs at a shaft speed of 20-40 Hz. What the accelerometer on its housing sees (x, y radial, z axial):

- healthy: a small once-per-revolution (1x) component, a smaller 2x harmonic, a weak gear-mesh tone
  and broadband noise;
- imbalance: the same, but a strong 1x component on both radial axes (90 degrees apart: a rotating force);
- bearing fault: the healthy signal plus a train of impacts at the outer-race fault frequency
  (BPFO, about 3.6x shaft speed), each ringing a structural resonance at 550-800 Hz and decaying fast.

Used by `scripts/train_vibration.py` (training, calibration and evaluation windows) and
`scripts/vibration_feed.py` (a live feed with known labels); a segment is a stretch of continuous signal
in one state, so any window cut from it is an example of that class.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

LABELS = ["healthy", "imbalance", "bearing_fault"]
CHANNELS = ["x", "y", "z"]
SAMPLE_RATE_HZ = 2000.0
WINDOW = 256  # samples per model input (128 ms at 2 kHz)

Array = npt.NDArray[np.float32]


def segment(rng: np.random.Generator, label: int, n: int, fs: float = SAMPLE_RATE_HZ) -> Array:
    """`n` continuous samples (n, 3) of a motor in state `label` (an index into LABELS)."""
    t = np.arange(n) / fs
    shaft = rng.uniform(20.0, 40.0)
    phase = rng.uniform(0, 2 * np.pi)
    one_x = rng.uniform(0.05, 0.45)
    if label == 1:
        one_x = rng.uniform(0.6, 2.0)
    two_x = rng.uniform(0.02, 0.15)
    mesh_f = shaft * rng.integers(9, 15)
    mesh_a = rng.uniform(0.02, 0.1)
    noise = rng.uniform(0.05, 0.2)
    rot = 2 * np.pi * shaft * t + phase
    x = one_x * np.sin(rot) + two_x * np.sin(2 * rot + 0.3) + mesh_a * np.sin(2 * np.pi * mesh_f * t)
    y = one_x * np.cos(rot) + two_x * np.cos(2 * rot + 0.7) + mesh_a * np.sin(2 * np.pi * mesh_f * t + 1.0)
    z = 0.3 * one_x * np.sin(rot + 0.5) + 0.5 * mesh_a * np.sin(2 * np.pi * mesh_f * t + 2.0)
    sig = np.stack([x, y, z], axis=1)
    if label == 2:
        sig += _impacts(rng, t, shaft)
    sig += rng.normal(0.0, noise, size=sig.shape)
    return sig.astype(np.float32)


def _impacts(rng: np.random.Generator, t: npt.NDArray[np.float64], shaft: float) -> npt.NDArray[np.float64]:
    """Decaying resonance bursts at the bearing's outer-race fault frequency."""
    bpfo = shaft * rng.uniform(3.4, 3.8)
    resonance = rng.uniform(550.0, 800.0)
    decay = rng.uniform(0.002, 0.005)  # seconds
    amp = rng.uniform(0.3, 1.5)
    period = 1.0 / bpfo
    since = np.mod(t + rng.uniform(0, period), period)  # time since the last impact
    burst = amp * np.exp(-since / decay) * np.sin(2 * np.pi * resonance * since)
    gains = np.array([1.0, 0.8, 0.4]) * rng.uniform(0.8, 1.2, size=3)
    return burst[:, None] * gains[None, :]


def windows(seed: int, stream: int, count: int, window: int = WINDOW) -> tuple[Array, npt.NDArray[np.int64]]:
    """`count` independent windows (count, window, 3) with balanced random labels; depends on the seeds only."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, stream]))
    labels = rng.integers(0, len(LABELS), size=count)
    x = np.stack([segment(rng, int(lab), window) for lab in labels])
    return x, labels.astype(np.int64)
