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
16-byte headers instead (fp16 ``d``, ``dmin`` and 6-bit sub-scales and mins per 32: :func:`~engine.quant.cpu_pack.pack`'s
``headers``), from which the kernel computes ``s = d·sc`` and ``z − 8s = −dmin·m`` exactly: the file's
own weights from 4.5 bits a weight, not 5. Two more kinds share the driver: 8-bit weights
(two int4 planes joined, :func:`~engine.quant.cpu_pack.pack8`) and a GGUF's Q6_K as 6-bit codes (:func:`~engine.quant.cpu_pack.pack6`, its
int8 sub-scales and fp16 ``d`` kept likewise: 6.56 bits a weight, not 7). Each output
is computed by one thread with the same instructions whatever the number of tokens (one token
takes four weight rows at a time, or one where rows are long; several take one row at a time, two
on AVX-512, its codes unpacked once for up to four tokens), so verify passes stay row-exact (greedy speculation stays token-identical to
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
row's 256-weight blocks in :func:`~engine.quant.cpu_isa.vnni_order` (the int4 cache keeps one file per order); their
int32 sums and the float work after them are the AVX2 variant's, so every output has the same
bits on every variant. ``SPECCHAT_CPU_KERNEL=avx2`` (or ``avx512-vnni``, ``avx-vnni``) forces one
(a forced variant the CPU lacks is refused, and torch's kernel runs).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import torch

from engine.paths import cache_dir
# the variants' choice lives in cpu_isa; ENV, VARIANTS, FEATURES, cpu_features and vnni_order are offered here too
from engine.quant.cpu_isa import ENV, FEATURES, VARIANTS, choose as _choose, cpu_features, has as _has  # noqa: F401
from engine.quant.cpu_isa import requested as _requested, vnni_order  # noqa: F401

log = logging.getLogger(__name__)

SOURCES = tuple(Path(__file__).with_name("csrc") / name for name in ("int4_avx2.c", "attention_avx2.c", "layer.c"))
HEADERS = (Path(__file__).with_name("csrc") / "simd_math.h",)
FLAGS = ("-O3", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC")
"""-ffp-contract=off: every expression rounds as written (the attention step's rope is then
torch's bit for bit); the kernels ask for their fused multiply-adds by name. Each variant adds
its instruction sets (:data:`VARIANTS`)."""

Matmul = Callable[..., int]  # ctypes entry point over raw pointers (see matmul)


def variant() -> str | None:
    """The variant this process runs (:data:`VARIANTS`): the one :func:`library` loaded (building it on
    first use), so that :func:`~engine.quant.cpu_pack.pack`'s order always matches it; None when the kernel cannot run."""
    if why_not() is not None:
        return None
    lib = library()
    return None if lib is None else str(lib.specchat_kernel_variant().decode())


def why_not(name: str | None = None) -> str | None:
    """Why this kernel (``name``: that variant of it) cannot be used on this machine (None when it can)."""
    asked = _requested()
    if asked == "torch":
        return f"{ENV}=torch is set"
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
        _write_synced(_stamp_path(path), _digest(tmp).encode())
        with open(tmp, "rb") as built:
            os.fsync(built.fileno())  # on the disk before its name is: a crash leaves no library cut short
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


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _write_synced(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _intact(path: Path) -> bool:
    """Whether the library at ``path`` is the one its build wrote (its sha256, kept beside it). A
    library cut short (a crash as it was written) is mapped past its end when loaded: the process
    died of SIGBUS, every command, with no word."""
    try:
        return _stamp_path(path).read_text().strip() == _digest(path)
    except OSError:
        return False


def _load(name: str) -> ctypes.CDLL:
    """Variant ``name``'s library, built first where the cache lacks it (or holds one that is not
    what its build wrote); OSError when it cannot be had."""
    path = _library_path(name)
    if path.exists() and not _intact(path) and (_stamp_path(path).exists() or _compiler() is not None):
        # one built before the stamps is kept where nothing could build it again (a review's)
        log.info("specchat's %s kernel in the cache is damaged or unchecked: building it again", name)
        path.unlink(missing_ok=True)
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
    accumulate, gated) -> 0`` over raw pointers: ``codes`` uint8 ``[N, planes·K/2]`` (see :func:`~engine.quant.cpu_pack.pack`),
    ``scales`` bf16 ``[N, planes, 2, K/32]``, ``bias`` fp32 ``[N]``, ``x`` fp32 ``[M, K]``, ``y``
    fp32 ``[M, N]`` with rows ``ldy`` apart, ``norm`` fp32 ``[K]`` (RMS-normalise x's rows first), ``accumulate`` (add
    into y instead of writing it), ``gated`` (x is ``[M, 2K]``, gate and up: the product reads
    ``silu(gate)·up``).
    """
    return _entry("specchat_int4_mm", variant, P, P, P, I64, I64, I64, P, I64, P, I64, INT, P, FLOAT, INT, INT)


@functools.cache
def matmul4k(variant: str | None = None) -> Matmul | None:
    """The matmul's entry point for a GGUF's Q4_K rows (:func:`~engine.quant.cpu_pack.pack`'s ``headers``; None where :func:`library` is).

    Signature: ``(codes, headers, bias | None, N, K, x, M, y, ldy, threads, norm | None, eps, accumulate,
    gated) -> 0``: ``codes`` as :func:`matmul`'s (one plane), ``headers`` uint8 ``[N, K/256·16]``, the rest as
    :func:`matmul`. ``K % 256 == 0``.
    """
    return _entry("specchat_int4k_mm", variant, P, P, P, I64, I64, P, I64, P, I64, INT, P, FLOAT, INT, INT)


@functools.cache
def matmul4kt(variant: str | None = None) -> Matmul | None:
    """The matmul's entry point for Q4_K rows in tiles (:func:`~engine.quant.cpu_pack.tile_rows`; None where
    :func:`library` is). Signature: ``(tiles, bias | None, N, K, x, M, y, ldy, threads, norm | None, eps, accumulate,
    gated) -> 0``: ``tiles`` uint8 ``[N/4, K/256, 4, 144]``, the rest as :func:`matmul`. The outputs are
    :func:`matmul4k`'s over the same rows, bit for bit."""
    return _entry("specchat_int4kt_mm", variant, P, P, I64, I64, P, I64, P, I64, INT, P, FLOAT, INT, INT)


@functools.cache
def matmul6k(variant: str | None = None) -> Matmul | None:
    """The matmul's entry point for a GGUF's Q6_K rows with their headers (:func:`~engine.quant.cpu_pack.pack6`'s; None where
    :func:`library` is). Signature as :func:`matmul4k`'s: ``codes`` uint8 ``[N, K·3/4]``, ``headers`` uint8
    ``[N, K/256·18]``."""
    return _entry("specchat_int6k_mm", variant, P, P, P, I64, I64, P, I64, P, I64, INT, P, FLOAT, INT, INT)


@functools.cache
def matmul8(variant: str | None = None) -> Matmul | None:
    """The 8-bit matmul's entry point (two planes joined, :func:`~engine.quant.cpu_pack.pack8`; None where :func:`library` is).

    Signature: ``(codes, table, bias | None, N, K, x, M, y, ldy, threads, norm | None, eps, accumulate,
    gated) -> 0``: ``codes`` int8 ``[N, K]``, ``table`` fp32 ``[N, 2, K/32]``, the rest as :func:`matmul`.
    """
    return _entry("specchat_int8_mm", variant, P, P, P, I64, I64, P, I64, P, I64, INT, P, FLOAT, INT, INT)


@functools.cache
def matmul6(variant: str | None = None) -> Matmul | None:
    """The 6-bit matmul's entry point (a GGUF's Q6_K, :func:`~engine.quant.cpu_pack.pack6`; None where :func:`library` is).

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
