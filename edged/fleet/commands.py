"""From the parsed `edged ingest` arguments to the ingest (or its report) and back to an exit code."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import socket
import sys
import threading
from types import FrameType

from rich.console import Console

from edged.fleet.ingest import Ingest, IngestOptions
from edged.fleet.ingestdb import Database, open_database
from edged.fleet.report import build_report, render_report

log = logging.getLogger(__name__)


def _options(args: argparse.Namespace) -> IngestOptions:
    return IngestOptions(
        host=args.host,
        port=args.port,
        group=args.group,
        client_id=args.client_id or f"edged-ingest-{socket.gethostname()}",
        results_topic=args.topic,
        stats_topic=args.stats_topic,
        batch=max(1, args.batch),
        receive_max=max(4 * args.batch, 100),
        session_expiry_s=args.session_expiry,
        ca_file=args.ca_file,
        cert_file=args.cert_file,
        key_file=args.key_file,
        username=args.username,
        password_file=args.password_file,
    )


def run_ingest_command(args: argparse.Namespace) -> int:
    """`edged ingest`: run until SIGTERM/SIGINT; `--report`: print the report (exit 1 on unexplained loss)."""
    db = open_database(args.db)
    try:
        if args.report:
            report = build_report(db)
            if args.json:
                sys.stdout.write(json.dumps(report, indent=2) + "\n")
            else:
                render_report(report, Console())
            return 1 if report["unexplained"] else 0
        return _run(_options(args), db)
    finally:
        db.close()


def _run(opts: IngestOptions, db: Database) -> int:
    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    ingest = Ingest(opts, db)
    try:
        ingest.start()
        log.info("ingest: writing to %s; SIGTERM or Ctrl-C stops", db.url)
        stop.wait()
    finally:
        ingest.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 0 if ingest.writer.death is None else 1
