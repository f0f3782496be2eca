"""docs/configuration.md's table is generated from the schema (scripts/config_table.py): documented
defaults cannot drift (`spool.batch_max`/`batch_ms` were documented as 32/200 while they were 128/1000)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import config_table
import pytest
from conftest import REPO

from edged.config import Config


def test_the_docs_table_is_the_one_the_schema_generates() -> None:
    text = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert config_table.page_with_table(text) == text, "run scripts/config_table.py and commit docs/configuration.md"


def test_the_table_shows_the_schemas_defaults_and_every_registered_part() -> None:
    rows = {key: default for key, default, _ in config_table.rows(Config)}
    assert rows["`spool.batch_max`"] == "`128`"
    assert rows["`spool.batch_ms`"] == "`1000`"
    assert rows["`spool.max_bytes`"] == "`256MiB`"
    assert rows["`spool.max_age`"] == "`7d`"
    assert rows["`pipelines[].name`"] == "required"
    tagged = [key for key in rows if "(`" in key]
    assert "`pipelines[].source` (`type: sensor`)" in tagged
    assert "`pipelines[].postprocess` (`type: detect`)" in tagged
    assert "`pipelines[].publish` (`mode: interval`)" in tagged


@pytest.mark.integration
def test_check_mode_fails_on_a_stale_page_and_the_rewrite_mends_it(tmp_path: Path) -> None:
    stale = tmp_path / "configuration.md"
    text = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    stale.write_text(text.replace("| `spool.batch_max` | `128` |", "| `spool.batch_max` | `32` |"), encoding="utf-8")
    script = [sys.executable, str(REPO / "scripts" / "config_table.py"), "--page", str(stale)]
    checked = subprocess.run([*script, "--check"], capture_output=True, text=True, check=False)
    assert checked.returncode == 1
    assert "differs from the schema" in checked.stdout
    subprocess.run(script, check=True)
    assert stale.read_text(encoding="utf-8") == text
