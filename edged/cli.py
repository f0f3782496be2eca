"""Command line: argument parsing only; everything else lives in the modules it calls."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from edged import __version__
from edged.config import default_config_path, load_config
from edged.errors import ConfigError, EdgedError
from edged.status import EXIT_NOT_RUNNING

log = logging.getLogger("edged")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="edged", description="On-device inference daemon.")
    parser.add_argument("--version", action="version", version=f"edged {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the daemon")
    run.add_argument("--config", type=Path, help="config file (default $EDGED_CONFIG or /etc/edged/edged.yaml)")

    demo = sub.add_parser("demo", help="bundled model + sample video; publishes to localhost:1883 if a broker answers")
    demo.add_argument("--state-dir", type=Path, default=Path("edged-demo"), help="spool and status socket")
    demo.add_argument("--host", default="localhost", help="MQTT broker host")
    demo.add_argument("--port", type=int, default=1883, help="MQTT broker port")
    demo.add_argument("--fps", type=float, default=None, help="frames/s (default 10, the video's; 0 = max)")
    demo.add_argument("--loop", action="store_true", help="play the video again and again until Ctrl-C")
    demo.add_argument("--quiet", action="store_true", help="no line per result")

    status = sub.add_parser("status", help="show the running daemon's state")
    where = status.add_mutually_exclusive_group()
    where.add_argument("--config", type=Path, help="find the socket through this config")
    where.add_argument("--socket", type=Path, help="the status socket")
    status.add_argument("--json", action="store_true", help="print the raw status JSON")

    check = sub.add_parser("check-config", help="validate a config file")
    check.add_argument("file", type=Path)
    return parser


def _setup_logging(level: int) -> None:
    fmt = "%(levelname)s %(name)s: %(message)s"
    if sys.stderr.isatty():
        fmt = "%(asctime)s " + fmt
    logging.basicConfig(level=level, format=fmt, stream=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `edged` console script."""
    args = _parser().parse_args(argv)
    _setup_logging(logging.DEBUG if args.verbose else logging.INFO)
    try:
        if args.command == "check-config":
            return _check_config(args.file)
        if args.command == "status":
            return _status(args.config, args.socket, as_json=args.json)
        if args.command == "demo":
            from edged.demo import run_demo  # noqa: PLC0415  (keeps `edged status` light)

            return run_demo(
                state_dir=args.state_dir, host=args.host, port=args.port, fps=args.fps, loop=args.loop, quiet=args.quiet
            )
        return _run(args.config or default_config_path(), verbose=args.verbose)
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 1
    except EdgedError as exc:
        print(f"edged: error: {exc}", file=sys.stderr)
        return EXIT_NOT_RUNNING if args.command == "status" else 1


def _check_config(path: Path) -> int:
    config = load_config(path)
    print(f"{path}: OK ({len(config.pipelines)} pipeline(s), device {config.device_id})")
    return 0


def _run(path: Path, *, verbose: bool) -> int:
    from edged.daemon import Daemon, run_daemon  # noqa: PLC0415

    config = load_config(path)
    if not verbose:
        logging.getLogger().setLevel(config.log_level.upper())
    return run_daemon(Daemon(config))


def _status(config_path: Path | None, socket_path: Path | None, *, as_json: bool) -> int:
    from edged.status import exit_code, query, render  # noqa: PLC0415

    if socket_path is None:
        socket_path = load_config(config_path or default_config_path()).status_socket
    snapshot = query(socket_path)
    if as_json:
        print(json.dumps(snapshot, indent=2))
    else:
        render(snapshot, color=None if sys.stdout.isatty() else False)
    return exit_code(snapshot)
