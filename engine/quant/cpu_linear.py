"""specchat's CPU kernel as a callable: ``f(x, residual=None, out=None)`` over a packed weight's pointers.

Split from :mod:`engine.quant.cpu_kernel`, which builds and loads the library, picks its variant and
packs weights for it (this module imports it, not the other way round). Each callable also carries
what :mod:`engine.model.cpu_layer` needs to make the same call from C (``spec``, ``norm_spec``).
"""
from __future__ import annotations

from collections.abc import Callable

import torch

import engine.quant.cpu_kernel as cpu_kernel
from engine.quant import cpu_pack


INT4, INT8, INT6, INT4K, INT6K, INT4KT = range(6)
"""The kinds of weights, numbered as csrc/layer.c numbers its products."""
ENTRIES: dict[int, Callable[..., cpu_kernel.Matmul | None]] = {
    INT4: cpu_kernel.matmul, INT8: cpu_kernel.matmul8, INT6: cpu_kernel.matmul6,
    INT4K: cpu_kernel.matmul4k, INT6K: cpu_kernel.matmul6k, INT4KT: cpu_kernel.matmul4kt,
}
"""Each kind's entry point in the kernel library."""


def kind_of(packed: torch.Tensor, scales: torch.Tensor, planes: int) -> int:
    """Which kind of weights :func:`engine.quant.cpu_pack.pack` (or ``pack6``, ``pack8``) laid out: one plane with a
    bf16 table (int4), or with a Q4_K's uint8 headers beside the rows (``INT4K``) or inside tiles of them
    (``INT4KT``, 4-d); two planes as 6-bit codes with their scales in the rows (``INT6``) or a Q6_K's headers
    beside them (``INT6K``), else as 8-bit codes (``INT8``)."""
    if planes == 1:
        if scales.dtype != torch.uint8:
            return INT4
        return INT4KT if packed.dim() == 4 else INT4K
    if planes == 2 and packed.dtype == torch.uint8:
        return INT6K if scales.numel() > 0 else INT6
    return INT8


def linear(packed: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None, k: int, planes: int,
           norm: tuple[torch.Tensor, float] | None = None, gated: bool = False,
           variant: str | None = None) -> Callable[..., torch.Tensor]:
    """``f(x [..., K], residual=None) -> [..., N]`` through the kernel (fp32, or ``x``'s dtype).

    ``packed``/``scales`` as :func:`engine.quant.cpu_pack.pack` makes them (rows may be several layers joined along
    N); ``bias`` ``[N]`` or None; ``norm`` ``(weight [K], eps)``: x's rows are RMS-normalised
    first (a layer's pre-norm folded into its projection). With ``residual`` (fp32
    ``[..., N]``, contiguous) the product is added into it in place and it is returned: a
    residual add without an op of its own, the same sum as ``residual + f(x)``; with ``out`` (fp32
    ``[..., N]``, rows any distance apart, e.g. a column slice of a wider tensor) the product is
    written there. ``gated``: x is
    ``[..., 2K]``, a SwiGLU MLP's gate and up projections side by side, and the product reads
    ``silu(gate)·up`` (computed as each row is quantized: three ops fewer). The kernel must
    be available (:func:`engine.quant.cpu_kernel.matmul`). ``variant``: the kernel variant ``packed`` was laid out for
    (:func:`engine.quant.cpu_pack.pack`'s), else this process's.
    """
    if gated and norm is not None:
        raise ValueError("a gated input takes no folded norm")
    kind = kind_of(packed, scales, planes)
    entry = ENTRIES[kind]
    fn = entry() if variant is None else entry(variant)
    if fn is None:
        raise RuntimeError("specchat's CPU int4 kernel is not available here")
    if planes not in (1, 2):
        raise ValueError(f"the kernel takes one or two planes, not {planes}")
    n = int(packed.shape[0]) * (cpu_pack.TILE_ROWS if kind == INT4KT else 1)
    bias32 = bias.to(torch.float32).contiguous() if bias is not None else None
    norm32 = norm[0].to(torch.float32).contiguous() if norm is not None else None
    eps = float(norm[1]) if norm is not None else 0.0
    codes_ptr, scales_ptr = packed.data_ptr(), scales.data_ptr()
    bias_ptr = bias32.data_ptr() if bias32 is not None else None
    norm_ptr = norm32.data_ptr() if norm32 is not None else None
    threads = torch.get_num_threads
    width = 2 * k if gated else k

    def f(x: torch.Tensor, residual: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        flat = x.reshape(-1, width)
        if flat.dtype != torch.float32 or not flat.is_contiguous():
            flat = flat.to(torch.float32).contiguous()
        m = int(flat.shape[0])
        target = residual if residual is not None else out
        if target is None:
            y = torch.empty((m, n), dtype=torch.float32)
            ldy = n
        else:
            ldy = int(target.stride(-2)) if target.dim() > 1 else n
            if (target.dtype != torch.float32 or target.stride(-1) != 1 or target.shape[-1] != n
                    or target.numel() != m * n or (m > 1 and ldy < n)):
                raise ValueError(f"the residual or output must be a float32 tensor of {m} x {n} with unit column stride")
            y = target
        tail = (flat.data_ptr(), m, y.data_ptr(), ldy, threads(), norm_ptr, eps, residual is not None, gated)
        if kind == INT4KT:  # the headers lie in the tiles
            failed = fn(codes_ptr, bias_ptr, n, k, *tail)
        elif kind == INT4:  # the int4 entry also takes the plane count
            failed = fn(codes_ptr, scales_ptr, bias_ptr, n, k, 1, *tail)
        elif kind == INT6:  # 6-bit rows with their scales in them: the rows' stride instead of a table
            failed = fn(codes_ptr, int(packed.stride(0)), bias_ptr, n, k, *tail)
        else:  # codes and a table: 8-bit, and the Q4_K and Q6_K rows with their headers
            failed = fn(codes_ptr, scales_ptr, bias_ptr, n, k, *tail)
        if failed:
            raise MemoryError(f"specchat's int4 kernel could not get scratch memory for {m} x {k} activations")
        if target is not None:
            return target
        y = y.view(*x.shape[:-1], n)
        return y if x.dtype == torch.float32 else y.to(x.dtype)

    f.keep = (packed, scales, bias32, norm32)  # type: ignore[attr-defined]  # the pointers' owners live as long as f
    # what engine/model/cpu_layer.py hands csrc/layer.c: (kind, codes, table, stride, bias, N, K), and the folded
    # norm's (weight, eps)
    f.spec = (kind, codes_ptr, scales_ptr, int(packed.stride(0)), bias_ptr, n, k)  # type: ignore[attr-defined]
    f.norm_spec = (norm_ptr, eps, gated)  # type: ignore[attr-defined]
    return f
