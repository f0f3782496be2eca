"""The docs hold to the code: every link resolves (file and heading), every `edged` command in a shell block is
one edged's own parser accepts, every repository path they name exists, the troubleshooting table is the one
the reason catalog generates and each catalog entry's example is its own shape. (Every reasons line a test
sees must match the catalog: conftest's session check, tests/reasons_seen.py.)"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import reasons_table
from conftest import ASSETS, REPO, Broker, StartDaemon, Subscribe, base_config, wait_for, write_config

from edged.cli import _parser
from edged.ops.reasons import CATALOG, explain

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]+\]\(([^)\s]+)\)")
# a repository path named in prose or a command: scripts/..., deploy/..., benchmarks/..., docs/..., systemd/...
REPO_PATH = re.compile(r"(?<![\w/.-])((?:scripts|deploy|benchmarks|docs|systemd|tests)/[\w./-]*\w)")


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)
    return {slug(m) for m in re.findall(r"^#+ (.+)$", text, re.MULTILINE)}


def prose(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def shell_lines(page: Path) -> list[str]:
    """The lines of the page's shell blocks (```sh, or a block with no language), comments removed."""
    lines: list[str] = []
    language = None  # None: outside a block
    for line in prose(page).splitlines():
        if line.startswith("```"):
            language = line[3:].strip() if language is None else None
        elif language in ("sh", "bash", "") and line.strip():
            lines.append(line.split(" #", 1)[0].strip())
    return lines


def edged_commands(line: str) -> list[list[str]]:
    """The edged invocations in one shell line (after sudo, a venv path or `python -m`), as argv lists."""
    out = []
    for part in re.split(r"\s*(?:&&|\|\||[|;&])\s*", line):
        try:
            words = shlex.split(part)
        except ValueError:
            continue
        while words and (words[0] == "sudo" or "=" in words[0]):
            words = words[1:]
        if words[:2] == [".venv/bin/python", "-m"] or words[:2] == ["python", "-m"]:
            words = words[2:]
        if words and words[0].rsplit("/", 1)[-1] == "edged":
            out.append(words[1:])
    return out


def accepted(argv: list[str]) -> bool:
    """Whether edged's own parser takes these arguments (`--help` exits 0: accepted)."""
    try:
        _parser().parse_args(argv)
    except SystemExit as exc:
        return not exc.code
    return True


def test_the_docs_are_pages_in_the_operators_order_and_the_readme_is_short() -> None:
    readme = prose(REPO / "README.md")
    assert 100 <= readme.count("\n") <= 250
    linked = [m for m in LINK.findall(readme) if m.startswith("docs/")]
    for page in ("getting-started", "configuration", "status", "mqtt", "models", "store-and-forward", "fleet",
                 "home-assistant-and-metrics", "architecture", "benchmarks", "cli"):  # fmt: skip
        assert f"docs/{page}.md" in linked, f"the README does not lead to docs/{page}.md"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_resolves_to_a_file_and_a_heading(page: Path) -> None:
    broken = []
    for target in LINK.findall(prose(page)):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.name}")
    assert not broken, broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_repository_path_the_docs_name_exists(page: Path) -> None:
    text = re.sub(r"```(?:json|text|yaml|python|toml)\n.*?```", "", prose(page), flags=re.DOTALL)
    missing = sorted({p for p in REPO_PATH.findall(text) if not (REPO / p).exists() and "*" not in p})
    assert not missing, missing


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_edged_command_in_the_docs_is_one_edged_accepts(page: Path) -> None:
    refused = [line for line in shell_lines(page) for argv in edged_commands(line) if not accepted(argv)]
    assert not refused, refused


def test_the_docs_commands_are_found() -> None:
    """The extraction above sees the commands (a regex that matched nothing would pass everything)."""
    found = [argv[0] for page in PAGES for line in shell_lines(page) for argv in edged_commands(line) if argv]
    assert {"status", "check-config", "run", "quantize", "fleet", "ingest"} <= set(found)


def test_the_troubleshooting_table_is_the_one_the_catalog_generates() -> None:
    text = prose(REPO / "docs" / "status.md")
    assert reasons_table.page_with_table(text) == text, "run scripts/reasons_table.py and commit docs/status.md"


def test_the_command_line_page_is_the_one_the_parser_generates() -> None:
    """docs/cli.md is edged's own --help pages: one declaration per option makes the flag and its docs."""
    script = [sys.executable, str(REPO / "scripts" / "cli_reference.py"), "--check"]
    checked = subprocess.run(script, capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    page = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    assert "### edged fleet send" in page
    assert "--signing-key KEY, --key KEY" in page  # a shared option, declared once


@pytest.mark.parametrize("reason", CATALOG, ids=lambda r: r.example[:50])
def test_each_reason_example_is_its_own_shape(reason: object) -> None:
    """An example matched first by another entry would be explained by the wrong line."""
    assert explain(reason.example) is reason  # type: ignore[attr-defined]


def test_an_unknown_reason_matches_nothing() -> None:
    assert explain("something edged never says") is None
    assert explain("pipeline cam0 running") is None


@pytest.mark.integration
def test_the_table_scripts_check_mode_fails_on_a_stale_page(tmp_path: Path) -> None:
    stale = tmp_path / "status.md"
    text = prose(REPO / "docs" / "status.md")
    stale.write_text(text.replace("What to do:", "Do:", 1), encoding="utf-8")
    script = [sys.executable, str(REPO / "scripts" / "reasons_table.py"), "--page", str(stale)]
    checked = subprocess.run([*script, "--check"], capture_output=True, text=True, check=False)
    assert checked.returncode == 1
    assert "differs from the catalog" in checked.stdout


def documented(page: str) -> set[str]:
    """The names a docs page shows as code: `key` (and each key of a `{"a", "b"}` list inside one)."""
    text = prose(REPO / "docs" / page)
    return set(re.findall(r'`"?([\w.\[\]]+)"?', text)) | set(re.findall(r'"(\w+)"', text))


def test_every_field_of_real_messages_is_on_the_mqtt_page(
    tmp_path: Path, broker: Broker, subscribe: Subscribe, start_daemon: StartDaemon
) -> None:
    """A real run (the bundled model and video, a real broker): each field of the result, availability, clock
    and stats messages it publishes is named on docs/mqtt.md (or, for the stats' status snapshot, docs/status.md)."""
    cfg = base_config(tmp_path, ASSETS / "digits.int8.onnx", str(ASSETS / "sample.mp4"), broker=broker, fps=20)
    cfg["mqtt"]["stats_interval_s"] = 0.5
    sub = subscribe(broker, f"edged/{cfg['device_id']}/#")
    start_daemon(write_config(tmp_path / "edged.yaml", cfg))
    stats_topic = f"edged/{cfg['device_id']}/stats"
    clock_topic = f"edged/{cfg['device_id']}/clock"
    wait_for(lambda: sub.results() and sub.payloads(stats_topic) and sub.payloads(clock_topic), 60,
             "a result, a stats and a clock message")  # fmt: skip
    mqtt_page, status_page = documented("mqtt.md"), documented("status.md")
    result = sub.results()[0]
    missing = [f"result.{k}" for k in result if k not in mqtt_page]
    missing += [f"result.latency_ms.{k}" for k in result["latency_ms"] if k not in mqtt_page]
    missing += [f"result.result.{k}" for k in result["result"] if k not in mqtt_page]
    stats = json.loads(sub.payloads(stats_topic)[-1][0])
    missing += [f"stats.{k}" for k in stats if k not in mqtt_page | status_page]
    missing += [f"stats.spool.{k}" for k in stats["spool"] if k not in status_page]
    missing += [f"stats.mqtt.{k}" for k in stats["mqtt"] if k not in status_page]
    missing += [f"stats.pipelines[].{k}" for k in stats["pipelines"][0] if k not in status_page]
    missing += [f"stats.clock.{k}" for k in stats["clock"] if k not in status_page]
    clock = json.loads(sub.payloads(f"edged/{cfg['device_id']}/clock")[-1][0])  # retained, sent on connect
    missing += [f"clock.{k}" for k in clock if k not in mqtt_page]
    assert not missing, f"fields published but not documented: {missing}"
    assert sub.payloads(f"edged/{cfg['device_id']}/status")[0][0] == b"online"


def test_the_architecture_page_names_every_module_in_its_stages_row() -> None:
    """docs/architecture.md draws the tree as it is: each module of a stage folder is named in that stage's row
    of the table, and each top-level module in the `top` row."""
    rows = {}
    for line in prose(REPO / "docs" / "architecture.md").splitlines():
        if found := re.match(r"\| `(\w+)/` \|", line):
            rows[found.group(1)] = line
        elif line.startswith("| top |"):
            rows["top"] = line
    missing = []
    for path in sorted((REPO / "edged").rglob("*.py")):
        if path.name in {"__init__.py", "__main__.py"} or "assets" in path.parts:
            continue
        parts = path.relative_to(REPO / "edged").parts
        stage = parts[0] if len(parts) > 1 else "top"
        if f"`{path.name}`" not in rows.get(stage, ""):
            missing.append(str(path.relative_to(REPO)))
    assert not missing, f"modules the architecture page does not name: {missing}"
