#!/usr/bin/env python3
"""Feed synthetic motor vibration to edged: CSV lines `t,x,y,z` into a named pipe (or stdout), with known labels.

The motor changes state every segment (`--segment-windows` windows of 256 samples; the state of each
segment is drawn with `--seed`), and the signal is continuous within a segment. `t` is the sample clock
(Unix time: `--start` + i / rate). With `--labels FILE` the true state of every 256-sample window (counted
from the first sample) is written as `window,label` rows, so results (their `frame` field) can be scored.

    python scripts/vibration_feed.py --out /tmp/edged-vibration.fifo            # real time, forever
    python scripts/vibration_feed.py --out - --segments 10 --rate 0 | head      # as fast as possible

The named pipe is created when missing; opening it waits until edged (the reader) has it open.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vibration_signals as vs

CHUNK = 128  # samples written (and paced) at once


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="-", help="named pipe to write to (created if missing), or - for stdout")
    p.add_argument("--rate", type=float, default=vs.SAMPLE_RATE_HZ, help="samples/s to write; 0 = as fast as possible")
    p.add_argument("--segments", type=int, default=0, help="motor states to write; 0 = forever")
    p.add_argument("--segment-windows", type=int, default=8, help="256-sample windows per motor state")
    p.add_argument("--seed", type=int, default=7, help="seed of the states and signals")
    p.add_argument("--start", type=float, default=None, help="sample clock of the first sample (default: now)")
    p.add_argument("--labels", type=Path, default=None, help="write `window,label` rows here")
    p.add_argument("--no-header", action="store_true", help="do not write the `t,x,y,z` header line")
    return p.parse_args(argv)


def segments(seed: int, count: int, length: int) -> Iterator[tuple[int, np.ndarray]]:
    """(label, samples) of each motor state; endless when count is 0."""
    rng = np.random.default_rng(seed)
    i = 0
    while count == 0 or i < count:
        label = int(rng.integers(0, len(vs.LABELS)))
        yield label, vs.segment(rng, label, length)
        i += 1


@contextlib.contextmanager
def open_out(target: str) -> Iterator[TextIO]:
    """stdout, or the named pipe (created when missing)."""
    if target == "-":
        yield sys.stdout
        return
    path = Path(target)
    if not path.exists():
        os.mkfifo(path, 0o660)
    with path.open("w", encoding="ascii") as fh:
        yield fh


def write_block(out: TextIO, block: Any, start: float, dt: float, written: int) -> int:
    """Write one chunk of samples as CSV lines; the samples written so far."""
    out.write(
        "".join(f"{start + (written + j) * dt:.6f},{s[0]:.5f},{s[1]:.5f},{s[2]:.5f}\n" for j, s in enumerate(block))
    )
    return written + len(block)


def pace(out: TextIO, ahead: float) -> None:
    """Hand what was written to the reader; sleep while the feed is ahead of its rate."""
    out.flush()
    if ahead > 0:
        time.sleep(ahead)


def main(argv: Sequence[str] | None = None) -> int:
    """Write the samples, paced at --rate."""
    args = parse_args(argv)
    start = time.time() if args.start is None else args.start
    dt = 1.0 / vs.SAMPLE_RATE_HZ
    seg_len = args.segment_windows * vs.WINDOW
    labels_fh = args.labels.open("w", encoding="utf-8", newline="") if args.labels else None
    labels = csv.writer(labels_fh) if labels_fh else None
    if labels is not None:
        labels.writerow(["window", "label"])
    written = 0
    began = time.monotonic()
    try:
        with open_out(args.out) as out:
            if not args.no_header:
                out.write("t,x,y,z\n")
            for seg_no, (label, samples) in enumerate(segments(args.seed, args.segments, seg_len)):
                if labels is not None and labels_fh is not None:
                    first = seg_no * args.segment_windows
                    labels.writerows([w, vs.LABELS[label]] for w in range(first, first + args.segment_windows))
                    labels_fh.flush()
                for c in range(0, seg_len, CHUNK):
                    written = write_block(out, samples[c : c + CHUNK], start, dt, written)
                    if args.rate > 0:
                        pace(out, written / args.rate - (time.monotonic() - began))
            out.flush()
    except BrokenPipeError:
        print("vibration_feed: the reader went away", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        if labels_fh is not None:
            labels_fh.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
