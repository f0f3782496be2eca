"""The Debian package: scripts/build-deb builds it, and dpkg installs, upgrades, removes and purges it in a
staging root (dpkg --root with --force-script-chrootless: the maintainer scripts honour DPKG_ROOT, so no
chroot is needed; --force-depends: the staging root's dpkg database has no python3, passwd or systemd).

The staging root starts with this machine's user database (the scripts' useradd --prefix edits the copy).
Nothing on this machine changes. Skipped, with the reason, where dpkg-deb or a Debian python3 is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]
BUILD = REPO / "scripts" / "build-deb"


def need_tools() -> None:
    if shutil.which("dpkg-deb") is None or shutil.which("dpkg") is None:
        pytest.skip("dpkg-deb is not installed (a Debian or Ubuntu machine has it)")
    if not Path("/usr/bin/python3").exists():
        pytest.skip("no /usr/bin/python3: the package is built for the distribution's interpreter")
    if shutil.which("useradd") is None:
        pytest.skip("useradd (package passwd) is missing")
    if os.geteuid() != 0:
        pytest.skip("dpkg needs root: the maintainer scripts give files to the edged user (in the staging root)")


@pytest.fixture(scope="module")
def debs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Version 1 as built, and a version 2 repacked from it (an upgrade without a second venv build)."""
    need_tools()
    out = tmp_path_factory.mktemp("deb")
    res = subprocess.run([str(BUILD), "--out", str(out), "--compress", "none"], capture_output=True, text=True,
                         timeout=600, check=False)  # fmt: skip
    assert res.returncode == 0, res.stderr
    first = next(out.glob("edged_*-1_*.deb"))
    tree = out / "tree"
    subprocess.run(["dpkg-deb", "-R", str(first), str(tree)], check=True)
    control = tree / "DEBIAN" / "control"
    control.write_text(control.read_text().replace("-1\n", "-2\n", 1))
    second = out / first.name.replace("-1_", "-2_")
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Znone", "-b", str(tree), str(second)], check=True,
                   capture_output=True)  # fmt: skip
    shutil.rmtree(tree)
    return first, second


def staging(root: Path) -> Path:
    (root / "etc").mkdir(parents=True)
    for name in ("passwd", "group", "shadow", "gshadow"):
        if Path("/etc", name).exists():
            shutil.copy(Path("/etc", name), root / "etc" / name)
    for sub in ("info", "updates"):
        (root / "var/lib/dpkg" / sub).mkdir(parents=True)
    (root / "var/lib/dpkg/status").touch()
    return root


def dpkg(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = ["dpkg", f"--root={root}", "--force-script-chrootless", "--force-depends", "--log=/dev/null", *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr
    return res


def status(root: Path) -> str:
    return subprocess.run(["dpkg", f"--root={root}", "-s", "edged"], capture_output=True, text=True, check=False).stdout


def test_install_upgrade_remove_and_purge_follow_debian_policy(debs: tuple[Path, Path], tmp_path: Path) -> None:
    first, second = debs
    root = staging(tmp_path / "root")
    dpkg(root, "-i", str(first))
    assert "Status: install ok installed" in status(root)
    assert "Version: 0.1.0-1" in status(root)
    user = next(line for line in (root / "etc/passwd").read_text().splitlines() if line.startswith("edged:"))
    uid, gid = user.split(":")[2:4]
    assert user.endswith(":/var/lib/edged:/usr/sbin/nologin")  # a system user without a login
    wants = root / "etc/systemd/system/multi-user.target.wants/edged.service"
    assert wants.is_symlink()  # installed and enabled
    assert (root / "lib/systemd/system/edged.service").read_text() == (REPO / "systemd/edged.service").read_text()
    config = root / "etc/edged/edged.yaml"
    assert oct(config.stat().st_mode & 0o777) == "0o640"
    assert str(config.stat().st_gid) == gid  # readable by edged, by nobody else
    models = root / "var/lib/edged/models"
    assert str(models.stat().st_uid) == uid
    assert (models / "digits.int8.onnx").is_file()
    version = subprocess.run([str(root / "opt/edged/venv/bin/python"), "-m", "edged", "--version"],
                             capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert version.stdout.strip() == "edged 0.1.0", version.stderr
    shebang = (root / "opt/edged/venv/bin/edged").read_text().splitlines()[0]
    assert shebang == "#!/opt/edged/venv/bin/python"  # relocated from the build directory
    assert (root / "usr/bin/edged").resolve(strict=False) == Path("/opt/edged/venv/bin/edged")

    # the operator edits the config; an upgrade keeps the edit (a conffile), the user, the state
    config.write_text(config.read_text() + "# edited on the device\n")
    (models / "mine.onnx").write_bytes(b"x")
    dpkg(root, "--force-confold", "-i", str(second))
    assert "Version: 0.1.0-2" in status(root)
    assert config.read_text().endswith("# edited on the device\n")
    assert (models / "mine.onnx").exists()
    assert [line for line in (root / "etc/passwd").read_text().splitlines() if line.startswith("edged:")] == [user]
    assert wants.is_symlink()

    # remove: the program and the unit go (masked until purge, as dh_installsystemd does), the
    # configuration and the data stay
    dpkg(root, "-r", "edged")
    assert not (root / "opt/edged").exists()
    assert not (root / "lib/systemd/system/edged.service").exists()
    assert not wants.exists()
    assert (root / "etc/systemd/system/edged.service").readlink() == Path("/dev/null")
    assert config.exists()
    assert (models / "mine.onnx").exists()
    assert "Status: deinstall ok config-files" in status(root)

    # purge: the configuration and the data go too; the system user stays (policy)
    dpkg(root, "-P", "edged")
    assert not (root / "etc/edged").exists()
    assert not (root / "var/lib/edged").exists()
    assert status(root) == ""
    assert not list((root / "etc/systemd/system").rglob("edged.service"))  # unmasked, its enable state gone
    assert user in (root / "etc/passwd").read_text()


def test_lintian_has_nothing_unexplained(debs: tuple[Path, Path], tmp_path: Path) -> None:
    if shutil.which("lintian") is None:
        pytest.skip("lintian is not installed (apt install lintian)")
    first, _ = debs
    packed = tmp_path / first.name  # as released: compressed (the test builds use none, which lintian flags)
    tree = tmp_path / "tree"
    subprocess.run(["dpkg-deb", "-R", str(first), str(tree)], check=True)
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "-b", str(tree), str(packed)], check=True,
                   capture_output=True)  # fmt: skip
    res = subprocess.run(["lintian", "--no-tag-display-limit", str(packed)], capture_output=True, text=True,
                         timeout=600, check=False)  # fmt: skip
    tags = [line for line in res.stdout.splitlines() if line[:2] in ("E:", "W:")]
    assert tags == [], "\n".join(tags[:20])
