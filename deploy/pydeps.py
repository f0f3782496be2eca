"""Which of edged's runtime dependencies pip should install here, and which the platform provides.

Run by deploy/install.sh (and scripts/setup) with the venv's own python, before edged is installed, so it
uses nothing outside the standard library (Python >= 3.8: JetPack 5's Ubuntu 20.04).

On JetPack, NVIDIA's `onnxruntime-gpu` and JetPack's OpenCV (built with GStreamer and CUDA) are installed
system-wide, and the venv sees them (`--system-site-packages`). A plain `pip install edged` would still put
PyPI's CPU `onnxruntime` and `opencv-python-headless` into the venv, ahead of them: pip matches requirements
by distribution name, and `onnxruntime-gpu` or a Debian `python3-opencv` is not `onnxruntime` or
`opencv-python-headless` to it. So the installer runs `pip install --no-deps edged` and then only what this
prints: every requirement of pyproject.toml's `dependencies`, less the ones whose module the platform
already provides (importable by this interpreter). numpy goes with them: a system OpenCV is built against
the system numpy, and a newer one from PyPI in the venv would break `import cv2`.

    python3 deploy/pydeps.py [--pyproject FILE]      # requirements to stdout, one per line
    python3 deploy/pydeps.py --explain               # what is provided by whom, to stderr too
    python3 deploy/pydeps.py --check onnxruntime cv2 # exit 1 unless each imports (install.sh, scripts/setup)

Exit 1 when a provided module crashes on import (a segfault, an illegal instruction: a wheel built for
another CPU, or an emulator), with a message that says so instead of "not installed".
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

# requirement name -> the module the platform may provide instead
PROVIDABLE = {"onnxruntime": "onnxruntime", "opencv-python-headless": "cv2", "numpy": "numpy"}
PROBE = (
    "import importlib, os, sys\n"
    "m = importlib.import_module(sys.argv[1])\n"
    "f = os.path.realpath(getattr(m, '__file__', '') or '')\n"
    "own = f.startswith(os.path.realpath(sys.prefix) + os.sep)\n"
    "print('venv' if own else 'system', getattr(m, '__version__', '?'), f)\n"
)


def dependencies(pyproject: Path) -> list[str]:
    """The `dependencies = [...]` array of pyproject.toml (no TOML parser before Python 3.11)."""
    text = pyproject.read_text(encoding="utf-8")
    match = re.search(r"^dependencies\s*=\s*\[(.*?)^\]", text, re.MULTILINE | re.DOTALL)
    if match is None:
        raise SystemExit(f"pydeps: no dependencies array in {pyproject}")
    return re.findall(r'"([^"]+)"', match.group(1))


def requirement_name(req: str) -> str:
    return re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0].strip().lower()


def import_state(module: str) -> tuple[str, str]:
    """`import module` in a child interpreter: ("venv" | "system", "version at path") when it imports,
    ("missing", the error) when it is not installed, ("crashed", why) when it is there but does not
    import (a signal: a wheel for another CPU or an emulator; or an error such as a missing library)."""
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, module], capture_output=True, text=True, timeout=120, check=False
    )
    if proc.returncode == 0:
        where, _, detail = proc.stdout.strip().partition(" ")
        return where, detail
    if proc.returncode < 0 or proc.returncode >= 128:
        signal = -proc.returncode if proc.returncode < 0 else proc.returncode - 128
        return "crashed", f"signal {signal}"
    last = (proc.stderr.strip().splitlines() or [""])[-1]
    if "ModuleNotFoundError" in last or "No module named" in last:
        return "missing", last
    return "crashed", last


def probe(module: str) -> tuple[str, str | None]:
    """("present", "version at path"): the platform provides it (outside this venv); ("missing", None):
    pip installs it (absent, or installed in this venv by an earlier run, which pip then keeps or
    upgrades); ("crashed", why): it is there but does not import."""
    state, detail = import_state(module)
    if state == "system":
        return "present", detail
    if state == "crashed":
        return "crashed", detail
    return "missing", None


def check_imports(modules: list[str]) -> int:
    """`--check`: every module imports; else one line each, a crash told apart from a missing module."""
    failed = 0
    for module in modules:
        state, detail = import_state(module)
        if state == "crashed":
            print(f"error: 'import {module}' crashed ({detail}): its wheel does not run on this CPU or emulator",
                  file=sys.stderr)  # fmt: skip
        elif state == "missing":
            print(f"error: {module} did not install: {detail}", file=sys.stderr)
        failed += state in ("crashed", "missing")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--pyproject", type=Path, default=Path(__file__).resolve().parent.parent / "pyproject.toml")
    parser.add_argument("--explain", action="store_true", help="say on stderr what the platform provides")
    parser.add_argument("--check", nargs="+", metavar="MODULE", help="only check that these modules import")
    args = parser.parse_args(argv)
    if args.check:
        return check_imports(args.check)
    out, broken = [], []
    for req in dependencies(args.pyproject):
        module = PROVIDABLE.get(requirement_name(req))
        if module is None:
            out.append(req)
            continue
        state, detail = probe(module)
        if state == "present":
            if args.explain:
                print(f"pydeps: {module} is provided by the platform ({detail}); not installing {req}", file=sys.stderr)
        elif state == "crashed":
            broken.append(f"{module} is installed but crashes on import ({detail})")
        else:
            out.append(req)
    if broken:
        for line in broken:
            print(
                f"pydeps: error: {line}: a wheel for another CPU, or an emulator it does not run under", file=sys.stderr
            )
        return 1
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
