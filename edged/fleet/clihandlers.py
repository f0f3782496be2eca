"""From the parsed `edged ingest` and `edged fleet` arguments to the ingest (or its report) and back to an exit code."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import socket
import sys
import threading
from types import FrameType
from typing import Any

from rich.console import Console

from edged.control.envelope import new_command
from edged.core.errors import EdgedError
from edged.core.signing import generate_key, load_private_key
from edged.fleet.ingest import Ingest, IngestOptions
from edged.fleet.ingestdb import Database, open_database
from edged.fleet.report import build_report, render_report
from edged.fleet.rollout import RolloutPlan, run_rollout
from edged.fleet.send import BrokerOptions, FleetClient

log = logging.getLogger(__name__)


def _options(args: argparse.Namespace) -> IngestOptions:
    return IngestOptions(
        host=args.host,
        port=args.port,
        protocol=args.protocol,
        group=args.group,
        client_id=args.client_id or f"edged-ingest-{socket.gethostname()}",
        results_topic=args.topic,
        stats_topic=args.stats_topic,
        clock_topic=args.clock_topic,
        batch=max(1, args.batch),
        receive_max=max(4 * args.batch, 100),
        session_expiry_s=args.session_expiry,
        replay_topic=args.replay_topic,
        replay_after_s=max(0.0, args.replay_after),
        quarantine_rows=max(1, args.quarantine_rows),
        quarantine_bytes=args.quarantine_bytes,
        ca_file=args.ca_file,
        cert_file=args.cert_file,
        key_file=args.key_file_tls,
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
    ingest = Ingest(opts, db, on_death=stop.set)
    try:
        ingest.start()
        log.info("ingest: writing to %s; SIGTERM or Ctrl-C stops", db.url)
        stop.wait()
    finally:
        ingest.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 0 if ingest.writer.death is None else 1


EXIT_UNANSWERED = 3  # `fleet send`: a device that was expected did not answer within --wait


def run_fleet_command(args: argparse.Namespace) -> int:
    """`edged fleet keygen|send|rollout`."""
    if args.fleet_command == "keygen":
        public = generate_key(args.key)
        sys.stdout.write(f"wrote {args.key} (keep it private). Put this in each device's config:\n"
                         f"control:\n  public_keys: [\"{public}\"]\n")  # fmt: skip
        return 0
    broker = BrokerOptions(args.host, args.port, args.ca_file, args.cert_file, args.key_file_tls, args.username,
                           args.password_file)  # fmt: skip
    if args.fleet_command == "rollout":
        return _rollout(args, broker)
    command_args = _json_object(args.args, "--args")
    target = args.device or f"group:{args.group}"
    fleet = FleetClient(broker, load_private_key(args.key))
    try:
        # a refusal before the device trusts the command comes on its public replies topic (the default one)
        fleet.listen(f"edged/{args.device or '+'}/events", lambda _topic, _body: None)
        replies = fleet.send(new_command(args.cmd, target, command_args))
        expect = args.expect or (1 if args.device else 1 << 30)
        answers = fleet.wait(replies, expect=expect, timeout=args.wait)
    finally:
        fleet.close()
    sys.stdout.write(json.dumps(answers, indent=2, default=str) + "\n")
    for device, answer in sorted(answers.items()):
        if not answer.get("ok"):
            sys.stderr.write(f"edged fleet: device {device}: {answer.get('reason')}: {answer.get('detail')}\n")
    refused = any(not a.get("ok") for a in answers.values())
    short = _unanswered(args, answers, expect)
    if short and not refused:
        sys.stderr.write(f"edged fleet: {short}\n")
        return EXIT_UNANSWERED
    return 1 if refused else 0


def _unanswered(args: argparse.Namespace, answers: dict[str, Any], expect: int) -> str | None:
    """What did not answer within --wait, in one line; None when every device expected did (a group without
    --expect: at least one)."""
    wanted = expect if args.device or args.expect else 1
    if len(answers) >= wanted:
        return None
    if args.device:
        who = f"device {args.device}"
    elif args.expect:
        who = f"{wanted - len(answers)} of {wanted} device(s) in group {args.group}"
    else:
        who = f"no device in group {args.group}"
    hint = (
        "a recording takes frames x every / fps seconds: give --wait more"
        if args.cmd == "record"
        else "is it online, with control: on and your public key in control.public_keys?"
    )
    return f"{who} did not answer within {args.wait:g} s ({hint})"


def _json_object(text: str | None, flag: str) -> dict[str, Any]:
    try:
        value = json.loads(text) if text else {}
    except ValueError as exc:
        raise EdgedError(f"{flag} is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise EdgedError(f"{flag} must be a JSON object")
    return value


def _rollout(args: argparse.Namespace, broker: BrokerOptions) -> int:
    device_args: dict[str, Any] = {"watch_s": args.watch, "min_fps_ratio": args.min_fps_ratio,
                                   "max_slowdown": args.max_slowdown, "frames": args.frames}  # fmt: skip
    if args.gates:
        device_args["gates"] = _json_object(args.gates, "--gates")
    plan = RolloutPlan(model=args.model, group=args.group, devices=args.device or [], canary=args.canary,
                       pipeline=args.pipeline, via=args.via, url=args.url, serve=args.serve,
                       device_args=device_args, wait_s=args.wait)  # fmt: skip
    console = Console(stderr=args.json)
    fleet = FleetClient(broker, load_private_key(args.key))
    try:
        result = run_rollout(fleet, plan, lambda line: console.print(line, markup=False, highlight=False))
    finally:
        fleet.close()
    if args.json:
        sys.stdout.write(json.dumps(result.as_dict(), indent=2, default=str) + "\n")
    else:
        kept = sum(1 for a in result.answers.values() if a.get("ok"))
        total = len(result.canary) + len(result.rest)
        console.print(f"{kept} of {total} device(s) run {result.sha256[:16]}..."
                      + (f"; {result.stopped}" if result.stopped else ""), markup=False)  # fmt: skip
    return 0 if result.ok else 1
