"""A card's few-token passes with rope, the cache write and attention in one kernel.

On a card a pocket-sized model's step is bound by its kernels' count, not their work: 400 a
token for pocket's 30 layers at ~3 µs each (docs/gpu.md, 2026-11-27). Over the static cache a
layer of :func:`engine.model.layer_parts.static_layer` spends four or five of its thirteen on
attention's bookkeeping: q's rope, k's rope and the two cache writes, the mask's alignment copy,
SDPA; and each pass gathers rope's rows and builds an additive mask. For a pass of up to
:data:`FUSED_ROWS` new tokens (a step, a verify pass, a draft's catch-up) :func:`card_layer`
does all of that in one Triton kernel (:mod:`engine.model.card_kernel`), which reads rope's
table and the keys' reach from the positions themselves: no mask, no gather, no span.
Longer passes (a prompt's chunks) keep SDPA, whose kernel spreads many rows over the card.

Every pass of a runner that takes it (plain steps and verify passes alike) computes each row
the same way, whatever the pass's width: the same keys, blocks and order of summation.
``SPECCHAT_CARD_ATTENTION=0`` turns it off (SDPA's path for every pass).
"""
from __future__ import annotations

import importlib.util
import os
from typing import Any

import torch

from engine.model.compiled import switched_off
from engine.model.layer_parts import Dims, LayerParts, finish_layer, project, rms_norm

ENV = "SPECCHAT_CARD_ATTENTION"
FUSED_ROWS = 32
"""New tokens a pass at most for the fused kernel (a verify pass of K + 1 ≤ 17 fits)."""
HEAD_DIMS = (16, 32, 64, 128, 256)
"""Head widths the kernel takes (a power of two: one row of a head is one block)."""
BLOCK_N = 64
"""Keys a block of the kernel's loop over the cache."""
BLOCK_T = 16
"""New tokens a block of the kernel's cache writes."""


def why_not_fused(d: Dims, device: torch.device, dtype: torch.dtype) -> str | None:
    """Why a runner on ``device`` with attention of shape ``d`` cannot take :func:`card_layer`
    (None: it can). Off on the CPU (its growing cache and C attention step are faster there)."""
    if switched_off(ENV):
        return f"{ENV}=0"
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":  # the interpreter: the CPU's tests
        return "not a card"
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed"
    if d.head_dim not in HEAD_DIMS or d.n_heads % d.n_kv:
        return f"heads of {d.head_dim} ({d.n_heads} over {d.n_kv} key heads)"
    if dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"a cache of {dtype}"
    try:
        _load()
    except Exception as exc:  # noqa: BLE001 - a Triton that does not import: SDPA, said once
        return f"Triton does not load ({type(exc).__name__}: {str(exc)[:120]})"
    return None


_kernel: Any = None
"""The Triton kernel, imported by :func:`_load` before any trace reads it (``torch.compile`` cannot
trace an import)."""


def _load() -> Any:
    global _kernel
    from engine.model.card_kernel import rope_write_attend

    _kernel = rope_write_attend
    return _kernel


def rope_write_attend(qkv: torch.Tensor, table: torch.Tensor, positions: torch.Tensor, keys: torch.Tensor,
                      values: torch.Tensor, d: Dims) -> torch.Tensor:
    """Rope on the new queries and keys, the keys and values written into the cache, attention.

    Args:
        qkv: ``[1, T, (heads + 2·kv_heads)·d]`` the layer's q/k/v projection (rope not applied).
        table: ``[window, 2, d]`` cos and signed sin of every position (``LeanForward._rope_table``).
        positions: ``[T]`` long, the new tokens' positions; every position below the first is cached.
        keys, values: ``[1, kv_heads, window, d]`` the layer's cache, written at ``positions``.
    Returns:
        ``[1, T, heads·d]`` attention's output, row ``i`` over keys ``0 .. positions[i]``.
    """
    kernel = _kernel if _kernel is not None else _load()  # not `or`: a traced bool() of it is a graph break
    t = qkv.shape[1]
    qkv = qkv.reshape(t, qkv.shape[-1])
    out = qkv.new_empty(t, d.n_heads * d.head_dim)
    block_m = 16 if t == 1 else 64  # rows G·T in blocks of this (a fixed size: one compile serves every T > 1)
    kernel[(d.n_kv,)](qkv, qkv.stride(0), table, table.stride(0), table.stride(1), positions, keys, values,
                      keys.stride(1), keys.stride(2), out, out.stride(0), t, d.scale,
                      H=d.n_heads, HKV=d.n_kv, D=d.head_dim, BLOCK_T=BLOCK_T, BLOCK_M=block_m, BLOCK_N=BLOCK_N,
                      IEEE=keys.dtype == torch.float32, num_warps=4)
    return out.view(1, t, -1)


def card_layer(x: torch.Tensor, h: torch.Tensor, p: LayerParts, d: Dims, keys: torch.Tensor, values: torch.Tensor,
               positions: torch.Tensor, table: torch.Tensor, next_norm: torch.Tensor,
               next_eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer of a pass of at most :data:`FUSED_ROWS` new tokens over the static cache: what
    :func:`engine.model.layer_parts.static_layer` computes, attention by :func:`rope_write_attend`.

    Args:
        x: ``[1, T, hidden]`` the stream; ``h`` the same normalised by this layer's first norm.
        keys, values: the layer's cache ``[1, kv_heads, window, d]``, written at ``positions`` ``[T]``.
        table: ``[window, 2, d]`` rope's cos and signed sin per position.
        next_norm, next_eps: the norm the stream meets next.
    Returns:
        The new stream ``[1, T, hidden]`` and it normalised by ``next_norm``.
    """
    a = rope_write_attend(project(p.qkv, x if p.folded else h), table, positions, keys, values, d)
    x = finish_layer(p, x, a)
    return x, rms_norm(x, next_norm, next_eps)


def card_varying(x: torch.Tensor, h: torch.Tensor, p: LayerParts, d: Dims, keys: torch.Tensor, values: torch.Tensor,
                 positions: torch.Tensor, *rest: object) -> None:
    """For ``torch.compile``: the new tokens' count varies where above one (one compile for the
    one-token step, one for every width from two); nothing else does."""
    import torch._dynamo

    if x.shape[1] > 1:
        for tensor, dim in ((x, 1), (h, 1), (positions, 0)):
            torch._dynamo.maybe_mark_dynamic(tensor, dim)
