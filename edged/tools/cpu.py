"""What this machine's CPU offers int8: its name and its int8 dot-product instructions (VNNI on x86, the
dot-product extension on ARM), which decide whether ONNX Runtime's int8 kernels beat fp32 by much."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
DOT_PRODUCT_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8", "asimddp"})
NAME_KEYS = ("model name", "hardware", "cpu model")  # x86; older ARM kernels; MIPS and others


@dataclass(frozen=True)
class Cpu:
    """The CPU as /proc/cpuinfo describes it (empty when it cannot be read)."""

    name: str
    flags: frozenset[str]

    @classmethod
    def read(cls, cpuinfo: Path = CPUINFO) -> Cpu:
        try:
            text = cpuinfo.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return cls("unknown CPU", frozenset())
        name, flags = "unknown CPU", frozenset[str]()
        for line in text.splitlines():
            key, _, value = line.partition(":")
            key = key.strip().lower()
            if key in NAME_KEYS and name == "unknown CPU":
                name = value.strip()
            elif key in {"flags", "features"} and not flags:  # x86 says flags, ARM says Features
                flags = frozenset(value.split())
        return cls(name, flags)

    @property
    def dot_product(self) -> list[str]:
        """The int8 dot-product instructions it has (sorted; [] for none)."""
        return sorted(self.flags & DOT_PRODUCT_FLAGS)

    @property
    def x86_without_vnni(self) -> bool:
        """An x86 CPU with AVX2 and no VNNI: there ONNX Runtime's int8 kernels add pairs of u8 x s8 products in
        16 bits, which saturates with full 8-bit weights (ONNX Runtime's quantization docs advise
        `reduce_range` for such machines). False on ARM and on VNNI CPUs, or when unknown."""
        return "avx2" in self.flags and not self.dot_product

    def describe(self) -> str:
        dot = ", ".join(self.dot_product) or "none"
        return f"{self.name}, {os.cpu_count()} CPUs, int8 dot-product instructions: {dot}"

    def as_json(self) -> dict[str, object]:
        return {"name": self.name, "cpus": os.cpu_count(), "int8_dot_product": self.dot_product}

    def slower_hint(self) -> str:
        """Why int8 may not pay off here, for a refusal ('' when the CPU has what int8 needs or is unknown)."""
        if self.dot_product or not self.flags:
            return ""
        return (
            f". This CPU ({self.name}) has no int8 dot-product instructions (VNNI on x86, the dot-product extension "
            "on ARM), where ONNX Runtime's int8 kernels gain little over fp32; on a device with them (a Raspberry "
            "Pi 5, a Jetson Orin, an x86 with VNNI) run quantize there, where the search times int8 against fp32 "
            "again"
        )
