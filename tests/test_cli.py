"""The command line's help pages: each says what the command does, what its arguments are, the defaults
and the exit status, all from one place (edged/cli.py: EXITS and the help formatter)."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from edged.cli import EXITS, _parser, commands

COMMANDS = commands(_parser())


def test_every_command_is_documented_with_its_exit_status() -> None:
    assert {name for name, _ in COMMANDS} == set(EXITS)


@pytest.mark.parametrize(("name", "parser"), COMMANDS, ids=[name for name, _ in COMMANDS])
def test_each_help_page_has_a_summary_described_arguments_defaults_and_exit_status(
    name: str, parser: argparse.ArgumentParser
) -> None:
    page = parser.format_help()
    assert parser.description, f"{name}: no summary on its page"
    assert " ".join(parser.description.split()) in " ".join(page.split())
    assert "exit status: 0 " in page
    for action in parser._actions:  # noqa: SLF001
        if isinstance(action, argparse._HelpAction):  # noqa: SLF001
            continue
        assert action.help, f"{name}: {action.dest} has no help"
        shows_default = action.default is not None and not isinstance(action.default, bool) and action.option_strings
        if shows_default:
            described = parser._get_formatter()._get_help_string(action) or ""  # noqa: SLF001
            assert "default" in described, f"{name}: {action.option_strings[0]} does not say its default"


def test_the_signing_key_and_the_tls_key_have_distinct_names() -> None:
    page = " ".join(dict(COMMANDS)["fleet send"].format_help().split())
    assert "--signing-key KEY, --key KEY" in page  # --key stays for scripts that use it
    assert "not the TLS --key-file" in page
    assert "--key-file KEY_FILE" in page


def test_help_runs_from_the_console_script() -> None:
    res = subprocess.run([sys.executable, "-m", "edged", "quantize", "--help"], capture_output=True, text=True,
                         check=False, timeout=60)  # fmt: skip
    assert res.returncode == 0
    assert res.stdout.splitlines()[0].startswith("usage: edged quantize")
    assert "exit status: 0 the int8 model was written" in " ".join(res.stdout.split())
