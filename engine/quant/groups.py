"""int4 groups: how a weight is stored for torch's int4 kernels and specchat's CPU kernel.

Weights are stored as 4-bit codes in groups of ``g`` consecutive input features, each group
with its own scale and zero point::

    w[n, k] = (q[n, k] - 8) * scale[n, k // g] + zero[n, k // g],   q in 0..15

Groups come from :func:`quantize_weight` (asymmetric min/max per group, from full-precision
weights) or GGUF blocks carried over code for code (:mod:`engine.quant.gguf_blocks`). This module
holds the groups (:class:`Int4Weights`), the quantizers, and the shape rules of the kernels that
read them (:func:`check_shape`, :func:`cuda_int4_problem`); :mod:`engine.quant.int4` holds the
layer that runs them.

**Two planes: 8 bits through the same kernel.** Weights stored with more than
4 bits (a GGUF's Q5_0, Q8_0 or Q6_K blocks) are split into two int4 planes over
the same groups, a low nibble ``l`` and a high nibble ``h`` of an 8-bit code
``u = 16 h + l``::

    w = (l - 8) * s + z_lo  +  (h - 8) * 16 s + z_hi

The planes sit side by side along the input dimension (codes ``[N, 2K]``) and
the input is repeated (``[x, x]``, ``[M, 2K]``), so one kernel call sums both:
twice the bytes of int4 (about what llama.cpp reads for Q8_0), at the int4
kernel's speed and with its batch invariance. On specchat's CPU kernel the two planes are
joined back into one int8 code a weight (:func:`engine.quant.cpu_pack.pack8`).

**Six bits.** A GGUF's Q6_K (``w = d·sc_j·(q − 32)``, ``q`` in 0..63, a scale per 16 weights)
is carried code for code as two planes in groups of 16: ``u = q + 96``, scale ``s = d·sc_j``,
zeros ``8 s`` and 0 (both exact in bf16 with ``s``), so ``w = (u − 128)·s``. specchat's CPU
kernel reads them as 6-bit codes with a bf16 scale per 16 (7 bits a weight, against 10 for
the int8 form); torch's kernels take no groups of 16, so there they are requantized to 8 bits
in groups of 32 (:func:`kernel_weights`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

import engine.quant.cpu_kernel as cpu_kernel
import engine.quant.cpu_pack as cpu_pack
from engine.errors import QuantizationError
from engine.quant.cpu_pack import KernelLayout

GROUP_SIZES: tuple[int, ...] = (32, 64, 128)
CUDA_INNER_K_TILES = (8, 4, 2)
"""The tile widths torch's CUDA int4 pack takes, widest first: a weight of ``K`` inputs packs with the
first ``t`` that divides ``K / 16`` (8 where it can; SmolLM2's 576 inputs take 4)."""


@dataclass(frozen=True)
class Int4Weights:
    """A weight matrix ``[N, K]`` as int4 groups (see the module docstring).

    ``codes``: uint8 ``[N, K]`` in 0..15; ``scale`` and ``zero``: float32
    ``[N, K / group_size]``.

    With ``planes = 2`` codes are ``[N, 2K]`` and scale and zero ``[N, 2K / group_size]``:
    the low plane first, then the high one (see the module docstring).

    ``headers``: for one plane carried from a GGUF's Q4_K, its super-blocks' 16-byte headers
    uint8 ``[N, K / 256 · 16]`` (fp16 ``d``, ``dmin``, the packed 6-bit sub-scales and mins), from
    which ``scale = d·sc`` and ``zero = 8·d·sc − dmin·m`` came; for a Q6_K's 6-bit planes, its 18
    bytes a super-block ``[N, K / 256 · 18]`` (16 int8 sub-scales, fp16 ``d``: ``scale = d·sc``).
    specchat's CPU kernel keeps them in place of bf16 scales (:func:`engine.quant.cpu_pack.pack`).
    None otherwise.
    """

    codes: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor
    group_size: int
    planes: int = 1
    headers: torch.Tensor | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.codes.shape[0]), int(self.codes.shape[1]) // self.planes

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weights ``[N, K]`` these groups stand for, in ``dtype`` (exact arithmetic in fp32)."""
        n, k = self.shape
        g = self.group_size
        q = self.codes.to(torch.float32).view(n, self.planes * k // g, g) - 8.0
        w = (q * self.scale.to(torch.float32).unsqueeze(-1) + self.zero.to(torch.float32).unsqueeze(-1)).view(n, -1)
        return sum(w[:, p * k : (p + 1) * k] for p in range(self.planes)).to(dtype)  # type: ignore[return-value]


def cuda_int4_problem(device: torch.device) -> str | None:
    """Why torch's CUDA int4 kernels cannot run on ``device``, or None when they can (and on
    the CPU). They are built for compute capability 8.0 and newer with CUDA 12 or newer;
    on a Turing or Volta card ``_convert_weight_to_int4pack`` returns garbage silently."""
    if device.type != "cuda":
        return None
    major, minor = (int(x) for x in torch.cuda.get_device_capability(device))
    if (major, minor) < (8, 0):
        return (f"torch's int4 kernels need a CUDA card of compute capability 8.0 or newer (Ampere), "
                f"and this one is {major}.{minor}")
    cuda = getattr(torch.version, "cuda", None)
    if cuda is not None and int(str(cuda).split(".")[0]) < 12:
        return f"torch's CUDA int4 kernels need a torch built for CUDA 12 or newer, and this one is built for CUDA {cuda}"
    return None


def takes(weights: Int4Weights | KernelLayout, group_size: int) -> bool:
    """Whether groups carried over (or cached) suit a model quantized in groups of ``group_size``:
    the same size, or a Q6_K's 6-bit groups of 16 (:func:`kernel_weights` places them)."""
    return weights.group_size == group_size or is_six_bit(weights)


def is_six_bit(weights: Int4Weights | KernelLayout) -> bool:
    """Whether ``weights`` are a Q6_K's 6-bit groups (two planes in groups of 16; module docstring)."""
    return weights.planes == 2 and weights.group_size == cpu_pack.SIX_BIT_GROUP


SixBit = tuple[torch.Tensor, torch.Tensor]  # a Q6_K's codes q [N, K] and scales s [N, K/16] (cpu_pack.six_bit_codes)


def six_bit_form(weights: Int4Weights, device: torch.device) -> SixBit | None:
    """The 6-bit codes and scales of ``weights`` when specchat's CPU kernel on ``device`` takes them
    as such (:func:`cpu_pack.six_bit_codes`); None otherwise."""
    if not (is_six_bit(weights) and device.type == "cpu" and cpu_pack.fits(weights.shape[1], weights.group_size)
            and cpu_kernel.matmul6() is not None):
        return None
    return cpu_pack.six_bit_codes(weights.codes, weights.scale, weights.zero)


REQUANTIZE_ROWS = 8192
"""Rows of a Q6_K weight requantized at a time for torch's kernels. coder's head ([151936, 1536]) on
the host: in one piece the peak rose 5.9 GiB, in slices of 8,192 rows 0.8 GiB, the result included
(27-42 s either way on a shared 2-core CPU; on a card Int4Linear computes the slices there)."""


def kernel_weights(weights: Int4Weights, device: torch.device, six: SixBit | None = None,
                   rows: int = REQUANTIZE_ROWS, work: torch.device | None = None) -> Int4Weights:
    """``weights`` as a kernel on ``device`` can take them: 6-bit groups stay as they are for
    specchat's CPU kernel, and become 8 bits in groups of 32 (:func:`quantize_weight8`) anywhere else
    (torch's kernels, CUDA's included, take no groups of 16), ``rows`` rows at a time: each group lies
    in one row, so the pieces are the very codes of the whole. ``work``: where each piece is computed
    (Int4Linear passes the card), its result brought back to where ``weights`` lie; default: there.
    ``six``: their :func:`six_bit_form`, when the caller has it already."""
    if not is_six_bit(weights):
        return weights
    if six is not None or six_bit_form(weights, device) is not None:
        return weights
    n, home = weights.shape[0], weights.codes.device

    def piece(r: int) -> Int4Weights:
        part = Int4Weights(*(t[r:r + rows].to(work or home) for t in (weights.codes, weights.scale, weights.zero)),
                           weights.group_size, weights.planes)
        done = quantize_weight8(part.dequantize(), GROUP_SIZES[0])
        return Int4Weights(*(getattr(done, f).to(home) for f in ("codes", "scale", "zero")), done.group_size, 2)

    parts = [piece(r) for r in range(0, n, rows)]
    if len(parts) == 1:
        return parts[0]
    return Int4Weights(*(torch.cat([getattr(p, f) for p in parts]) for f in ("codes", "scale", "zero")),
                       GROUP_SIZES[0], 2)


def nibble_pairs(codes: torch.Tensor) -> torch.Tensor:
    """Codes ``[N, K]`` (uint8, 0..15) two to a byte ``[N, K / 2]``, the even column in the high
    nibble: the input of torch's CUDA int4 pack (and the int4 cache's form)."""
    return (codes[:, ::2] << 4 | codes[:, 1::2]).contiguous()


def cuda_inner_k_tiles(k: int) -> int | None:
    """The widest tile of :data:`CUDA_INNER_K_TILES` that ``k`` input features fill, None if none does
    (the matmul reads the tile back from the packed tensor's shape)."""
    return next((t for t in CUDA_INNER_K_TILES if k % (t * 16) == 0), None)


def check_shape(n: int, k: int, group_size: int, device: torch.device, planes: int = 1) -> None:
    """Raise :class:`QuantizationError` when the kernel on ``device`` refuses an ``[n, k]`` weight
    (stored as ``planes`` int4 planes, so the kernel sees ``[n, planes * k]``). Six-bit groups of
    16 are checked as the groups of 32 they become where they cannot stay (:func:`kernel_weights`)."""
    if planes == 2 and group_size == cpu_pack.SIX_BIT_GROUP:
        group_size = GROUP_SIZES[0]
    k *= planes
    if group_size not in GROUP_SIZES:
        raise QuantizationError(f"group_size {group_size} is not supported: use one of {', '.join(map(str, GROUP_SIZES))}")
    if k % group_size:
        raise QuantizationError(f"a [{n}, {k}] weight cannot use group_size {group_size}: {k} input features are not a multiple of it")
    if device.type == "cuda":  # any group size above fills the narrowest tile (2 x 16): only N is checked
        if n % 8:
            raise QuantizationError(f"a [{n}, {k}] weight cannot use the CUDA int4 kernel: {n} outputs are not a multiple of 8")
    elif n % 16:
        raise QuantizationError(f"a [{n}, {k}] weight cannot use the CPU int4 kernel: {n} outputs are not a multiple of 16")


def quantize_weight(weight: torch.Tensor, group_size: int = 32) -> Int4Weights:
    """Asymmetric round-to-nearest int4 of ``weight`` ``[N, K]`` in groups of ``group_size``.

    Each group maps its [min, max] onto codes 0..15: ``scale = (max - min) / 15``
    and ``zero = min + 8 * scale``, so code 0 is the minimum and 15 the maximum.
    """
    n, k = weight.shape
    if k % group_size:
        raise QuantizationError(f"a [{n}, {k}] weight cannot use group_size {group_size}: {k} is not a multiple of it")
    w = weight.detach().to(torch.float32).reshape(n, k // group_size, group_size)
    lo = w.amin(dim=-1)
    hi = w.amax(dim=-1)
    scale = ((hi - lo) / 15.0).clamp(min=1e-8)
    # Round scale and zero to bf16 first (the kernel keeps them in bf16), and
    # choose the codes against the rounded values, so rounding is not paid twice.
    scale = scale.to(torch.bfloat16).to(torch.float32)
    zero = (lo + 8.0 * scale).to(torch.bfloat16).to(torch.float32)
    codes = torch.round((w - zero.unsqueeze(-1)) / scale.unsqueeze(-1) + 8.0).clamp(0, 15).to(torch.uint8)
    return Int4Weights(codes.view(n, k), scale, zero, group_size)


def two_planes(u: torch.Tensor, scale: torch.Tensor, zero_lo: torch.Tensor, zero_hi: torch.Tensor,
               group_size: int) -> Int4Weights:
    """8-bit codes as two int4 planes: ``w = (l - 8) s + z_lo + (h - 8) 16 s + z_hi`` with ``u = 16 h + l``.

    Args:
        u: integer codes ``[N, K]`` in 0..255.
        scale, zero_lo, zero_hi: float32 ``[N, K / group_size]``; choose them exact in bf16
            (the kernel rounds to bf16) wherever the source format allows.
    """
    n, k = u.shape
    u = u.to(torch.int32)
    codes = torch.cat([u & 0x0F, u >> 4], dim=1).to(torch.uint8)
    return Int4Weights(codes, torch.cat([scale, 16.0 * scale], dim=1), torch.cat([zero_lo, zero_hi], dim=1),
                       group_size, planes=2)


def quantize_weight8(weight: torch.Tensor, group_size: int = 32) -> Int4Weights:
    """Asymmetric round-to-nearest 8-bit codes of ``weight`` ``[N, K]`` per group, as two int4 planes.

    ``s = (max - min) / 255`` rounded up to bf16 (so 255 steps still span the group); the high
    plane's zero is ``128 s`` (exact in bf16) and the low plane's ``min + 8 s`` (rounded to bf16),
    and the codes are chosen against those rounded values: ``w ≈ s u + z_lo - 8 s``. The error is
    at most half a step, ``s / 2``, plus the bf16 rounding of ``z_lo`` (``|z_lo| / 512``).
    """
    n, k = weight.shape
    if k % group_size:
        raise QuantizationError(f"a [{n}, {k}] weight cannot use group_size {group_size}: {k} is not a multiple of it")
    w = weight.detach().to(torch.float32).reshape(n, k // group_size, group_size)
    lo = w.amin(dim=-1)
    exact = ((w.amax(dim=-1) - lo) / 255.0).clamp(min=1e-10)
    scale = exact.to(torch.bfloat16).to(torch.float32)
    short = scale < exact  # rounded down: one bf16 step up (8 significant bits)
    scale[short] = (scale[short] * (1 + 2.0**-7)).to(torch.bfloat16).to(torch.float32)
    zero_lo = (lo + 8.0 * scale).to(torch.bfloat16).to(torch.float32)
    offset = (zero_lo - 8.0 * scale).unsqueeze(-1)
    u = torch.round((w - offset) / scale.unsqueeze(-1)).clamp(0, 255).view(n, k)
    return two_planes(u, scale, zero_lo, 128.0 * scale, group_size)
