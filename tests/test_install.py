"""deploy/install.sh against a staging root (--prefix): every step it runs, without touching this machine.

A real chroot or container is not available to the test suite, so the installer's --prefix mode runs each
step (user and group via useradd/groupadd --prefix, the venv and pip install, unit, drop-in, config, models,
enabling the unit offline) into a temporary root.

There is no Jetson here: NVIDIA's onnxruntime-gpu and JetPack's OpenCV are stood in for by "system" packages
on PYTHONPATH (this venv's real onnxruntime, cv2 and numpy, linked into a folder, with an onnxruntime-gpu
dist-info), which a venv made with --system-site-packages sees the way it sees /usr/lib/python3/dist-packages.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

INSTALL = REPO / "deploy" / "install.sh"


PYDEPS = REPO / "deploy" / "pydeps.py"


def run(*args: str, system: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(system)} if system is not None else None
    return subprocess.run(
        ["bash", str(INSTALL), *args], capture_output=True, text=True, timeout=600, check=False, env=env
    )


def stand_in_system(folder: Path, *modules: str) -> Path:
    """A folder of "system-wide" packages: this venv's real ones, linked (see the module docstring)."""
    import importlib

    folder.mkdir(parents=True, exist_ok=True)
    for name in modules:
        pkg = Path(importlib.import_module(name).__file__ or "").parent
        (folder / name).symlink_to(pkg)
        libs = pkg.parent / {"cv2": "opencv_python_headless.libs", "numpy": "numpy.libs"}.get(name, "-")
        if libs.exists():
            (folder / libs.name).symlink_to(libs)
    if "onnxruntime" in modules:  # what NVIDIA's wheel calls itself: not "onnxruntime" to pip
        info = folder / "onnxruntime_gpu-1.32.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: onnxruntime-gpu\nVersion: 1.32.0\n")
    return folder


def pydeps(system: Path | None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(system)} if system is not None else {**os.environ, "PYTHONPATH": ""}
    # -I would drop PYTHONPATH; a bare interpreter (not this venv) so that only the stand-ins are "system"
    base = Path(sys.base_prefix) / "bin" / "python3"
    return subprocess.run(
        [str(base), str(PYDEPS), "--explain"], capture_output=True, text=True, timeout=120, check=False, env=env
    )


def staging_root(r: Path) -> Path:
    """A staging root with this machine's user database (useradd --prefix edits the copy)."""
    if shutil.which("useradd") is None:
        pytest.fail("useradd (package passwd) is missing")
    (r / "etc").mkdir(parents=True)
    for name in ("passwd", "group", "shadow", "gshadow"):
        if Path("/etc", name).exists():
            shutil.copy(Path("/etc", name), r / "etc" / name)
    return r


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Jetson's staging root."""
    r = staging_root(tmp_path_factory.mktemp("root"))
    (r / "etc" / "nv_tegra_release").write_text("# R36 (release), REVISION: 3.0\n", encoding="utf-8")  # a Jetson
    return r


@pytest.fixture
def root_factory(tmp_path: Path) -> Path:
    """A plain staging root for one test."""
    return staging_root(tmp_path / "root")


def check_platform_packages_kept(res: subprocess.CompletedProcess[str], root: Path) -> None:
    """The platform's onnxruntime, OpenCV and numpy stay in use: none of them from PyPI in the venv; the
    installer says what the runtime offers."""
    assert "onnxruntime is provided by the platform" in res.stderr
    assert "cv2 is provided by the platform" in res.stderr
    site = next((root / "opt/edged/venv/lib").glob("python3*/site-packages"))
    assert not [p.name for p in site.iterdir() if p.name.lower().startswith(("onnxruntime", "cv2", "opencv", "numpy"))]
    assert "onnxruntime 1." in res.stdout
    assert "offers: " in res.stdout
    assert "CPUExecutionProvider" in res.stdout
    assert "GStreamer: " in res.stdout


@pytest.mark.integration
@pytest.mark.timeout(900)  # installs into a new venv twice (pip): over pytest's 120 s on a loaded 2-core machine
def test_install_is_complete_and_idempotent_then_uninstall_keeps_data_and_purge_removes_it(
    root: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    system = stand_in_system(tmp_path_factory.mktemp("system"), "onnxruntime", "cv2", "numpy")
    refused = run("--prefix", str(root), system=system)  # a Jetson whose onnxruntime has no GPU provider
    assert refused.returncode == 1
    assert "onnxruntime offers no CUDA or TensorRT provider" in refused.stderr
    first = run("--prefix", str(root), "--no-gpu-check", system=system)  # e.g. an image built elsewhere
    assert first.returncode == 0, first.stderr
    assert "platform: jetson" in first.stdout
    check_platform_packages_kept(first, root)
    wants = root / "etc/systemd/system/multi-user.target.wants/edged.service"
    assert wants.is_symlink()  # enabled offline: no running systemd in a staging root
    assert "enabled edged.service offline" in first.stdout
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
    second = run("--prefix", str(root), "--no-gpu-check", "--no-enable", system=system)
    assert second.returncode == 0, second.stderr
    assert "kept the existing" in second.stdout
    assert "edited by the operator" in config.read_text()
    assert (root / "etc/passwd").read_text().count("\nedged:") == 1

    removed = run("--prefix", str(root), "--uninstall")
    assert removed.returncode == 0, removed.stderr
    assert not unit.exists()
    assert not wants.is_symlink()
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


@pytest.mark.integration
def test_pydeps_leaves_out_what_the_platform_provides(tmp_path: Path) -> None:
    # nothing system-wide: every runtime dependency comes from PyPI
    plain = pydeps(None)
    assert plain.returncode == 0, plain.stderr
    assert {"onnxruntime>=1.16", "opencv-python-headless>=4.8", "numpy>=1.24"} <= set(plain.stdout.split())
    # a Pi with the distribution's python3-opencv: OpenCV and its numpy stay, onnxruntime comes from PyPI
    pi = pydeps(stand_in_system(tmp_path / "pi", "cv2", "numpy"))
    assert pi.returncode == 0, pi.stderr
    assert "onnxruntime>=1.16" in pi.stdout.split()
    assert not [r for r in pi.stdout.split() if r.startswith(("opencv", "numpy"))]
    assert "cv2 is provided by the platform" in pi.stderr
    # a Jetson: all three from the platform; the rest (pure Python) from PyPI
    jetson = pydeps(stand_in_system(tmp_path / "jetson", "onnxruntime", "cv2", "numpy"))
    assert jetson.returncode == 0, jetson.stderr
    from_pypi = [r.split(">")[0] for r in jetson.stdout.split()]
    assert from_pypi == ["paho-mqtt", "pyyaml", "ruamel.yaml", "pydantic", "rich", "cryptography", "prometheus-client"]


@pytest.mark.integration
def test_a_platform_package_that_crashes_is_told_apart_from_a_missing_one(tmp_path: Path) -> None:
    """onnxruntime segfaults under qemu 7.2 (it reads the x86 host's /proc/cpuinfo): that is a crash, not
    "did not install". Stood in for by a cv2 that kills itself with SIGSEGV."""
    crashing = tmp_path / "system"
    (crashing / "cv2").mkdir(parents=True)
    (crashing / "cv2" / "__init__.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    res = pydeps(crashing)
    assert res.returncode == 1
    assert "cv2 is installed but crashes on import (signal 11)" in res.stderr
    assert "did not install" not in res.stderr
    # the import check install.sh and scripts/setup run after installing: the same distinction
    base = Path(sys.base_prefix) / "bin" / "python3"
    env = {**os.environ, "PYTHONPATH": str(crashing)}
    checked = subprocess.run(
        [str(base), str(PYDEPS), "--check", "cv2", "no_such_module"],
        capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip
    assert checked.returncode == 1
    assert "'import cv2' crashed (signal 11)" in checked.stderr
    assert "no_such_module did not install" in checked.stderr


ARM64_CHECK = REPO / "scripts" / "arm64-check"


def test_arm64_check_arguments_and_dry_run(tmp_path: Path) -> None:
    """scripts/arm64-check itself takes 15-40 minutes as root (not CI's job); its argument handling is tested."""

    def check(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(ARM64_CHECK), *args], capture_output=True, text=True, timeout=60, check=False
        )

    helped = check("--help")
    assert helped.returncode == 0
    assert "--dry-run" in helped.stdout
    dry = check("--dry-run", "--root", str(tmp_path / "r"), "--mirror", "http://mirror.example/debian")
    assert dry.returncode == 0, dry.stderr
    assert "debootstrap --arch=arm64 --include=" in dry.stdout
    assert "http://mirror.example/debian" in dry.stdout
    assert f"remove {tmp_path / 'r'}" in dry.stdout
    assert not (tmp_path / "r").exists()  # a dry run changes nothing
    kept = check("--dry-run", "--keep", "--root", str(tmp_path / "r"))
    assert "remove" not in kept.stdout
    for bad in (["--bogus"], ["--root"], ["--mirror"], ["--root", "/"]):
        res = check(*bad)
        assert res.returncode == 2, bad
        assert "arm64-check:" in res.stderr


@pytest.mark.integration
def test_a_pi_with_the_system_opencv_keeps_it_and_gets_onnxruntime_from_pypi(tmp_path: Path) -> None:
    """A Pi for libcamera/GStreamer sources: the distribution's python3-opencv (stood in for) stays in use;
    onnxruntime, which the platform does not provide, comes from PyPI into the venv. Staged into an empty
    folder (no user database there: the installer says so instead of failing in groupadd)."""
    system = stand_in_system(tmp_path / "system", "cv2", "numpy")
    root_factory = tmp_path / "empty"
    root_factory.mkdir()
    res = run("--prefix", str(root_factory), "--platform", "pi", "--no-enable", system=system)
    assert res.returncode == 0, res.stderr
    assert "platform: pi" in res.stdout
    assert f"no user database in {root_factory}/etc (an empty staging root)" in res.stdout
    assert "useradd --system --gid edged --home-dir /var/lib/edged" in res.stdout
    assert (root_factory / "etc/edged/edged.yaml").is_file()
    assert "cv2 is provided by the platform" in res.stderr
    assert "include-system-site-packages = true" in (root_factory / "opt/edged/venv/pyvenv.cfg").read_text()
    site = next((root_factory / "opt/edged/venv/lib").glob("python3*/site-packages"))
    names = [p.name.lower() for p in site.iterdir()]
    assert any(n.startswith("onnxruntime") for n in names)
    assert not [n for n in names if n.startswith(("cv2", "opencv", "numpy"))]
    assert not (root_factory / "etc/systemd/system/multi-user.target.wants/edged.service").exists()  # --no-enable
    assert "--no-enable: the unit stays disabled" in res.stdout
