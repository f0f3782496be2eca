"""The layer contract (pyproject.toml, checked by lint-imports in scripts/test) also holds across processes: a
module that starts `python -m edged.X` depends on X as if it imported it, which lint-imports cannot see. Such a
child process may only run a module of the same stage or an earlier one; a later stage is handed in by whoever
is allowed to name it (the CLI hands the daemon the rollout's model check)."""

from __future__ import annotations

import ast
import re
from typing import TypeGuard

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


# what threading.Thread keeps for itself, in every Python edged supports (3.13 added `_handle`, a name edged's
# controller used for a method: every remote command then died on "'_ThreadHandle' object is not callable")
THREAD_PRIVATE = {"_handle", "_started", "_is_stopped", "_tstate_lock", "_stop", "_wait_for_tstate_lock", "_target",
                  "_args", "_kwargs", "_name", "_ident", "_native_id", "_daemonic", "_stderr", "_invoke_excepthook",
                  "_bootstrap", "_bootstrap_inner", "_delete", "_set_ident", "_set_native_id", "_set_tstate_lock",
                  "_reset_internal_locks", "_context", "_set_os_name", "_os_thread_handle"}  # fmt: skip


def _sets_on_self(node: ast.AST) -> TypeGuard[ast.Attribute]:
    return (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
            and isinstance(node.ctx, ast.Store))  # fmt: skip


def test_no_thread_subclass_takes_a_name_threading_thread_keeps_for_itself() -> None:
    """A `threading.Thread` subclass must not define a method or set an attribute whose name the Thread class
    uses privately in any supported Python: it silently replaces Thread's own (held for 3.10 to 3.13)."""
    import importlib
    import threading

    private = THREAD_PRIVATE | {n for n in dir(threading.Thread) if n.startswith("_") and not n.startswith("__")}
    private |= {n for n in vars(threading.Thread()) if n.startswith("_")}
    clashes = []
    for path in sorted((REPO / "edged").rglob("*.py")):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            cls = getattr(importlib.import_module(module), node.name, None)
            if not (isinstance(cls, type) and issubclass(cls, threading.Thread)):
                continue
            names = {n.name for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
            names |= {t.attr for t in ast.walk(node) if _sets_on_self(t)}
            clashes += [f"{path.relative_to(REPO)} {node.name}.{n}" for n in sorted(names & private)]
    assert not clashes, clashes
