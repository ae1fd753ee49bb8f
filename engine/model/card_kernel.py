"""The Triton kernel of :mod:`engine.model.card_attention`: rope, the cache write and attention
of a few new tokens in one launch (imported only where Triton is, on a card or under
``TRITON_INTERPRET=1``).

One program per key head ``g`` (grid ``[kv_heads]``), over the ``G = heads / kv_heads`` query
heads that share it:

1. its ``T`` new keys, roped, and values are written into the cache at ``positions``;
2. a barrier, so that every thread of the program reads them back;
3. the ``G·T`` query rows (row ``j·T + i``: query head ``g·G + j`` at token ``i``, roped and
   rounded to the cache's dtype, as SDPA is handed them) attend over keys ``0 .. max(positions)``
   in blocks of ``BLOCK_N``, key ``c`` visible to row ``r`` where ``c <= positions[i]``, with the
   running maximum and sum of flash attention (``m``, ``l``): for each block,
   ``s = q·kᵀ·scale``; ``m' = max(m, max s)``; ``p = exp(s - m')``;
   ``l' = l·exp(m - m') + Σ p``; ``acc' = acc·exp(m - m') + p·v``; the row's output ``acc / l``.

The keys attended are read from positions alone, so a captured replay serves every position
(no span, no mask tensor). Rope: ``x·cos + x[(c + d/2) mod d]·sin`` with ``sin`` signed (its
first half negated), as :func:`engine.model.layer_parts.qkv_rope` computes it.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def rope_write_attend(qkv, qkv_row, rope, rope_row, rope_half, positions, keys, values, kv_head, kv_pos, out,
                      out_row, T, scale,
                      H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr):
    """``qkv`` ``[T, (H + 2·HKV)·D]`` (row stride ``qkv_row``) the layer's projection; ``rope``:
    the whole window's table, position ``p``'s cos at ``p·rope_row + c``, its signed sin
    ``rope_half`` further; ``keys``/``values``: the layer's
    cache, head stride ``kv_head``, position stride ``kv_pos``; ``out`` ``[T, H·D]`` (row stride
    ``out_row``). ``IEEE``: exact float32 dots (a float32 cache), else the cache dtype's."""
    g = tl.program_id(0)
    G: tl.constexpr = H // HKV
    col = tl.arange(0, D)
    turned = (col + D // 2) % D
    head = keys.dtype.element_ty
    # 1. the new keys (roped) and values, at their positions
    for t0 in range(0, T, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        live = (t < T)[:, None]
        at = tl.load(positions + t, mask=t < T, other=0)
        cos = tl.load(rope + at[:, None] * rope_row + col[None, :]).to(tl.float32)
        sin = tl.load(rope + rope_half + at[:, None] * rope_row + col[None, :]).to(tl.float32)
        src = qkv + t[:, None] * qkv_row + (H + g) * D
        k = tl.load(src + col[None, :], mask=live, other=0.0).to(tl.float32)
        k_turned = tl.load(src + turned[None, :], mask=live, other=0.0).to(tl.float32)
        dst = g * kv_head + at[:, None] * kv_pos + col[None, :]
        tl.store(keys + dst, (k * cos + k_turned * sin).to(head), mask=live)
        v = tl.load(src + HKV * D + col[None, :], mask=live, other=0.0)
        tl.store(values + dst, v.to(head), mask=live)
    tl.debug_barrier()
    # 2. the G·T query rows against the keys up to each row's position
    for r0 in range(0, G * T, BLOCK_M):
        r = r0 + tl.arange(0, BLOCK_M)
        live_r = r < G * T
        i = tl.where(live_r, r % T, 0)
        h = g * G + tl.where(live_r, r // T, 0)
        at = tl.load(positions + i)  # a padding row reads token 0's position: finite, never stored
        cos = tl.load(rope + at[:, None] * rope_row + col[None, :]).to(tl.float32)
        sin = tl.load(rope + rope_half + at[:, None] * rope_row + col[None, :]).to(tl.float32)
        src = qkv + i[:, None] * qkv_row + h[:, None] * D
        q = tl.load(src + col[None, :]).to(tl.float32) * cos + tl.load(src + turned[None, :]).to(tl.float32) * sin
        q = q.to(head)
        m = tl.full([BLOCK_M], float("-inf"), tl.float32)
        total = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        end = tl.max(at, 0) + 1
        for n0 in range(0, end, BLOCK_N):
            c = n0 + tl.arange(0, BLOCK_N)
            inside = (c < end)[:, None]
            kv_at = g * kv_head + c[:, None] * kv_pos + col[None, :]
            k = tl.load(keys + kv_at, mask=inside, other=0.0)
            if IEEE:
                s = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
            s = tl.where(c[None, :] <= at[:, None], s * scale, float("-inf")).to(tl.float32)  # a float arg may come as fp64
            m_new = tl.maximum(m, tl.max(s, 1))
            fade = tl.exp(m - m_new)
            p = tl.exp(s - m_new[:, None])
            total = total * fade + tl.sum(p, 1)
            v = tl.load(values + kv_at, mask=inside, other=0.0)
            if IEEE:
                acc = acc * fade[:, None] + tl.dot(p.to(head), v, input_precision="ieee")
            else:
                acc = acc * fade[:, None] + tl.dot(p.to(head), v)
            m = m_new
        o = acc / total[:, None]
        tl.store(out + i[:, None] * out_row + h[:, None] * D + col[None, :], o.to(out.dtype.element_ty),
                 mask=live_r[:, None])
