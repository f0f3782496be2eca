"""deploy/install.sh against a staging root (--prefix): every step it runs, without touching this machine.

A real chroot or container is not available to the test suite, so the installer's --prefix mode runs each
step (user and group via useradd/groupadd --prefix, the venv and pip install, unit, drop-in, config, models)
into a temporary root; only systemctl is skipped, which the script reports.
"""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from conftest import REPO

INSTALL = REPO / "deploy" / "install.sh"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(INSTALL), *args], capture_output=True, text=True, timeout=600, check=False)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A staging root with this machine's user database (useradd --prefix edits the copy)."""
    if shutil.which("useradd") is None:
        pytest.fail("useradd (package passwd) is missing")
    r = tmp_path_factory.mktemp("root")
    (r / "etc").mkdir()
    for name in ("passwd", "group", "shadow", "gshadow"):
        if Path("/etc", name).exists():
            shutil.copy(Path("/etc", name), r / "etc" / name)
    (r / "etc" / "nv_tegra_release").write_text("# R36 (release), REVISION: 3.0\n", encoding="utf-8")  # a Jetson
    return r


def test_install_is_complete_and_idempotent_then_uninstall_keeps_data_and_purge_removes_it(root: Path) -> None:
    first = run("--prefix", str(root))
    assert first.returncode == 0, first.stderr
    assert "platform: jetson" in first.stdout
    assert "not calling systemctl" in first.stdout
    unit = root / "etc/systemd/system/edged.service"
    assert unit.read_text() == (REPO / "systemd/edged.service").read_text()
    assert (root / "etc/systemd/system/edged.service.d/jetson-gpu.conf").exists()
    config = root / "etc/edged/edged.yaml"
    assert stat.S_IMODE(config.stat().st_mode) == 0o640
    assert "TensorrtExecutionProvider" in config.read_text()
    assert (root / "var/lib/edged/models/digits.int8.onnx").exists()
    assert "edged:x:" in (root / "etc/passwd").read_text()
    video = next(line for line in (root / "etc/group").read_text().splitlines() if line.startswith("video:"))
    assert "edged" in video.split(":")[3].split(",")
    venv_python = root / "opt/edged/venv/bin/python"
    check = subprocess.run([str(venv_python), "-m", "edged", "--version"], capture_output=True, text=True, check=False)
    assert check.returncode == 0
    assert check.stdout.startswith("edged ")
    assert "include-system-site-packages = true" in (root / "opt/edged/venv/pyvenv.cfg").read_text()  # Jetson

    config.write_text(config.read_text() + "# edited by the operator\n", encoding="utf-8")
    second = run("--prefix", str(root))
    assert second.returncode == 0, second.stderr
    assert "kept the existing" in second.stdout
    assert "edited by the operator" in config.read_text()
    assert (root / "etc/passwd").read_text().count("\nedged:") == 1

    removed = run("--prefix", str(root), "--uninstall")
    assert removed.returncode == 0, removed.stderr
    assert not unit.exists()
    assert not (root / "opt/edged").exists()
    assert config.exists()
    assert (root / "var/lib/edged/models").exists()

    purged = run("--prefix", str(root), "--uninstall", "--purge")
    assert purged.returncode == 0, purged.stderr
    assert not (root / "etc/edged").exists()
    assert not (root / "var/lib/edged").exists()
    assert "edged:x:" not in (root / "etc/passwd").read_text()


def test_bad_options_are_refused() -> None:
    res = run("--platform", "windows", "--prefix", "/tmp/nowhere")
    assert res.returncode == 1
    assert "--platform must be pi, jetson or generic" in res.stderr
