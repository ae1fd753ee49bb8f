"""specchat's CPU attention step: torch's rope bit for bit (then rounded to the fp16 cache as a copy
rounds it), SDPA's attention over those cached numbers to float rounding, and every row the very
numbers a one-row call gives."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.model import cpu_attention
from engine.model.lean import GrowingKV, _signed_sin
from engine.quant import cpu_kernel, cpu_linear, cpu_pack


@pytest.fixture(autouse=True)
def _needs_the_kernel() -> None:
    if cpu_kernel.attention() is None:
        pytest.skip(f"specchat's CPU kernels cannot run here: {cpu_kernel.why_not()}")


def _tables(start: int, t: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary cos/sin ``[1, T, d]`` for positions ``start ..`` (Llama's layout: two equal halves)."""
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    angles = torch.arange(start, start + t, dtype=torch.float32)[:, None] * inv[None]
    emb = torch.cat([angles, angles], dim=-1)[None]
    return emb.cos(), emb.sin()


def _torch_step(qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, start: int, cos: torch.Tensor,
                sin: torch.Tensor, h: int, kv: int, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The lean forward's torch ops: rope as a roll with a signed sine, one-row SDPA per row over the
    keys and values as an fp16 cache holds them."""
    t, d = qkv.shape[1], k_cache.shape[-1]
    qk = qkv[..., : (h + kv) * d].view(1, t, h + kv, d).transpose(1, 2)
    qk = qk * cos.unsqueeze(1) + qk.roll(d // 2, dims=-1) * _signed_sin(sin.unsqueeze(1))
    q, k = qk.split((h, kv), dim=1)
    v = qkv[..., (h + kv) * d :].view(1, t, kv, d).transpose(1, 2)
    keys, values = (torch.cat([k_cache, k], dim=2).half().float(), torch.cat([v_cache, v], dim=2).half().float())
    rows = [F.scaled_dot_product_attention(q[:, :, i : i + 1], keys[:, :, : start + i + 1],
                                           values[:, :, : start + i + 1], scale=scale, enable_gqa=h != kv)
            for i in range(t)]
    return torch.cat(rows, dim=2).transpose(1, 2).reshape(1, t, h * d), k, v


def _setup(h: int, kv: int, d: int, start: int, t: int, seed: int) -> tuple[torch.Tensor, GrowingKV.Layer]:
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(1, t, (h + 2 * kv) * d, generator=gen)
    layer = GrowingKV.Layer()
    if start:
        layer.reserve(start, torch.empty(1, kv, 0, d, dtype=cpu_attention.KV_DTYPE))  # the step's cache
        layer.append(torch.randn(1, kv, start, d, generator=gen), torch.randn(1, kv, start, d, generator=gen))
    return qkv, layer


@pytest.mark.parametrize("h, kv, d", [(4, 2, 16), (9, 3, 64), (12, 2, 128), (2, 2, 24), (14, 2, 64), (18, 1, 32)])
@pytest.mark.parametrize("start, t", [(0, 1), (7, 1), (37, 5), (300, 3)])
def test_the_step_is_torchs_rope_and_cache_write_and_sdpas_attention(h: int, kv: int, d: int, start: int,
                                                                     t: int) -> None:
    qkv, layer = _setup(h, kv, d, start, t, seed=start + t + d)
    cos, sin = _tables(start, t, d)
    scale = d**-0.5
    empty = torch.zeros(1, kv, 0, d)
    k_cache, v_cache = (layer.keys.float(), layer.v[:, :, :start].float()) if start else (empty, empty)
    want, k, v = _torch_step(qkv.clone(), k_cache, v_cache, start, cos, sin, h, kv, scale)
    keys, values = layer.reserve(t, torch.empty(1, kv, 0, d, dtype=cpu_attention.KV_DTYPE))
    got = cpu_attention.attention_step(qkv, keys, values, start, cos, sin, h, kv, scale)
    layer.advance(t)
    assert torch.equal(layer.keys[:, :, start:], k.half())  # rope rounds as torch's does, then as a copy to fp16
    assert torch.equal(layer.v[:, :, start : start + t], v.half())
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("threads", [1, 2])
def test_each_row_of_a_pass_is_a_one_row_steps_numbers_on_any_thread_count(threads: int) -> None:
    """Greedy speculation stays token-identical to plain decoding only if a verify pass
    computes each row bit for bit as a one-token step at that position does."""
    h, kv, d, start, t = 9, 3, 64, 211, 6
    qkv, layer = _setup(h, kv, d, start, t, seed=3)
    cos, sin = _tables(start, t, d)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        keys, values = layer.reserve(t, torch.empty(1, kv, 0, d, dtype=cpu_attention.KV_DTYPE))
        batch = cpu_attention.attention_step(qkv.clone(), keys, values, start, cos, sin, h, kv, 0.125)
        torch.set_num_threads(1)
        rows = []
        for i in range(t):
            keys, values = layer.reserve(1, torch.empty(1, kv, 0, d, dtype=cpu_attention.KV_DTYPE))
            rows.append(cpu_attention.attention_step(qkv[:, i : i + 1].clone(), keys, values, start + i,
                                                     cos[:, i : i + 1], sin[:, i : i + 1], h, kv, 0.125))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(batch, torch.cat(rows, dim=1))


@pytest.mark.parametrize("h, kv, d", [(9, 3, 64), (14, 2, 64), (18, 1, 32), (6, 1, 40)])
def test_a_row_has_the_same_bits_whichever_heads_share_its_job(h: int, kv: int, d: int) -> None:
    """A job attends with several query heads of one KV group side by side (a part of the group,
    more parts where rows are few and threads many): each head's numbers must not depend on
    which heads share its job."""
    start = 97
    qkv, layer = _setup(h, kv, d, start, 1, seed=h)
    cos, sin = _tables(start, 1, d)
    before = torch.get_num_threads()
    outs = []
    try:
        for threads in (1, 2, 3, 8):  # 1 to 18 jobs for the one row: parts of 1 to all of a group's heads
            torch.set_num_threads(threads)
            keys, values = layer.reserve(1, torch.empty(1, kv, 0, d, dtype=cpu_attention.KV_DTYPE))
            outs.append(cpu_attention.attention_step(qkv.clone(), keys, values, start, cos, sin, h, kv, 0.1))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(outs[0], o) for o in outs[1:])


def test_shapes_it_does_not_take_stay_on_torchs_ops() -> None:
    assert cpu_attention.available(9, 3, 64) and cpu_attention.available(12, 2, 128)
    assert not cpu_attention.available(9, 3, 60)  # head size not a multiple of 8
    assert not cpu_attention.available(9, 2, 64)  # heads not in equal groups
    assert not cpu_attention.available(4, 4, 512)  # past the kernel's largest head


def test_silu_times_up_is_computed_where_the_down_projection_quantizes_its_input() -> None:
    """``gated``: the down projection takes gate and up side by side and multiplies
    ``silu(gate)·up`` itself, within float rounding of torch's ops (then the same 8-bit bound)."""
    from engine.quant.int4 import quantize_weight

    gen = torch.Generator().manual_seed(8)
    weights = quantize_weight(torch.randn(48, 128, generator=gen), 32)
    packed, table = cpu_pack.pack(weights.codes, weights.scale, weights.zero, 1)
    gate_up = torch.randn(3, 256, generator=gen) * 4
    gated = cpu_linear.linear(packed, table, None, 128, 1, gated=True)(gate_up)
    plain = cpu_linear.linear(packed, table, None, 128, 1)(F.silu(gate_up[:, :128]) * gate_up[:, 128:])
    assert torch.allclose(gated, plain, rtol=1e-3, atol=1e-3 * float(plain.abs().max()))
    with pytest.raises(ValueError, match="no folded norm"):
        cpu_linear.linear(packed, table, None, 128, 1, norm=(torch.ones(128), 1e-5), gated=True)
