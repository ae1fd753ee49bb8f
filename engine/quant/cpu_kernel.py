"""specchat's own CPU int4 matmul (``csrc/int4_avx2.c``), built with the machine's C compiler.

torch's CPU int4 kernel (``_weight_int4pack_mm_for_cpu``) widens every weight to bf16 and
multiplies in floating point: on a 2-core machine it is compute-bound, at about half the
speed at which the same bytes can be read. This kernel does what llama.cpp does for its
4-bit blocks: it quantizes each group of 32 activations to int8 (``x ≈ dx · xq``) and sums
``q · xq`` with integer dot products (four groups' integer sums joined pairwise, then one
float multiply-add with their four scales)::

    y[m, n] = Σ_g  s[n,g]·dx[m,g]·Σ_i q[n,g,i]·xq[m,g,i]  +  (z[n,g] − 8·s[n,g])·dx[m,g]·Σ_i xq[m,g,i]

for weights ``w = (q − 8)·s + z`` with the scale ``s`` and zero ``z`` rounded to bf16, as torch's
kernel rounds them (:mod:`engine.quant.int4`): the weights are exactly those torch's kernel uses,
and only the activations' rounding to 8 bits differs. A GGUF's Q4_K rows keep their super-blocks'
16-byte headers instead (fp16 ``d``, ``dmin`` and 6-bit sub-scales and mins per 32: :func:`pack`'s
``headers``), from which the kernel computes ``s = d·sc`` and ``z − 8s = −dmin·m`` exactly: the file's
own weights from 4.5 bits a weight, not 5. Two more kinds share the driver: 8-bit weights
(two int4 planes joined, :func:`pack8`) and a GGUF's Q6_K as 6-bit codes (:func:`pack6`, its
int8 sub-scales and fp16 ``d`` kept likewise: 6.56 bits a weight, not 7). Each output
is computed by one thread with the same instructions whatever the number of tokens (one token
takes four weight rows at a time; several take one row at a time, its codes unpacked once for up
to four tokens), so verify passes stay row-exact (greedy speculation stays token-identical to
plain decoding).

It is built once per source version into ``cache_dir()/kernels`` (about a second with gcc)
the first time an int4 model loads on a CPU with AVX2 and FMA. Without a C compiler, on
another CPU, or with ``SPECCHAT_CPU_KERNEL=torch`` in the environment, torch's kernel is used
instead, with a note in the log; the output is then that kernel's (see docs/performance.md).
The library links the OpenMP runtime torch has already loaded, so both share one thread pool.

The same C is built in one of three variants (:data:`VARIANTS`), chosen by the CPU's flags in
``/proc/cpuinfo``: ``avx512-vnni`` (AVX-512 F/BW/VL and VNNI: the integer dots are ``vpdpbusd``),
``avx-vnni`` (the same instructions VEX-encoded, on AVX2 chips that have them) and ``avx2`` (the
fallback and the reference). The VNNI variants store the codes of each whole 128 weights of a
row's 256-weight blocks in :func:`vnni_order` (the int4 cache keeps one file per order); their
int32 sums and the float work after them are the AVX2 variant's, so every output has the same
bits on every variant. ``SPECCHAT_CPU_KERNEL=avx2`` (or ``avx512-vnni``, ``avx-vnni``) forces one
(a forced variant the CPU lacks is refused, and torch's kernel runs).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import mmap
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.paths import cache_dir
# the variants' choice lives in cpu_isa; ENV, VARIANTS, FEATURES, cpu_features and vnni_order are offered here too
from engine.quant.cpu_isa import ENV, FEATURES, VARIANTS, choose as _choose, cpu_features, has as _has  # noqa: F401
from engine.quant.cpu_isa import requested as _requested, vnni_order

log = logging.getLogger(__name__)

SOURCES = tuple(Path(__file__).with_name("csrc") / name for name in ("int4_avx2.c", "attention_avx2.c", "layer.c"))
HEADERS = (Path(__file__).with_name("csrc") / "simd_math.h",)
FLAGS = ("-O3", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC")
"""-ffp-contract=off: every expression rounds as written (the attention step's rope is then
torch's bit for bit); the kernels ask for their fused multiply-adds by name. Each variant adds
its instruction sets (:data:`VARIANTS`)."""
GROUP = 32  # the kernel's group size
K_MULTIPLE = 64  # inputs per row must fill whole pairs of groups (32 bytes of codes)

Matmul = Callable[..., int]  # ctypes entry point over raw pointers (see matmul)


def variant() -> str | None:
    """The variant this process runs (:data:`VARIANTS`): the one :func:`library` loaded (building it on
    first use), so that :func:`pack`'s order always matches it; None when the kernel cannot run."""
    if why_not() is not None:
        return None
    lib = library()
    return None if lib is None else str(lib.specchat_kernel_variant().decode())


def why_not(name: str | None = None) -> str | None:
    """Why this kernel (``name``: that variant of it) cannot be used on this machine (None when it can)."""
    asked = _requested()
    if asked == "torch":
        return f"{ENV}=torch is set"
    if asked and asked not in VARIANTS:
        return f"{ENV}={asked} is not one of torch, auto, {', '.join(VARIANTS)}"
    capability = torch.backends.cpu.get_cpu_capability()
    if not capability.startswith(("AVX2", "AVX512")):  # AVX512 variants include AVX2 and FMA
        return f"the CPU offers {capability}, and the kernel needs AVX2 and FMA"
    name = name or _choose()
    if not _has(name):
        return f"the {name} variant needs the CPU flags {' '.join(VARIANTS[name][1])}, and this CPU lacks some"
    if _compiler() is None and not _library_path(name).exists():
        return "no C compiler was found (set CC, or install gcc)"
    return None


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")


def _library_path(name: str = "avx2") -> Path:
    flags = (*FLAGS, *VARIANTS[name][0])
    key = hashlib.sha256(b"".join(s.read_bytes() for s in (*SOURCES, *HEADERS)) + " ".join(flags).encode()).hexdigest()[:16]
    return cache_dir() / "kernels" / f"specchat_{name}-{key}.so"


def _build(path: Path, name: str = "avx2") -> None:
    """Compile the kernel's variant ``name`` to ``path`` (written under a temporary name, renamed into place)."""
    compiler = _compiler()
    if compiler is None:
        raise OSError("no C compiler")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        subprocess.run([compiler, *FLAGS, *VARIANTS[name][0], *map(str, SOURCES), "-o", str(tmp), "-lm"], check=True,
                       capture_output=True, text=True, timeout=120)
        os.replace(tmp, path)
    except subprocess.CalledProcessError as exc:
        raise OSError(f"{compiler} failed: {exc.stderr.strip()[-500:]}") from exc
    finally:
        tmp.unlink(missing_ok=True)


@functools.cache
def library(name: str | None = None) -> ctypes.CDLL | None:
    """The kernels' library (``name``: that variant, else :func:`variant`'s), built and loaded on first
    use; None (logged once) when this machine cannot have it, so callers fall back to torch's ops."""
    problem = why_not(name)
    if problem is None:
        chosen = name or _choose()
        try:
            return _load(chosen)
        except OSError as exc:
            problem = f"it could not be built or loaded ({exc})"
        if name is None and not _requested() and chosen != "avx2":  # chosen by the flags: the reference instead
            log.info("specchat's %s kernel %s; trying its avx2 variant", chosen, problem)
            try:
                return _load("avx2")
            except OSError as exc:
                problem = f"it could not be built or loaded ({exc})"
    log.info("int4 on the CPU runs torch's kernel: specchat's own cannot run here: %s", problem)
    return None


def _load(name: str) -> ctypes.CDLL:
    """Variant ``name``'s library, built first where the cache lacks it; OSError when it cannot be had."""
    path = _library_path(name)
    if not path.exists():
        _build(path, name)
    lib = ctypes.CDLL(str(path))
    lib.specchat_kernel_variant.restype = ctypes.c_char_p
    built = lib.specchat_kernel_variant().decode()
    if built != name:
        raise OSError(f"the {name} build reports itself as {built} (does the compiler know {VARIANTS[name][0]}?)")
    log.info("int4 on the CPU runs specchat's %s kernel (CPU flags: %s)", name, " ".join(cpu_features()))
    return lib


def is_vnni(name: str | None = None) -> bool:
    """Whether variant ``name`` (else this process's) stores codes in :func:`vnni_order`."""
    name = name or variant()
    return name is not None and name != "avx2"


P, I64, INT, FLOAT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float


def _entry(name: str, variant: str | None, *argtypes: type) -> Matmul | None:
    """The library's (``variant``'s, else this process's) function ``name`` taking ``argtypes`` and
    answering an int (None where :func:`library` is)."""
    lib = library(variant)
    if lib is None:
        return None
    fn = getattr(lib, name)
    fn.argtypes = list(argtypes)
    fn.restype = ctypes.c_int
    return fn  # type: ignore[no-any-return]


@functools.cache
def matmul(variant: str | None = None) -> Matmul | None:
    """The int4 matmul's entry point (None where :func:`library` is).

    Signature: ``(codes, scales, bias | None, N, K, planes, x, M, y, ldy, threads, norm | None, eps,
    accumulate, gated) -> 0`` over raw pointers: ``codes`` uint8 ``[N, planes·K/2]`` (see :func:`pack`),
    ``scales`` bf16 ``[N, planes, 2, K/32]``, ``bias`` fp32 ``[N]``, ``x`` fp32 ``[M, K]``, ``y``
    fp32 ``[M, N]`` with rows ``ldy`` apart, ``norm`` fp32 ``[K]`` (RMS-normalise x's rows first), ``accumulate`` (add
    into y instead of writing it), ``gated`` (x is ``[M, 2K]``, gate and up: the product reads
    ``silu(gate)·up``).
    """
    return _entry("specchat_int4_mm", variant, P, P, P, I64, I64, I64, P, I64, P, I64, INT, P, FLOAT, INT, INT)


@functools.cache
def matmul4k(variant: str | None = None) -> Matmul | None:
    """The matmul's entry point for a GGUF's Q4_K rows (:func:`pack`'s ``headers``; None where :func:`library` is).

    Signature: ``(codes, headers, bias | None, N, K, x, M, y, ldy, threads, norm | None, eps, accumulate,
    gated) -> 0``: ``codes`` as :func:`matmul`'s (one plane), ``headers`` uint8 ``[N, K/256·16]``, the rest as
    :func:`matmul`. ``K % 256 == 0``.
    """
    return _entry("specchat_int4k_mm", variant, P, P, P, I64, I64, P, I64, P, I64, INT, P, FLOAT, INT, INT)


@functools.cache
def matmul6k(variant: str | None = None) -> Matmul | None:
    """The matmul's entry point for a GGUF's Q6_K rows with their headers (:func:`pack6`'s; None where
    :func:`library` is). Signature as :func:`matmul4k`'s: ``codes`` uint8 ``[N, K·3/4]``, ``headers`` uint8
    ``[N, K/256·18]``."""
    return _entry("specchat_int6k_mm", variant, P, P, P, I64, I64, P, I64, P, I64, INT, P, FLOAT, INT, INT)


@functools.cache
def matmul8(variant: str | None = None) -> Matmul | None:
    """The 8-bit matmul's entry point (two planes joined, :func:`pack8`; None where :func:`library` is).

    Signature: ``(codes, table, bias | None, N, K, x, M, y, ldy, threads, norm | None, eps, accumulate,
    gated) -> 0``: ``codes`` int8 ``[N, K]``, ``table`` fp32 ``[N, 2, K/32]``, the rest as :func:`matmul`.
    """
    return _entry("specchat_int8_mm", variant, P, P, P, I64, I64, P, I64, P, I64, INT, P, FLOAT, INT, INT)


@functools.cache
def matmul6(variant: str | None = None) -> Matmul | None:
    """The 6-bit matmul's entry point (a GGUF's Q6_K, :func:`pack6`; None where :func:`library` is).

    Signature: ``(rows, stride, bias | None, N, K, x, M, y, ldy, threads, norm | None, eps, accumulate,
    gated) -> 0``: ``rows`` uint8 ``[N, stride]`` (codes and scales of each row), the rest as :func:`matmul`.
    """
    return _entry("specchat_int6_mm", variant, P, I64, P, I64, I64, P, I64, P, I64, INT, P, FLOAT, INT, INT)


@functools.cache
def attention(variant: str | None = None) -> Matmul | None:
    """The attention step's entry point (``csrc/attention_avx2.c``; None where :func:`library` is).

    Signature: ``(qkv, T, start, cos, sin, kbuf, vbuf, cap, H, KV, d, scale, out, threads,
    attend) -> 0`` over raw pointers: ``qkv`` fp32 ``[T, (H + 2·KV)·d]`` (roped in place),
    ``cos``/``sin`` fp32 ``[T, d]``, ``kbuf``/``vbuf`` fp32 ``[KV, cap, d]`` (positions
    ``start .. start + T - 1`` are written), ``out`` fp32 ``[T, H·d]``; see :func:`engine.model.cpu_attention.attention_step`.
    """
    return _entry("specchat_attention", variant, P, I64, I64, P, P, P, P, I64, I64, I64, I64, FLOAT, P, INT, INT)


@functools.cache
def layer_step(variant: str | None = None) -> Matmul | None:
    """A whole decoder layer's entry point (``csrc/layer.c``; None where :func:`library` is).

    Signature: ``(layer, x, T, start, cos, sin, kbuf, vbuf, cap, qkv, att, gate_up, threads) -> 0``
    over raw pointers; see :func:`engine.model.cpu_layer.run`.
    """
    return _entry("specchat_layer", variant, P, P, I64, I64, P, P, P, P, I64, P, P, P, INT)


HUGE_PAGE = 2 << 20
HUGE_MIN_BYTES = 4 << 20
"""Weights at least this large go on huge pages (:func:`on_huge_pages`); smaller ones would
gain little against what the alignment wastes."""


def on_huge_pages(t: torch.Tensor, copy: bool = False) -> torch.Tensor:
    """``t`` copied into memory the kernel streams from 2 MiB pages, where Linux allows it
    (``copy``: a plain copy where it does not, never ``t`` itself).

    A decode step reads every weight once, front to back: on 4 KiB pages the CPU's prefetchers
    stop at each page boundary and the TLB misses once a page. With transparent huge pages in
    ``madvise`` mode (the common default) torch's allocations stay on small pages, so weights of
    at least :data:`HUGE_MIN_BYTES` get an anonymous mapping advised ``MADV_HUGEPAGE`` (its whole
    2 MiB-aligned interior; the tail stays on small pages). About 6-9% off a large matmul here.
    Elsewhere (no ``MADV_HUGEPAGE``, a CUDA tensor) ``t`` comes back as it is.
    """
    n = t.numel() * t.element_size()
    if n < HUGE_MIN_BYTES or t.device.type != "cpu" or not hasattr(mmap, "MADV_HUGEPAGE"):
        return t.clone() if copy else t
    try:
        region = mmap.mmap(-1, n + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        raw = torch.frombuffer(region, dtype=torch.uint8)  # the tensor keeps the mapping alive
        offset = -raw.data_ptr() % HUGE_PAGE
        region.madvise(mmap.MADV_HUGEPAGE, offset, n - n % HUGE_PAGE)
    except (OSError, ValueError):
        return t.clone() if copy else t
    out = raw[offset : offset + n].view(t.dtype).view(t.shape)
    out.copy_(t)
    return out


LAYOUT_VERSION = 2  # of pack's output; the int4 cache keeps weights in it (a change rebuilds those caches).
# 2: a GGUF's Q4_K and Q6_K rows keep their super-blocks' own scales (4.5 and 6.56 bits a weight, not 5 and 7)


def layout_tag(name: str | None = None) -> str:
    """The layout :func:`pack` makes for variant ``name`` (else this process's), as the int4 cache records
    it: :data:`LAYOUT_VERSION`, and ``-vnni`` for the VNNI variants' order (a cache of one order is not
    read by a process of the other)."""
    return f"{LAYOUT_VERSION}{'-vnni' if is_vnni(name) else ''}"


@dataclass(frozen=True)
class KernelLayout:
    """A weight as this kernel reads it, :func:`pack`'s output: the int4 cache keeps it so a warm start
    hands it to :class:`engine.quant.int4.Int4Linear` and packs nothing (seconds on a 1.5B model).

    ``packed`` and ``table`` as :func:`pack` returns them; ``shape`` the weight's ``(N, K)``;
    ``group_size`` and ``planes`` those of the groups it was packed from.
    """

    packed: torch.Tensor
    table: torch.Tensor
    shape: tuple[int, int]
    group_size: int
    planes: int


SIX_BIT_GROUP = 16
"""The group size of 6-bit weights (a GGUF's Q6_K sub-blocks), carried as two planes."""
SIX_BIT_K_MULTIPLE = 256


def fits(k: int, group_size: int) -> bool:
    """Whether a weight with ``k`` inputs (per plane) in groups of ``group_size`` suits the kernel."""
    if group_size == SIX_BIT_GROUP:
        return k % SIX_BIT_K_MULTIPLE == 0
    return group_size == GROUP and k % K_MULTIPLE == 0


def pack(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, planes: int,
         six: tuple[torch.Tensor, torch.Tensor] | None = None, variant: str | None = None,
         headers: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's layout of int4 groups (those of :class:`engine.quant.int4.Int4Weights`).

    Args:
        codes: uint8 ``[N, planes·K]`` in 0..15, ``w = (q − 8)·scale + zero``.
        scale, zero: ``[N, planes·K/32]``.
        headers: from a GGUF's Q4_K (one plane) or Q6_K (6-bit planes), its super-blocks' own scales
            (:attr:`engine.quant.groups.Int4Weights.headers`), which must give ``scale`` and ``zero``
            (:func:`check_headers`).
    Returns:
        One plane: ``(packed, scales)``: uint8 ``[N, K/2]``, where each 64 weights take 32
        bytes, byte ``j`` holding weight ``j`` in its low nibble and ``j + 32`` in its high one;
        and bf16 ``[N, 1, 2, K/32]``, the scales then the zeros (rounded to bf16 as torch's
        kernel rounds them), or with ``headers`` those headers as they are (the kernel computes
        ``d·sc`` and ``−dmin·m`` from them exactly: 16 bytes a 256 weights, not 32). Two planes (8-bit weights, :func:`engine.quant.int4.two_planes`)
        are joined back into one byte a weight (:func:`pack8`), or, in groups of 16, laid out as 6-bit
        codes (:func:`pack6`; ``six``: their :func:`six_bit_codes`, when the caller has them).
        ``variant``: the kernel variant they are for (else this process's): the VNNI ones take the
        codes in :func:`vnni_order`.
    """
    if planes == 2:
        if scale.shape[1] * SIX_BIT_GROUP == codes.shape[1]:
            return pack6(codes, scale, zero, six, variant=variant, headers=headers)
        return pack8(codes, scale, zero, variant=variant)
    n, width = codes.shape
    if headers is not None:
        check_headers(headers, scale, zero)
    if is_vnni(variant):
        codes = vnni_order(codes)
    pairs = codes.to(torch.uint8).reshape(n, width // 64, 2, 32)
    packed = (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(n, width // 2).contiguous()
    if headers is not None:
        return packed, headers.to(torch.uint8).contiguous()
    return packed, bf16_table(scale, zero, planes)


def bf16_table(scale: torch.Tensor, zero: torch.Tensor, planes: int = 1) -> torch.Tensor:
    """The int4 kernel's bf16 table ``[N, planes, 2, G]`` of groups' scales and zeros (``[N, planes·G]``
    each), rounded to bf16 as torch's kernel rounds them."""
    n = scale.shape[0]
    table = torch.stack([scale.reshape(n, planes, -1), zero.reshape(n, planes, -1)], dim=2)
    return table.to(torch.bfloat16).contiguous()


Q4_K_HEADER = 16
"""Bytes of a Q4_K super-block's header: fp16 ``d`` and ``dmin``, 12 bytes of 6-bit sub-scales and mins."""


def header_scales(headers: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K headers uint8 ``[N, B·16]`` as fp32 ``(d·sc, dmin·m)``, each ``[N, 8B]`` and exact (how the
    kernel reads them, ``csrc/int4_avx2.c``'s ``kq_scales``; a GGUF's own unpacking of the 12 bytes)."""
    n = headers.shape[0]
    h = headers.reshape(n, -1, Q4_K_HEADER).to(torch.int32)
    d = h[..., 0:2].to(torch.uint8).contiguous().view(torch.float16).float()
    dmin = h[..., 2:4].to(torch.uint8).contiguous().view(torch.float16).float()
    q = h[..., 4:16]
    sc = torch.cat([q[..., 0:4] & 63, (q[..., 8:12] & 15) | (q[..., 0:4] >> 6) << 4], dim=-1)
    mn = torch.cat([q[..., 4:8] & 63, (q[..., 8:12] >> 4) | (q[..., 4:8] >> 6) << 4], dim=-1)
    return (d * sc.float()).reshape(n, -1), (dmin * mn.float()).reshape(n, -1)


Q6_K_HEADER = 18
"""Bytes of a Q6_K super-block's scales: 16 int8 sub-scales, then fp16 ``d``."""


def six_header_scales(headers: torch.Tensor) -> torch.Tensor:
    """Q6_K headers uint8 ``[N, B·18]`` as fp32 ``d·sc`` ``[N, 16B]``, exact (how the kernel reads them)."""
    n = headers.shape[0]
    h = headers.reshape(n, -1, Q6_K_HEADER)
    sc = h[..., :16].contiguous().view(torch.int8).float()
    d = h[..., 16:18].contiguous().view(torch.float16).float()
    return (d * sc).reshape(n, -1)


def check_headers(headers: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, planes: int = 1) -> None:
    """That a Q4_K's headers give these groups (``scale == d·sc`` exactly and ``zero − 8·scale == −dmin·m`` up
    to the fp32 rounding of ``zero``), or with ``planes = 2`` a Q6_K's give its 6-bit planes' scales (the low
    plane's, ``d·sc`` exactly); ValueError where they do not (the headers belong to other weights)."""
    n = scale.shape[0]
    if planes == 2:
        low = scale[:, : scale.shape[1] // 2]
        if headers.shape != (n, low.shape[1] // 16 * Q6_K_HEADER) or low.shape[1] % 16:
            raise ValueError(f"Q6_K headers of shape {tuple(headers.shape)} do not fit {n} x {low.shape[1] * 16} weights")
        if not torch.equal(six_header_scales(headers), low.float()):
            raise ValueError("the Q6_K headers do not give these weights' scales")
        return
    if headers.shape != (n, scale.shape[1] * 2) or scale.shape[1] % 8:
        raise ValueError(f"Q4_K headers of shape {tuple(headers.shape)} do not fit {n} x {scale.shape[1] * 32} weights")
    s, m = header_scales(headers)
    offset = zero.float() - 8.0 * scale.float()
    tol = 1e-6 * float(zero.float().abs().max().clamp(min=1e-30))
    if not torch.equal(s, scale.float()) or float((offset + m).abs().max()) > tol:
        raise ValueError("the Q4_K headers do not give these weights' scales and zeros")


def pack8(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
          variant: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Two int4 planes (low ``l``, high ``h``, the high plane's scale 16 times the low one's) as
    8-bit weights, the layout of ``specchat_int8_mm``: int8 codes ``v = 16 h + l − 128``
    ``[N, K]`` and fp32 ``[N, 2, K/32]``: the scale ``s`` (the low plane's, rounded to bf16 as
    the planes' are) then the offset ``c = z_lo + z_hi − 8 s`` (bf16 zeros), so that
    ``w = v·s + c`` is the planes' ``(l − 8)·s + z_lo + (h − 8)·16 s + z_hi``. Half the
    kernel's work of two planes, the same bytes.
    """
    n, width = codes.shape
    k = width // 2
    s_lo, s_hi = (t.to(torch.bfloat16).float() for t in scale.reshape(n, 2, -1).unbind(1))
    if not torch.equal(s_hi, 16.0 * s_lo):
        raise ValueError("the high plane's scales are not 16 times the low plane's")
    z_lo, z_hi = (t.to(torch.bfloat16).float() for t in zero.reshape(n, 2, -1).unbind(1))
    u = codes[:, :k].to(torch.uint8) | (codes[:, k:].to(torch.uint8) << 4)  # 16 h + l, in place of wider ints
    u ^= 0x80  # u - 128, as the int8 the bits then read as (no [N, K] int16 copy of a 150k-row head)
    if is_vnni(variant):
        u = vnni_order(u)
    table = torch.stack([s_lo, z_lo + z_hi - 8.0 * s_lo], dim=1)
    return u.view(torch.int8).contiguous(), table.contiguous()


def six_bit_codes(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Two int4 planes in groups of 16 as 6-bit codes ``q`` uint8 ``[N, K]`` in 0..63 and bf16 scales
    ``s`` ``[N, K/16]`` with ``w = (q − 32)·s`` (a Q6_K's codes and sub-scales as
    :func:`engine.quant.gguf_blocks.decode_q6_k_rows` carries them: ``u = q + 96``, zeros ``8 s`` and 0);
    None when the planes are not of that form."""
    n, width = codes.shape
    k = width // 2
    s_lo, s_hi = (t.to(torch.bfloat16) for t in scale.reshape(n, 2, -1).unbind(1))
    z_lo, z_hi = (t.to(torch.bfloat16) for t in zero.reshape(n, 2, -1).unbind(1))
    if not (torch.equal(s_hi.float(), 16.0 * s_lo.float()) and torch.equal(z_lo.float(), 8.0 * s_lo.float())
            and not bool(z_hi.any())):
        return None
    u = codes[:, :k].to(torch.uint8) | (codes[:, k:].to(torch.uint8) << 4)
    low, high = torch.aminmax(u)
    if int(low) < 96 or int(high) > 159:
        return None
    return u.sub_(96), s_lo


PACK_ROWS = 8192
"""Rows :func:`pack6` lays out at a time."""


def pack6(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
          found: tuple[torch.Tensor, torch.Tensor] | None = None, variant: str | None = None,
          headers: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Two int4 planes in groups of 16 of 6-bit form (:func:`six_bit_codes`) as ``specchat_int6_mm``
    reads them: uint8 ``[N, stride]``, each row its codes (``K·3/4`` bytes: per 128 weights 64 bytes
    of nibbles, weight ``j`` low and ``j + 32`` high, then ``64 + j`` and ``96 + j``, and 32 bytes
    of top bits, byte ``j`` holding those of weights ``j``, ``32 + j``, ``64 + j``, ``96 + j``), then
    its bf16 scales, padded to 32 bytes: one stream a row, 7 bits a weight (Q6_K's 6.56). The
    second tensor is an empty table (the scales are in the rows). ``found``: :func:`six_bit_codes`'s
    answer for these planes, when the caller has it (it decodes every code: seconds for a large head).
    ``headers``: a Q6_K's own 18 bytes a super-block (16 int8 sub-scales, fp16 ``d``; :func:`check_headers`):
    then the rows hold only their codes (``K·3/4`` bytes) and the headers are the table, 6.56 bits a
    weight, and the kernel computes ``d·sc`` exactly instead of reading it rounded to bf16.
    """
    if codes.shape[0] > PACK_ROWS:  # rows are independent: a tall head in pieces (GBs of temporaries at once)
        pieces = [pack6(codes[r:r + PACK_ROWS], scale[r:r + PACK_ROWS], zero[r:r + PACK_ROWS],
                        None if found is None else (found[0][r:r + PACK_ROWS], found[1][r:r + PACK_ROWS]), variant,
                        None if headers is None else headers[r:r + PACK_ROWS])
                  for r in range(0, codes.shape[0], PACK_ROWS)]
        table = torch.cat([t for _, t in pieces]) if headers is not None else torch.empty(codes.shape[0], 0,
                                                                                          dtype=torch.uint8)
        return torch.cat([p for p, _ in pieces]), table
    found = found if found is not None else six_bit_codes(codes, scale, zero)
    if found is None:
        raise ValueError("these planes are not 6-bit weights (w = (q - 32) s, q in 0..63, groups of 16)")
    q, s = found
    n, k = q.shape
    if k % SIX_BIT_K_MULTIPLE:
        raise ValueError(f"6-bit weights need a multiple of {SIX_BIT_K_MULTIPLE} inputs, not {k}")
    if is_vnni(variant):
        q = vnni_order(q)
    chunks = q.reshape(n, k // 128, 4, 32)
    nibbles = torch.stack([chunks[:, :, 0] & 15 | (chunks[:, :, 1] & 15) << 4,
                           chunks[:, :, 2] & 15 | (chunks[:, :, 3] & 15) << 4], dim=2).reshape(n, k // 128, 64)
    top = chunks >> 4
    tops = top[:, :, 0] | top[:, :, 1] << 2 | top[:, :, 2] << 4 | top[:, :, 3] << 6
    if headers is not None:
        check_headers(headers, scale, zero, planes=2)
        return torch.cat([nibbles, tops], dim=2).reshape(n, -1).contiguous(), headers.to(torch.uint8).contiguous()
    row = k // 4 * 3 + k // 8
    stride = -(-row // 32) * 32
    out = torch.zeros(n, stride, dtype=torch.uint8)
    out[:, : k // 4 * 3] = torch.cat([nibbles, tops], dim=2).reshape(n, -1)
    out[:, k // 4 * 3 : row] = s.contiguous().view(torch.uint8)
    return out, torch.empty(n, 0, dtype=torch.uint8)


def unpack_codes(packed: torch.Tensor, k: int | None = None, variant: str | None = None) -> torch.Tensor:
    """The codes uint8 ``[N, planes·K]`` back from :func:`pack`'s ``packed`` (``k``, the inputs,
    for 6-bit rows, whose codes come back as the planes of ``q + 96``; ``variant``: the one it was
    packed for, else this process's)."""
    if is_vnni(variant):  # the VNNI order is its own inverse, plane by plane
        plain = unpack_codes(packed, k, "avx2")
        return torch.cat([vnni_order(p) for p in plain.split(plain.shape[1] // (1 if packed.dtype == torch.uint8
                                                                                   and (k is None or packed.shape[1] == k // 2) else 2), dim=1)], dim=1)
    if packed.dtype == torch.uint8 and k is not None and packed.shape[1] != k // 2:  # 6-bit rows
        n = packed.shape[0]
        body = packed[:, : k // 4 * 3].reshape(n, k // 128, 96)
        nib, tops = body[:, :, :64].reshape(n, k // 128, 2, 32), body[:, :, 64:]
        low = torch.stack([nib[:, :, 0] & 15, nib[:, :, 0] >> 4, nib[:, :, 1] & 15, nib[:, :, 1] >> 4], dim=2)
        top = torch.stack([(tops >> s) & 3 for s in (0, 2, 4, 6)], dim=2)
        u = (low | top << 4).reshape(n, k) + 96
        return torch.cat([u & 15, u >> 4], dim=1)
    if packed.dtype == torch.int8:  # two planes joined
        u = packed.view(torch.uint8) ^ 0x80
        return torch.cat([u & 0x0F, u >> 4], dim=1)
    n, half = packed.shape
    b = packed.reshape(n, half // 32, 1, 32)
    return torch.cat([b & 0x0F, b >> 4], dim=2).reshape(n, 2 * half)

