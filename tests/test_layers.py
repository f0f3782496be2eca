"""The layer contract (pyproject.toml, checked by lint-imports in scripts/test) also holds across processes: a
module that starts `python -m edged.X` depends on X as if it imported it, which lint-imports cannot see. Such a
child process may only run a module of the same stage or an earlier one; a later stage is handed in by whoever
is allowed to name it (the CLI hands the daemon the rollout's model check)."""

from __future__ import annotations

import ast
import re

from conftest import REPO

PACKAGE = REPO / "edged"


def layers() -> list[list[str]]:
    """The contract's layers, first (highest) to last, each a list of packages."""
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")  # no tomllib before Python 3.11
    block = re.search(r'type = "layers"\nlayers = \[(.*?)\]', text, re.DOTALL)
    assert block, "pyproject.toml: no layers contract"
    return [[name.strip() for name in layer.split("|")] for layer in re.findall(r'"([^"]+)"', block.group(1))]


def layer_of(module: str, order: list[list[str]]) -> int:
    for index, names in enumerate(order):
        if any(module == name or module.startswith(name + ".") for name in names):
            return index
    raise AssertionError(f"{module} is in no layer of the contract")


def children() -> list[tuple[str, str]]:
    """(module, the module it runs as a child process) for every `-m edged.…` in the package."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        text = path.read_text(encoding="utf-8")
        found += [(module, target) for target in re.findall(r'"-m",\s*"(edged(?:\.\w+)+)"', text)]
    return found


def test_child_processes_run_only_earlier_stages() -> None:
    order = layers()
    later = [(m, t) for m, t in children() if layer_of(t, order) < layer_of(m, order)]
    assert not later, f"a module runs a later stage in a child process: {later}"


def test_the_rollout_check_is_found_and_handed_in_by_the_cli() -> None:
    """The scan sees the one child process edged starts (a scan that found nothing would prove nothing)."""
    assert ("edged.cli", "edged.tools.candidate") in children()


MAX_METHODS = 15  # a class with more does several jobs: split it (docs/architecture.md)


def test_no_class_has_more_than_fifteen_methods() -> None:
    """Small parts with one job each: every class of the package has at most MAX_METHODS methods."""
    big = []
    for path in sorted((REPO / "edged").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                methods = [n for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
                if len(methods) > MAX_METHODS:
                    big.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {len(methods)} methods")
    assert not big, big
