"""A generated section of a docs page: the text between two HTML comment markers, made by a script and checked
by the tests (scripts/config_table.py, scripts/reasons_table.py)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path


def replaced(text: str, start: str, end: str, section: str, page: str) -> str:
    """`text` with what lies between the markers `start` and `end` replaced by `section` (markers included)."""
    if start not in text or end not in text:
        raise SystemExit(f"{page}: the markers of the generated section are missing")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return head + section + tail


def main(argv: list[str] | None, *, page: Path, wanted: Callable[[str], str], source: str, script: str) -> int:
    """Rewrite the page's section, or with --check exit 1 when it differs from what `wanted` makes of it."""
    parser = argparse.ArgumentParser(description=f"Generate the section of {page.name} from {source}.")
    parser.add_argument("--check", action="store_true", help=f"exit 1 when the page differs from {source}")
    parser.add_argument("--page", type=Path, default=page, help="the page to check or rewrite")
    args = parser.parse_args(argv)
    text = args.page.read_text(encoding="utf-8")
    new = wanted(text)
    if args.check:
        if new != text:
            print(f"{args.page}: the generated section differs from {source}: run {script}")
            return 1
        return 0
    args.page.write_text(new, encoding="utf-8")
    return 0
