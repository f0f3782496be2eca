"""Command line: argument parsing only; everything else lives in the modules it calls."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edged import __version__
from edged.control.names import ALL_COMMANDS
from edged.core.configfile import default_config_path
from edged.core.errors import ConfigError, EdgedError
from edged.ops.logs import setup_logging
from edged.ops.status import EXIT_NOT_RUNNING

DEMO_STATE_DIR = Path("edged-demo")  # `edged demo`'s state, relative to where it runs (scripts/demo: the checkout)

# how the daemon judges a rollout's model: a child process (a malformed model crashes it, not the daemon) of
# edged/tools/candidate.py, handed to the daemon from here so that no stage names a later one; not imported
# here either: the tools need the `tools` extra, the daemon does not
CANDIDATE_CHECK = (sys.executable, "-m", "edged.tools.candidate")
MODEL_PROBE = (sys.executable, "-m", "edged.tools.probe")  # a model that died with the daemon, loaded apart first

log = logging.getLogger("edged")
TOOLS = ("inspect", "quantize", "validate", "bench", "budget", "record")

# Every command's exit status, shown at the end of its --help (and in docs/getting-started.md's command table). Any
# command exits 1 on an error it can name (a line on stderr says what; never a traceback) and 2 on a
# command line argparse refuses.
EXITS = {
    "run": "0 stopped (SIGTERM, Ctrl-C, or every pipeline ended); 1 a config or start-up error, or a pipeline failed",
    "demo": "0 the video played to its end (or Ctrl-C with --loop); 1 an error",
    "status": "0 running; 1 degraded (the reasons say why); 2 not running, or its socket cannot be read",
    "record": "0 the frames were written; 1 an error (no frame came within --timeout)",
    "check-config": "0 valid; 1 a problem (one line each: file:line key=value: message)",
    "prepare": "0 every engine is built; 1 a pipeline failed or the config has a problem",
    "inspect": "0 onnxruntime loads the model; 1 it does not (the report says why), or an error",
    "quantize": "0 the int8 model was written; 1 an error, or no recipe kept the fp32 answers; 3 int8 is slower "
    "than fp32 here (nothing written; --accept-slower writes it)",
    "validate": "0 every gate passed; 1 a gate failed, or an error",
    "bench": "0 measured; 1 an error",
    "budget": "0 computed; 1 an error",
    "ingest": "0 stopped (--report: no result lost without a reason); 1 the database writer died, or an error "
    "(--report: a result lost without a reason)",
    "fleet keygen": "0 the key was written; 1 an error (an existing key is never overwritten)",
    "fleet send": "0 every device expected answered ok; 1 one answered not ok or refused the command (its reason "
    "is in the JSON and on stderr, e.g. busy, bad_signature); 3 one did not answer within --wait (a line on stderr "
    "says which)",
    "fleet rollout": "0 every device runs the new model; 1 the rollout stopped (a canary failed), or an error",
}


def commands(parser: argparse.ArgumentParser, path: str = "") -> list[tuple[str, argparse.ArgumentParser]]:
    """Every command and subcommand that runs something (those without subcommands of their own), by name."""
    found: list[tuple[str, argparse.ArgumentParser]] = []
    for action in parser._actions:  # noqa: SLF001  (argparse has no public walk of its subcommands)
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for name, sub in action.choices.items():
                found += commands(sub, f"{path} {name}".strip())
    return found or [(path, parser)]


class _HelpFormatter(argparse.HelpFormatter):
    """Every option with a default says it: `(default: X)` is added unless the help already names its
    default; flags (store_true) and options without one (None) say nothing."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or default is None
            or default is argparse.SUPPRESS
            or isinstance(default, bool)
            or not action.option_strings
        ):
            return text
        shown = ",".join(map(str, default)) if isinstance(default, list | tuple) else "%(default)s"
        return f"{text} (default: {shown})"


def _document(parser: argparse.ArgumentParser, path: str = "") -> None:
    """One place for what every --help page says beyond its options: the command's summary (its line in
    `edged --help`) as the page's description, and its exit status as the epilog."""
    parser.formatter_class = _HelpFormatter
    for action in parser._actions:  # noqa: SLF001  (argparse has no public walk of its subcommands)
        if not isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            continue
        summaries = {a.dest: a.help for a in action._choices_actions}  # noqa: SLF001
        for name, sub in action.choices.items():
            command = f"{path} {name}".strip()
            if sub.description is None and summaries.get(name):
                summary = str(summaries[name])
                sub.description = summary[0].upper() + summary[1:] + "."
            if command in EXITS:
                sub.epilog = f"exit status: {EXITS[command]}"
            _document(sub, command)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="edged", description="On-device inference daemon.")
    parser.add_argument("--version", action="version", version=f"edged {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser(
        "run",
        help="run the daemon",
        description="Run the daemon. SIGTERM or SIGINT stops it cleanly (a second signal exits at once); SIGHUP "
        "reloads the config.",
    )
    _shared(run, "config")

    demo = sub.add_parser("demo", help="bundled model + sample video; publishes to localhost:1883 if a broker answers")
    demo.add_argument("--state-dir", type=Path, default=DEMO_STATE_DIR, help="spool and status socket")
    demo.add_argument("--host", default="localhost", help="MQTT broker host")
    demo.add_argument("--port", type=int, default=1883, help="MQTT broker port")
    demo.add_argument("--fps", type=float, default=None, help="frames/s (default 10, the video's; 0 = max)")
    demo.add_argument("--loop", action="store_true", help="play the video again and again until Ctrl-C")
    demo.add_argument("--quiet", action="store_true", help="no line per result")

    status = sub.add_parser(
        "status",
        help="show the running daemon's state",
        description="Show the running daemon's state: running, or degraded with one line per reason "
        "(docs/status.md says what each means and what to do). A config that does not load is a note: the daemon "
        "is still asked.",
    )
    where = status.add_mutually_exclusive_group()
    where.add_argument("--config", type=Path, help="find the socket through this config")
    where.add_argument("--socket", type=Path, help="the status socket")
    _shared(status, "json", help="print the raw status JSON")
    status.add_argument(
        "--wide", action="store_true", help="print every line whole (default: cut at the terminal's width, 80 piped)"
    )
    status.add_argument("--watch", action="store_true", help="refresh in place until Ctrl-C")
    status.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes with --watch")

    rec = sub.add_parser(
        "record",
        help="save frames from a pipeline's source for quantize --calib / validate --data",
        description="Save frames from a pipeline's own source, preprocessed as the daemon would, as a set for "
        "quantize --calib and validate --data. Stop the daemon first when the camera is exclusive.",
    )
    _shared(rec, "config")
    rec.add_argument("--pipeline", help="which pipeline's source (default the first)")
    rec.add_argument("-o", "--out", type=Path, required=True, help="the .npz to write")
    rec.add_argument("--frames", type=int, default=200, help="frames to keep (default 200)")
    rec.add_argument("--every", type=int, default=1, help="keep one frame in this many (default 1)")
    rec.add_argument("--timeout", type=float, default=120.0, help="give up after this many seconds")

    check = sub.add_parser(
        "check-config",
        help="validate a config file",
        description="Validate a config file with every check `run` makes before it opens a device: the schema and "
        "its cross-field rules, then each model as its pipeline would use it (it loads in ONNX Runtime, its input "
        "fits `preprocess` or the sensor window, its labels and head fit `postprocess`). Each problem is one line, "
        "file:line key=value: message, on the key at fault. When it is valid, each pipeline's decoder says what it "
        "reads (which outputs, which layout, which box encoding).",
    )
    check.add_argument("file", type=Path, help="the config file to check (model files, cameras and all)")

    prep = sub.add_parser(
        "prepare",
        help="build the TensorRT engines a config needs, ahead of `edged run`",
        description="Build the TensorRT engines a config needs, ahead of `edged run` (progress in the log); "
        "nothing to do without TensorRT.",
    )
    prep.add_argument("config", type=Path, nargs="?", help=CONFIG_HELP)
    _tool_parsers(sub)
    _document(parser)
    return parser


def _shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(x) for x in text.replace("x", ",").split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a shape: {text!r} (e.g. 1,3,224,224)") from None
    if not dims or min(dims) < 1:
        raise argparse.ArgumentTypeError(f"not a shape: {text!r} (e.g. 1,3,224,224)")
    return dims


# Options several commands share, each declared once: its flags, help and default drive every command's
# --help and docs/cli.md (generated by scripts/cli_reference.py from this parser).
CONFIG_HELP = "config file (default $EDGED_CONFIG or /etc/edged/edged.yaml)"
SHARED: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "config": (("--config",), {"type": Path, "help": CONFIG_HELP}),
    "json": (("--json",), {"action": "store_true", "help": "machine-readable report"}),
    "shape": (("--shape",), {"type": _shape, "help": "pin dynamic input axes, e.g. 1,3,224,224"}),
    "signing-key": (
        ("--signing-key", "--key"),
        {
            "dest": "key",
            "type": Path,
            "required": True,
            "help": "the Ed25519 key that signs (edged fleet keygen; not the TLS --key-file)",
        },
    ),
}


def _shared(parser: argparse.ArgumentParser | argparse._ArgumentGroup, name: str, **override: Any) -> None:
    """Add the shared option `name` (SHARED), with `override` (a command's own help, say) on top."""
    flags, kwargs = SHARED[name]
    parser.add_argument(*flags, **{**kwargs, **override})


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from None


def _frame_size(text: str) -> tuple[int, int]:
    w, _, h = text.lower().partition("x")
    try:
        return int(w), int(h)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a frame size: {text!r} (e.g. 640x480)") from None


def _preprocess_args(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("the pipeline (default: the model's edged.preprocess metadata)")
    group.add_argument(
        "--config",
        type=Path,
        help="take preprocessing from a pipeline of this config (and, for quantize and validate, its postprocess: "
        "the daemon's decoder is the judge)",
    )
    group.add_argument("--pipeline", help="which pipeline of --config (when it has several)")
    group.add_argument("--preprocess", metavar="JSON", help="keys as in the config, e.g. '{\"size\": [224, 224]}'")


Subparsers = argparse._SubParsersAction  # noqa: SLF001  (argparse has no public name for it)


def _tool_parsers(sub: Subparsers[argparse.ArgumentParser]) -> None:
    _inspect_parser(sub)
    _quantize_parser(sub)
    _validate_parser(sub)
    _bench_parser(sub)
    _budget_parser(sub)
    _ingest_parser(sub)
    _fleet_parser(sub)


def _size(text: str) -> int:
    """A size flag: bytes, or 64MiB / 1GB."""
    from edged.core.units import parse_size  # noqa: PLC0415  (argument parsing only)

    try:
        value = parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    if not isinstance(value, int) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (bytes, or 64MiB / 1GB)")
    return value


def _ingest_parser(sub: Subparsers[argparse.ArgumentParser]) -> None:
    i = sub.add_parser(
        "ingest",
        help="land every device's results in SQLite or PostgreSQL, exactly once",
        description="The consumer side: land every device's results in SQLite or PostgreSQL, exactly once "
        "(docs/fleet.md). With --report: which device lost which seqs, and whether its own stats say why.",
    )
    i.add_argument("--db", default="edged-results.db", help="SQLite file (default) or postgresql://... URL")
    i.add_argument("--report", action="store_true", help="say which device lost which results and why; exit 1 "
                   "when some were lost without a reason")  # fmt: skip
    _shared(i, "json", help="--report as JSON")
    i.add_argument("--protocol", choices=("5", "3.1.1"), default="5",
                   help="MQTT version (default 5; 3.1.1 for a broker without 5: no shared subscriptions)")  # fmt: skip
    i.add_argument("--group", default="edged-ingest", help="shared-subscription group ('' = plain subscription)")
    i.add_argument("--client-id", help="MQTT client id, stable across restarts (default edged-ingest-<host name>)")
    i.add_argument("--topic", default="edged/+/+/results", help="results topic filter")
    i.add_argument("--stats-topic", default="edged/+/stats", help="the devices' stats topic filter")
    i.add_argument("--clock-topic", default="edged/+/clock",
                   help="the devices' clock corrections topic filter (docs/mqtt.md: Time)")  # fmt: skip
    i.add_argument("--batch", type=int, default=1000, help="results per transaction at most")
    i.add_argument("--session-expiry", type=int, default=86_400, help="seconds the broker keeps our session")
    i.add_argument(
        "--replay-topic",
        default="edged/{device_id}/replay",
        help="ask a device for seqs that did not arrive on <this>/request, read its answers on <this>/answer "
        "(docs/mqtt.md: Replay); '' never asks",
    )
    i.add_argument(
        "--replay-after", type=float, default=5.0, help="seconds a seq may be missing before it is asked for"
    )
    i.add_argument("--quarantine-rows", type=int, default=1000,
                   help="refused messages kept per device at most; the oldest go first (counted)")  # fmt: skip
    i.add_argument("--quarantine-bytes", default="64MiB", type=_size,
                   help="refused messages' bytes kept in all at most (64MiB, 1GB); the oldest go first")  # fmt: skip
    _broker_args(i)


def _fleet_parser(sub: Subparsers[argparse.ArgumentParser]) -> None:
    f = sub.add_parser("fleet", help="signing keys and signed commands for devices with control: on")
    fsub = f.add_subparsers(dest="fleet_command", required=True)
    keygen = fsub.add_parser(
        "keygen",
        help="write a new Ed25519 signing key; print the config line for devices",
        description="Write a new Ed25519 signing key (mode 0600, never over an existing file) and print the "
        "control.public_keys line for devices.",
    )
    keygen.add_argument("key", type=Path, help="the private key file to write (mode 0600, never overwritten)")
    send = fsub.add_parser(
        "send",
        help="send one signed command; print the devices' answers",
        description="Send one signed command and print the devices' answers as JSON, by device.",
    )
    send.add_argument("cmd", choices=ALL_COMMANDS, help="the command (docs/fleet.md)")
    to = send.add_mutually_exclusive_group(required=True)
    to.add_argument("--device", help="one device id")
    to.add_argument("--group", help="every device in this group (control.groups)")
    _shared(send, "signing-key")
    send.add_argument("--args", help='the command\'s arguments as JSON, e.g. \'{"config": {"log_level": "debug"}}\'')
    send.add_argument("--wait", type=float, default=30.0, help="seconds to wait for answers (default 30)")
    send.add_argument("--expect", type=int, help="stop waiting once this many devices answered")
    _broker_args(send)
    roll = fsub.add_parser(
        "rollout",
        help="a new model to a group: canary first, the rest only if it holds",
        description="Roll a new model out to a group: the canary devices first, the rest only if it holds (each "
        "device validates it on its recent frames, then watches its rate and latency; docs/fleet.md).",
    )
    roll.add_argument("model", type=Path, help="the new .onnx file")
    to = roll.add_mutually_exclusive_group(required=True)
    to.add_argument("--group", help="the devices of this group (found from their retained state)")
    to.add_argument("--device", action="append", help="a device id (repeat for more)")
    _shared(roll, "signing-key")
    roll.add_argument("--pipeline", help="the pipeline whose model changes (default: each device's first)")
    roll.add_argument("--canary", default="1", help="devices that go first: a count or a share like 10%% (default 1)")
    roll.add_argument("--via", choices=["url", "mqtt"], default="url", help="how devices fetch it (default url)")
    roll.add_argument("--serve", help="serve the file from here at HOST:PORT (an address devices reach)")
    roll.add_argument("--url", help="or: the model's http(s) URL on a server of yours")
    roll.add_argument("--watch", type=float, default=120.0, help="seconds each device watches the new model")
    roll.add_argument("--min-fps-ratio", type=float, default=0.8, help="roll back below this share of the rate")
    roll.add_argument("--max-slowdown", type=float, default=1.5, help="reject a model this much slower (p50)")
    roll.add_argument("--frames", type=int, default=30, help="recent frames each device validates on")
    roll.add_argument("--gates", help="edged validate gates as JSON, e.g. '{\"min_top1\": 0.97}'")
    roll.add_argument("--wait", type=float, default=900.0, help="seconds to wait for each phase (default 900)")
    _shared(roll, "json", help="the outcome per device as JSON")
    _broker_args(roll)


def _broker_args(p: argparse.ArgumentParser) -> None:
    """How a command on the operator's side reaches the broker: one declaration for ingest, fleet send and
    fleet rollout."""
    p.add_argument("--host", default="localhost", help="MQTT broker host")
    p.add_argument("--port", type=int, default=1883, help="MQTT broker port")
    p.add_argument("--ca-file", type=Path, help="TLS: CA of the broker's certificate")
    p.add_argument("--cert-file", type=Path, help="TLS: client certificate")
    p.add_argument(
        "--key-file",
        dest="key_file_tls",
        metavar="KEY_FILE",
        type=Path,
        help="TLS: the client certificate's key (not a signing key)",
    )
    p.add_argument("--username", help="MQTT user name")
    p.add_argument("--password-file", type=Path, help="file holding the MQTT password (not readable by others)")


def _inspect_parser(sub: Subparsers[argparse.ArgumentParser]) -> None:
    ins = sub.add_parser(
        "inspect",
        help="what a model is: I/O, opsets, quantization, metadata, providers",
        description="What a model is: inputs and outputs (dynamic axes marked), opsets and whether this "
        "onnxruntime loads it, size, sha256, quantization, metadata, the providers here.",
    )
    ins.add_argument("model", type=Path, help="the .onnx file")
    _shared(ins, "json")


def _quantize_parser(sub: Subparsers[argparse.ArgumentParser]) -> None:
    from edged.tools import CALIBRATION_METHODS, QUANT_TYPES  # noqa: PLC0415  (light: no onnxruntime import)

    q = sub.add_parser(
        "quantize",
        help="static int8 quantization (QDQ) with calibration frames",
        description="Static int8 quantization (QDQ): tries the candidate recipes and keeps the fastest that keeps "
        "the answers on this machine, judged by the pipeline's own decode with --config; calibrates on images, a "
        "video or saved frames (docs/models.md).",
    )
    q.add_argument("model", type=Path, help="the fp32 .onnx")
    q.add_argument("-o", "--output", type=Path, required=True, help="the int8 .onnx to write (not the input)")
    q.add_argument("--calib", type=Path, required=True, help="folder of images, video file, or .npz of frames")
    q.add_argument("--calib-limit", type=int, default=256, help="use at most this many frames (default 256)")
    q.add_argument("--recipe", help="a fixed recipe by name (no search); see docs/models.md")
    q.add_argument(
        "--target",
        choices=("auto", "cpu", "tensorrt"),
        default="auto",
        help="which recipes to try (default auto: tensorrt where TensorRT is offered, else cpu)",
    )
    q.add_argument("--accept-slower", action="store_true", help="write the best int8 model even if fp32 is faster")
    q.add_argument("--labels", help="write edged.labels: a text file (one label per line) or a,b,c")
    q.add_argument("--method", choices=CALIBRATION_METHODS, help="fixed recipe: calibration method (minmax)")
    q.add_argument("--activation-type", choices=QUANT_TYPES, help="fixed recipe: int8 (symmetric) or uint8")
    q.add_argument("--weight-type", choices=QUANT_TYPES, help="fixed recipe: int8 (symmetric) or uint8")
    q.add_argument("--per-tensor", action="store_true", help="per-tensor weights instead of per-channel")
    q.add_argument("--asymmetric-activations", action="store_true", help="activation zero points other than 0")
    q.add_argument(
        "--exclude-nodes",
        help="fixed recipe: nodes to leave in float, a,b,c (as the search's edged.quantization metadata lists them)",
    )
    q.add_argument(
        "--reduce-range",
        choices=("auto", "yes", "no"),
        default="auto",
        help="7-bit weights; auto: on an x86 CPU without VNNI, where 8-bit weights saturate (default auto)",
    )
    q.add_argument("--percentile", type=float, default=99.999, help="for --method percentile")
    _shared(q, "shape")
    q.add_argument("--no-optimize", action="store_true", help="skip ORT's graph optimisation in pre-processing")
    _shared(q, "json")
    _gate_args(q)
    _preprocess_args(q)


def _gate_args(p: argparse.ArgumentParser, *, cosine_default: float = 0.98) -> None:
    """The agreement gates an int8 model must keep (validate's verdict, quantize's choice of recipe)."""
    g = p.add_argument_group("gates (by the task: top-1, matched boxes, keypoints, masks; other outputs by cosine)")
    g.add_argument("--min-top1", type=float, default=0.95, help="top-1 agreement (classifiers; default 0.95)")
    g.add_argument("--min-topk", type=float, default=None, help="top-k overlap (default: not enforced)")
    g.add_argument(
        "--min-cosine",
        type=float,
        default=cosine_default,
        help=f"mean cosine similarity per output not judged by its boxes or masks (default {cosine_default})",
    )
    g.add_argument(
        "--min-detection-match", type=float, default=0.9, help="detectors: precision and recall (default 0.9)"
    )
    g.add_argument("--min-mask-iou", type=float, default=0.9, help="dense maps: mask IoU (default 0.9)")
    g.add_argument(
        "--max-pixel-error",
        type=float,
        default=0.02,
        help="dense maps: mean absolute error per pixel as a share of the map's range (default 0.02)",
    )
    g.add_argument(
        "--max-keypoint-error",
        type=float,
        default=0.05,
        help="keypoints of matched boxes: mean distance as a share of the box's diagonal (default 0.05)",
    )


def _validate_parser(sub: Subparsers[argparse.ArgumentParser]) -> None:
    v = sub.add_parser(
        "validate",
        help="compare an int8 model with its fp32 parent; exit 1 if a threshold fails",
        description="Compare an int8 model with its fp32 parent, judged by the task: top-1 for a classifier, "
        "matched boxes for a detector, mask IoU and pixel error for a dense map, cosine otherwise.",
    )
    v.add_argument("reference", type=Path, help="the fp32 model")
    v.add_argument("candidate", type=Path, help="the int8 model (or the same model on another provider)")
    v.add_argument("--data", type=Path, required=True, help="held-out frames: image folder, video, or .npz")
    v.add_argument("--limit", type=int, default=500, help="use at most this many frames (default 500)")
    _gate_args(v)
    v.add_argument("--top-k", type=int, default=5, help="k of the top-k overlap (default 5)")
    v.add_argument("--max-abs", type=float, default=None, help="max absolute error per output (default: not enforced)")
    v.add_argument("--rtol", type=float, default=1e-3, help="np.allclose rtol (default 1e-3)")
    v.add_argument("--atol", type=float, default=1e-3, help="np.allclose atol (default 1e-3)")
    v.add_argument("--require-allclose", action="store_true", help="fail unless np.allclose holds everywhere")
    v.add_argument("--wide", action="store_true", help="every figure per output (wider than 80 columns)")
    v.add_argument(
        "--task",
        choices=("auto", "classify", "detect", "dense", "raw"),
        default="auto",
        help="auto: from the first output's shape: a YOLO head or boxes, class scores [1, C], a map [1, C, H, W]",
    )
    v.add_argument("--mask-threshold", type=float, default=0.5, help="dense maps: pixel on above (default 0.5)")
    v.add_argument("--ref-provider", default="CPUExecutionProvider", help="provider of the reference")
    v.add_argument("--provider", default="CPUExecutionProvider", help="provider of the candidate")
    _shared(v, "json")
    _preprocess_args(v)


def _bench_parser(sub: Subparsers[argparse.ArgumentParser]) -> None:
    b = sub.add_parser("bench", help="latency p50/p95/p99 and throughput per model, provider and thread count")
    b.add_argument("models", type=Path, nargs="+", help="one or more .onnx (fp32 and int8 side by side)")
    b.add_argument("--providers", help="comma-separated (default: every provider this machine offers)")
    b.add_argument("--threads", type=_int_list, default=[0], help="CPU intra-op threads to try, e.g. 1,2,4 (0 = auto)")
    b.add_argument("--runs", type=int, default=100, help="timed runs each (default 100)")
    b.add_argument("--warmup", type=int, default=10, help="untimed runs first (default 10)")
    b.add_argument("--data", type=Path, help="run on a real frame from here instead of a random tensor")
    _shared(b, "shape")
    b.add_argument("--plot", type=Path, help="PNG of the latency distributions (needs the plot extra)")
    _shared(b, "json")
    _preprocess_args(b)


def _budget_parser(sub: Subparsers[argparse.ArgumentParser]) -> None:
    from edged.tools.networks import PRESETS  # noqa: PLC0415

    g = sub.add_parser("budget", help="edge vs cloud: latency terms, winner, break-even uplink, monthly cost")
    edge = g.add_mutually_exclusive_group(required=True)
    edge.add_argument("--edge-ms", type=float, help="edge inference time per frame (ms)")
    edge.add_argument("--model", type=Path, help="measure the edge inference time of this model here")
    g.add_argument("--provider", help="with --model: the provider to measure on (default: the best here)")
    _shared(g, "shape", help="with --model: pin dynamic input axes, e.g. 1,3,224,224")
    g.add_argument("--preset", choices=sorted(PRESETS), default="lte", help="network preset (default lte)")
    g.add_argument("--uplink", type=float, help="uplink Mbit/s (overrides the preset)")
    g.add_argument("--downlink", type=float, help="downlink Mbit/s (overrides the preset)")
    g.add_argument("--rtt", type=float, help="round-trip time ms (overrides the preset)")
    payload = g.add_mutually_exclusive_group()
    payload.add_argument("--payload-kb", type=float, help="bytes sent per frame, in kB (1000 bytes)")
    payload.add_argument(
        "--frame", type=_frame_size, help="send a JPEG of WxH (default: the --model's input size, else 640x480)"
    )
    g.add_argument("--response-bytes", type=float, default=500.0, help="result size sent back (default 500)")
    g.add_argument("--cloud-ms", type=float, default=5.0, help="cloud inference time (default 5 ms, a server GPU)")
    g.add_argument("--queue-ms", type=float, default=20.0, help="cloud queueing/batching delay (default 20 ms)")
    g.add_argument("--fps", type=float, help="frames/s sent (for the monthly cost)")
    g.add_argument("--price-per-1k", type=float, help="cloud price per 1000 calls, USD (for the monthly cost)")
    g.add_argument("--data-price-gb", type=float, default=0.0, help="metered uplink, USD per GB (default 0)")
    g.add_argument("--edge-monthly", type=float, default=0.0, help="edge device cost per month, USD (default 0)")
    _shared(g, "json")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `edged` console script."""
    args = _parser().parse_args(argv)
    setup_logging(logging.DEBUG if args.verbose else logging.INFO)
    command = COMMANDS.get(args.command, _command_tool if args.command in TOOLS else _command_run)
    try:
        return command(args)
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 1
    except EdgedError as exc:
        print(f"edged: error: {exc}", file=sys.stderr)
        return EXIT_NOT_RUNNING if args.command == "status" else 1


# each command's function; the heavy parts are imported only when their command runs (`edged status` stays light)


def _command_check_config(args: argparse.Namespace) -> int:
    return _check_config(args.file, verbose=args.verbose)


def _command_prepare(args: argparse.Namespace) -> int:
    from edged.config import load_config  # noqa: PLC0415  (the schema imports every stage)
    from edged.tools.prepare import prepare  # noqa: PLC0415

    return prepare(load_config(args.config or default_config_path()))


def _command_status(args: argparse.Namespace) -> int:
    return _status(
        args.config, args.socket, as_json=args.json, wide=args.wide, watch=args.watch, interval=args.interval
    )


def _command_tool(args: argparse.Namespace) -> int:
    from edged.tools.clihandlers import run_tool  # noqa: PLC0415

    return run_tool(args)


def _command_ingest(args: argparse.Namespace) -> int:
    from edged.fleet.clihandlers import run_ingest_command  # noqa: PLC0415  (psycopg: only when asked)

    return run_ingest_command(args)


def _command_fleet(args: argparse.Namespace) -> int:
    from edged.fleet.clihandlers import run_fleet_command  # noqa: PLC0415  (cryptography: only when asked)

    return run_fleet_command(args)


def _command_demo(args: argparse.Namespace) -> int:
    from edged.demo import run_demo  # noqa: PLC0415

    return run_demo(state_dir=args.state_dir, host=args.host, port=args.port, fps=args.fps, loop=args.loop,
                    quiet=args.quiet)  # fmt: skip


def _command_run(args: argparse.Namespace) -> int:
    return _run(args.config or default_config_path(), verbose=args.verbose)


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "check-config": _command_check_config,
    "prepare": _command_prepare,
    "status": _command_status,
    "ingest": _command_ingest,
    "fleet": _command_fleet,
    "demo": _command_demo,
    "run": _command_run,
}


def _check_config(path: Path, *, verbose: bool = False) -> int:
    from edged.ops.checkconfig import check_config  # noqa: PLC0415  (the schema imports every stage)

    if not verbose:  # one line per problem, nothing else: the model loads log at INFO
        logging.getLogger().setLevel(logging.WARNING)
    readings: dict[str, str] = {}
    config = check_config(path, readings=readings)
    print(f"{path}: OK ({len(config.pipelines)} pipeline(s), device {config.device_id})")
    for name, reading in readings.items():  # what each decoder reads: outputs, layout, encoding
        print(f"  {name}: {reading}")
    from edged.capture.camera import CameraSourceConfig, missing_device  # noqa: PLC0415

    for p in config.pipelines:  # valid, but worth a look: a device path that names nothing now (a typo?)
        if isinstance(p.source, CameraSourceConfig) and (missing := missing_device(p.source.uri)) is not None:
            print(f"  note: {p.name}: {missing}")
    from edged.core.clock import ask  # noqa: PLC0415

    synced, said = ask(config.clock)
    if not synced:  # valid, and normal offline: what results will say until a time service vouches for the clock
        print(f"  note: the clock is not synchronized now ({said}; clock.sync: {config.clock.sync}): results are "
              "flagged, and corrected once it is")  # fmt: skip
    return 0


def _run(path: Path, *, verbose: bool) -> int:
    from edged.config import load_config  # noqa: PLC0415
    from edged.control.trial import recover as recover_trial  # noqa: PLC0415
    from edged.daemon import Daemon, run_daemon  # noqa: PLC0415

    config = load_config(path)
    if not verbose:
        logging.getLogger().setLevel(config.log_level.upper())
    # a rollout's trial left behind by a crash: its model goes back in the file before the pipelines load it
    recovered = recover_trial(config.state_dir, path, check=load_config)
    if recovered is not None:
        config = load_config(path)
    return run_daemon(Daemon(config, config_path=path, candidate_check=CANDIDATE_CHECK, model_probe=MODEL_PROBE,
                             recovered=recovered))  # fmt: skip


def _answers(socket_path: Path) -> bool:
    from edged.ops.status import query  # noqa: PLC0415

    try:
        query(socket_path, timeout=1.0)
    except EdgedError:
        return False
    return True


def _status(
    config_path: Path | None, socket_path: Path | None, *, as_json: bool, wide: bool, watch: bool, interval: float
) -> int:
    from edged.ops.status import exit_code, query  # noqa: PLC0415
    from edged.ops.statusview import render  # noqa: PLC0415

    if socket_path is None:
        from edged.config import find_status_socket  # noqa: PLC0415

        socket_path, note = find_status_socket(config_path or default_config_path())
        if note:  # a broken config is a note, not the answer: the daemon is still asked
            print(note, file=sys.stderr)
    color = None if sys.stdout.isatty() else False
    if watch:
        from edged.ops.statusview import watch as watch_status  # noqa: PLC0415

        return watch_status(socket_path, max(0.1, interval), color=color)
    try:
        snapshot = query(socket_path)
    except EdgedError as exc:
        if as_json:  # a program reading stdout gets an answer too (the message also goes to stderr, exit 2)
            print(json.dumps({"state": "not_running", "error": str(exc), "socket": str(socket_path)}, indent=2))
        demo = DEMO_STATE_DIR / "status.sock"
        if demo.exists() and demo.resolve() != socket_path.resolve() and _answers(demo):  # after scripts/demo
            print(f"note: the demo's daemon answers on: edged status --socket {demo}", file=sys.stderr)
        raise
    if as_json:
        print(json.dumps(snapshot, indent=2))
    else:
        render(snapshot, color=color, wide=wide)
    return exit_code(snapshot)
