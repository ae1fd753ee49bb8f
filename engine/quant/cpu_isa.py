"""Which instruction sets specchat's CPU kernel (:mod:`engine.quant.cpu_kernel`) can be built for here,
read from the CPU's flags, and the VNNI variants' order of the codes.

``SPECCHAT_CPU_KERNEL`` picks: ``torch`` (torch's kernel), a variant's name (that variant), or
``auto`` / unset (the first of :data:`VARIANTS` the CPU has).
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from engine.environment import CPU_KERNEL as ENV, KERNEL_VARIANTS, cpu_kernel  # noqa: F401 - ENV: cpu_kernel's name for it

if TYPE_CHECKING:
    import torch

VARIANTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # name: (compiler flags, /proc/cpuinfo flags it needs beyond AVX2 and FMA), the preferred first
    "avx512-vnni": (("-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"),
                    ("f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni")),
    "avx-vnni": (("-mavx2", "-mfma", "-mf16c", "-mavxvnni"), ("f16c", "avx_vnni")),
    "avx2": (("-mavx2", "-mfma", "-mf16c"), ("f16c",)),
}
"""F16C (half-precision conversions, which a Q4_K header's d and dmin need) came with AVX2 on every x86 CPU
that has it (Intel Haswell, AMD Piledriver and later), so each variant asks for it."""
FEATURES = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_int8")
"""The CPU flags worth naming beside a figure (:func:`cpu_features`)."""
assert tuple(VARIANTS) == KERNEL_VARIANTS, "engine.environment names the same variants, in the same order"


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's flags as Linux lists them (empty elsewhere: then only AVX2 is assumed, from torch)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_features() -> list[str]:
    """Which of :data:`FEATURES` this CPU reports, for the bench's JSON and the docs' tables."""
    flags = cpu_flags()
    return [f for f in FEATURES if f in flags]


def has(name: str) -> bool:
    """Whether this CPU reports every flag variant ``name`` needs beyond AVX2 and FMA."""
    flags = cpu_flags()
    if not flags:  # no /proc/cpuinfo: torch vouched for AVX2, which brings F16C
        return all(flag == "f16c" for flag in VARIANTS[name][1])
    return all(flag in flags for flag in VARIANTS[name][1])


def requested() -> str:
    """What ``SPECCHAT_CPU_KERNEL`` asks for: "torch", a variant's name or "" (the best the CPU has);
    a value that is none of them is a :class:`~engine.errors.SettingError`."""
    return cpu_kernel()


def choose() -> str:
    """The variant to run: the one asked for, else the first of :data:`VARIANTS` the CPU has (``avx2``
    where it has none: :func:`engine.quant.cpu_kernel.why_not` then says which flags it lacks)."""
    asked = requested()
    return asked if asked in VARIANTS else next((name for name in VARIANTS if has(name)), "avx2")


def vnni_order(codes: torch.Tensor) -> torch.Tensor:
    """``codes`` ``[N, K]`` (one value a weight) in the VNNI variants' order: in each whole 128 of
    the row's 256-weight blocks, the 4-weight unit (group of 32, half, part) moves to (part, half,
    group), so that the AVX2 unpacking of 128 weights gives four vectors whose 32-bit lane ``k`` holds
    part ``p`` of sub-block ``k`` (see ``csrc/int4_avx2.c``). Its own inverse; the tail beyond the
    last whole 256 stays. A new tensor."""
    n, k = codes.shape
    blocks = k // 256 * 256
    out = codes.clone()
    if blocks:
        units = codes[:, :blocks].reshape(n, blocks // 128, 4, 2, 4, 4)  # (chunk, group, half, part, byte)
        out[:, :blocks] = units.permute(0, 1, 4, 3, 2, 5).reshape(n, blocks)
    return out

