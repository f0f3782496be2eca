"""The CPU description quantize's refusals and the benchmark use: /proc/cpuinfo as x86 and ARM kernels write it."""

from __future__ import annotations

from pathlib import Path

import pytest

from edged.tools.cpu import Cpu

X86 = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse avx2 fma\n\nprocessor\t: 1\n"
ARM = "processor\t: 0\nBogoMIPS\t: 108.00\nFeatures\t: fp asimd evtstrm crc32 asimddp\nCPU part\t: 0xd0b\n"


@pytest.mark.parametrize(
    ("text", "dot", "without_vnni"),
    [
        (X86, [], True),
        (X86.replace("fma", "fma avx512_vnni"), ["avx512_vnni"], False),
        (ARM, ["asimddp"], False),
        (ARM.replace(" asimddp", ""), [], False),  # a Pi 4: no dot product, but 8-bit weights do not saturate
    ],
)
def test_the_int8_dot_product_instructions_are_read_from_cpuinfo(
    tmp_path: Path, text: str, dot: list[str], without_vnni: bool
) -> None:
    (tmp_path / "cpuinfo").write_text(text, encoding="utf-8")
    cpu = Cpu.read(tmp_path / "cpuinfo")
    assert (cpu.dot_product, cpu.x86_without_vnni) == (dot, without_vnni)
    assert ("no int8 dot-product instructions" in cpu.slower_hint()) is (not dot)
    assert f"int8 dot-product instructions: {', '.join(dot) or 'none'}" in cpu.describe()


def test_an_unreadable_cpuinfo_claims_nothing(tmp_path: Path) -> None:
    cpu = Cpu.read(tmp_path / "missing")
    assert (cpu.name, cpu.dot_product, cpu.x86_without_vnni, cpu.slower_hint()) == ("unknown CPU", [], False, "")
