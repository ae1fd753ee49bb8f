"""Six-bit weights (a GGUF's Q6_K, code for code) on specchat's CPU kernel: the layout keeps every
code and scale, the product is the dequantized weights' within the activations' 8-bit rounding,
every token's outputs are the same bits in a pass of any size, and where the kernel cannot take
them they become 8-bit groups of 32 instead."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from engine.quant import cpu_kernel, cpu_linear, cpu_pack
from engine.quant.gguf_blocks import decode_q6_k_rows
from engine.quant.int4 import Int4Linear, Int4Weights, is_six_bit, kernel_weights, quantize_weight, two_planes

CPU = torch.device("cpu")


def six_bit(n: int, k: int, seed: int) -> Int4Weights:
    """Random Q6_K-shaped weights as :mod:`engine.quant.gguf_blocks` carries them: codes 0..63,
    a signed scale per 16 (bf16-exact, as a cache hands them back, so the reference is exact)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 64, (n, k), generator=gen)
    s = (torch.randn(n, k // 16, generator=gen) * 1e-3).bfloat16().float()
    return two_planes(q + 96, s, 8.0 * s, torch.zeros_like(s), 16)


def _simulated(weights: Int4Weights, x: torch.Tensor) -> torch.Tensor:
    """x @ W.T in float64 with x rounded as the kernel rounds it (int8 per group of 32)."""
    g = x.view(*x.shape[:-1], -1, 32)
    dx = g.abs().amax(-1, keepdim=True) / 127
    xq = (torch.round(g / torch.where(dx > 0, dx, 1)) * dx).view_as(x)
    return xq.double() @ weights.dequantize().double().T


@pytest.fixture(autouse=True)
def _kernel() -> None:
    if cpu_kernel.matmul6() is None:
        pytest.skip(f"specchat's CPU kernel cannot run here: {cpu_kernel.why_not()}")


def test_q6_k_rows_decode_to_ggufs_own_weights() -> None:
    from gguf import GGMLQuantizationType, quants

    from tests.engine.quant.test_gguf_blocks import raw_blocks

    raw = raw_blocks("Q6_K", 8, 512)
    q, s = decode_q6_k_rows(raw)
    assert q.shape == (8, 512) and s.shape == (8, 32) and q.max() <= 63
    want = quants.dequantize(raw, GGMLQuantizationType.Q6_K).reshape(8, 512)
    weights = two_planes(torch.from_numpy(q).int() + 96, torch.from_numpy(s), torch.from_numpy(8 * s),
                         torch.zeros(8, 32), 16)
    assert is_six_bit(weights)
    assert torch.equal(weights.dequantize(), torch.from_numpy(want.astype(np.float32)))


def test_the_rows_keep_every_code_and_scale_in_seven_bits_a_weight() -> None:
    weights = six_bit(12, 512, seed=1)
    packed, table = cpu_pack.pack(weights.codes, weights.scale, weights.zero, 2)
    assert packed.dtype == torch.uint8 and packed.shape == (12, 448) and table.numel() == 0  # 512 * 7 / 8
    assert torch.equal(cpu_pack.unpack_codes(packed, 512), weights.codes)
    scales = packed[:, 384:448].contiguous().view(torch.bfloat16).float()
    assert torch.equal(scales, weights.scale[:, :32])


def test_a_tall_layer_is_laid_out_in_pieces_to_the_same_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    weights = six_bit(40, 256, seed=3)
    whole = cpu_pack.pack(weights.codes, weights.scale, weights.zero, 2)
    monkeypatch.setattr(cpu_pack, "PACK_ROWS", 16)  # 40 rows: pieces of 16, 16 and 8
    pieces = cpu_pack.pack(weights.codes, weights.scale, weights.zero, 2)
    assert torch.equal(pieces[0], whole[0]) and pieces[1].shape == whole[1].shape


def test_planes_of_another_form_are_refused() -> None:
    weights = six_bit(4, 256, seed=2)
    with pytest.raises(ValueError, match="not 6-bit weights"):
        cpu_pack.pack6(weights.codes, weights.scale, weights.zero + 1e-3)
    wide = Int4Weights(weights.codes.clone(), weights.scale, weights.zero, 16, 2)
    wide.codes[0, 256] = 0  # a high nibble of 0: u below 96, more than six bits
    assert cpu_pack.six_bit_codes(wide.codes, wide.scale, wide.zero) is None


@pytest.mark.parametrize("n, k", [(48, 256), (10, 512), (1536, 1536), (16, 8960)])
def test_outputs_are_the_dequantized_product_of_the_rounded_activations(n: int, k: int) -> None:
    """Exact weights; the activations rounded to int8 per 32 as for every other kind; short last
    tiles (10 rows) and rows long enough to go one at a time (8960 inputs) included."""
    weights = six_bit(n, k, seed=n + k)
    bias = torch.randn(n)
    f = cpu_linear.linear(*cpu_pack.pack(weights.codes, weights.scale, weights.zero, 2), bias, k, 2)
    x = torch.randn(5, k)
    want = _simulated(weights, x) + bias.double()
    assert float((f(x).double() - want).abs().max()) <= 1e-5 * float(want.abs().max())


@pytest.mark.parametrize("k, n", [(256, 48), (8960, 48)])
def test_each_token_gets_the_same_bits_in_a_pass_of_any_size_and_any_thread_count(k: int, n: int) -> None:
    weights = six_bit(n, k, seed=7)
    f = Int4Linear.fuse([Int4Linear(weights, torch.randn(n), CPU)])
    x = torch.randn(35, k) * torch.logspace(-3, 2, 35).unsqueeze(1)
    alone = torch.cat([f(x[i : i + 1]) for i in range(35)])
    threads = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            for m in (1, 2, 3, 4, 5, 6, 7, 32, 33, 35):
                assert torch.equal(f(x[:m]), alone[:m]), (count, m)
    finally:
        torch.set_num_threads(threads)


def test_a_folded_norm_a_gate_and_a_residual_are_the_ops_they_replace() -> None:
    weights = six_bit(32, 256, seed=3)
    packed, table = cpu_pack.pack(weights.codes, weights.scale, weights.zero, 2)
    gamma, eps = torch.rand(256) + 0.5, 1e-5
    x = torch.randn(3, 512)
    normed = torch.nn.functional.rms_norm(x[:, :256], (256,), gamma, eps)
    folded = cpu_linear.linear(packed, table, None, 256, 2, norm=(gamma, eps))(x[:, :256])
    want = _simulated(weights, normed)
    assert float((folded.double() - want).abs().max()) <= 1e-3 * float(want.abs().max())
    gated = cpu_linear.linear(packed, table, None, 256, 2, gated=True)(x)
    mixed = torch.nn.functional.silu(x[:, :256]) * x[:, 256:]
    want = _simulated(weights, mixed)
    assert float((gated.double() - want).abs().max()) <= 1e-3 * float(want.abs().max())
    plain = cpu_linear.linear(packed, table, None, 256, 2)
    residual = torch.randn(3, 32)
    expected = residual + plain(x[:, :256])
    assert torch.equal(plain(x[:, :256], residual=residual), expected)


def test_six_and_four_bit_layers_join_only_their_own_kind() -> None:
    six = Int4Linear(six_bit(32, 256, seed=4), None, CPU)
    four = Int4Linear(quantize_weight(torch.randn(32, 256), 32), None, CPU)
    assert "6-bit" in repr(six) and six.kernel == "specchat"
    assert Int4Linear.can_fuse([six, six]) and not Int4Linear.can_fuse([six, four])
    x = torch.randn(2, 256)
    a, b = Int4Linear(six_bit(32, 256, seed=5), None, CPU), Int4Linear(six_bit(16, 256, seed=6), None, CPU)
    apart = torch.cat([a(x), b(x)], dim=-1)
    assert torch.equal(Int4Linear.fuse([a, b])(x), apart)


def test_where_the_kernel_cannot_run_they_become_8_bit_groups_of_32(monkeypatch: pytest.MonkeyPatch) -> None:
    weights = six_bit(32, 256, seed=8)
    monkeypatch.setattr(cpu_kernel, "matmul6", lambda: None)
    placed = kernel_weights(weights, CPU)
    assert placed.group_size == 32 and placed.planes == 2
    err = (placed.dequantize() - weights.dequantize()).abs().view(32, 8, 32).amax(-1)
    assert bool((err <= placed.scale[:, :8] / 2 + placed.zero[:, :8].abs() * 2.0**-9 + 1e-7).all())
    monkeypatch.setattr(cpu_kernel, "matmul", lambda: None)  # torch's kernel, as on a CPU without AVX2
    layer = Int4Linear(weights, None, CPU)
    assert layer.kernel == "torch" and layer.group_size == 32
    x = torch.randn(2, 256)
    want = x @ weights.dequantize().T
    assert float((layer(x) - want).abs().max()) <= 2e-2 * float(want.abs().max())


def test_the_int4_cache_keeps_groups_of_16_beside_groups_of_32(tmp_path: Path) -> None:
    from engine.quant.cache import _load, _save

    groups = {"a": six_bit(16, 256, seed=9), "b": quantize_weight(torch.randn(16, 256), 32)}
    _save(tmp_path / "c.safetensors", groups, ["a"])
    loaded, carried = _load(tmp_path / "c.safetensors")  # type: ignore[misc]
    assert carried == ["a"] and loaded["a"].group_size == 16 and loaded["b"].group_size == 32
    for name, w in groups.items():
        assert torch.equal(loaded[name].dequantize(), w.dequantize())
