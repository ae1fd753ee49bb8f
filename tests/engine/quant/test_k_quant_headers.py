"""A GGUF's Q4_K and Q6_K rows on specchat's CPU kernel keep their super-blocks' own scales (Q4_K's 16-byte
headers, Q6_K's 16 int8 sub-scales and fp16 ``d``) in place of bf16 scales and zeros: 4.5 and 6.56 bits a
weight, not 5 and 7. The kernel computes ``d·sc`` (and Q4_K's ``−dmin·m``) from them exactly, so it
multiplies the file's own weights, with the batch invariance every layout has."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from engine.model.lean import lean_forward
from engine.quant import cpu_kernel, cpu_pack
from engine.quant.gguf_blocks import decode_q4_rows, decode_q6_k_rows, q4_k_headers, q6_k_headers
from engine.quant.int4 import Int4Linear, Int4Weights, QuantReport, two_planes
from tests.engine.quant.test_gguf_blocks import raw_blocks, reference

CPU = torch.device("cpu")


def _raw(kind: str, n: int, k: int, seed: int) -> np.ndarray:
    return raw_blocks(kind, n, k, rng=np.random.default_rng(seed))


def _carried(kind: str, raw: np.ndarray) -> Int4Weights:
    """Raw rows as :mod:`engine.quant.gguf_blocks` carries them, headers included."""
    if kind == "Q4_K":
        codes, scale, zero = decode_q4_rows(raw, "Q4_K")
        return Int4Weights(*(torch.from_numpy(a) for a in (codes, scale, zero)), 32,
                           headers=torch.from_numpy(q4_k_headers(raw)))
    q, scale = decode_q6_k_rows(raw)
    s = torch.from_numpy(scale)
    planes = two_planes(torch.from_numpy(q).to(torch.int32) + 96, s, 8.0 * s, torch.zeros_like(s), 16)
    return dataclasses.replace(planes, headers=torch.from_numpy(q6_k_headers(raw)))


def q4_k_weights(n: int, k: int, seed: int) -> Int4Weights:
    """Random valid Q4_K rows ``[n, k]``, carried."""
    return _carried("Q4_K", _raw("Q4_K", n, k, seed))


def q6_k_weights(n: int, k: int, seed: int) -> Int4Weights:
    """Random valid Q6_K rows ``[n, k]``, carried (two 6-bit planes in groups of 16)."""
    return _carried("Q6_K", _raw("Q6_K", n, k, seed))


def _kernel() -> None:
    if cpu_kernel.matmul4k() is None:
        pytest.skip(f"specchat's CPU kernel cannot run here: {cpu_kernel.why_not()}")


def test_the_headers_give_the_carried_scales_exactly_and_the_mins_to_fp32_rounding() -> None:
    weights = q4_k_weights(24, 768, seed=3)
    assert weights.headers is not None and weights.headers.shape == (24, 768 // 256 * 16)
    scale, mins = cpu_pack.header_scales(weights.headers)
    assert torch.equal(scale, weights.scale)
    assert torch.allclose(weights.zero - 8.0 * weights.scale, -mins, rtol=0, atol=1e-6 * float(weights.zero.abs().max()))
    six = q6_k_weights(24, 768, seed=3)
    assert six.headers is not None and six.headers.shape == (24, 768 // 256 * 18)
    assert torch.equal(cpu_pack.six_header_scales(six.headers), six.scale[:, : 768 // 16])


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K"])
def test_headers_of_other_weights_are_refused(kind: str) -> None:
    weights, other = (_carried(kind, _raw(kind, 8, 512, seed)) for seed in (1, 2))
    planes = weights.planes
    pack = cpu_pack.pack6 if planes == 2 else (lambda c, s, z, headers: cpu_pack.pack(c, s, z, 1, headers=headers))
    with pytest.raises(ValueError, match="do not give these weights"):
        pack(weights.codes, weights.scale, weights.zero, headers=other.headers)
    with pytest.raises(ValueError, match="do not fit"):
        pack(weights.codes, weights.scale, weights.zero, headers=other.headers[:, :16])


@pytest.mark.parametrize("kind, n, k", [("Q4_K", 48, 256), ("Q4_K", 32, 1536), ("Q4_K", 16, 8960),
                                        ("Q6_K", 48, 256), ("Q6_K", 32, 1536), ("Q6_K", 16, 8960)])
def test_the_layer_keeps_the_files_bytes_and_multiplies_its_weights(kind: str, n: int, k: int) -> None:
    """Q4_K: 144 bytes a super-block, Q6_K 210, as in the file. Against the GGUF's own dequantization
    (gguf-py), each output is within the bound the activations' int8 rounding allows; and with activations
    that int8 holds exactly (integers, each group's largest 127), the products are the file's to fp32
    rounding, ten times closer than with the bf16-rounded scales of the earlier layout."""
    _kernel()
    raw = _raw(kind, n, k, seed=n)
    weights = _carried(kind, raw)
    layer = Int4Linear(weights, None, CPU)
    table, packed = layer.scales_and_zeros, layer.packed
    assert layer.kernel == "specchat" and table.dtype == torch.uint8
    if kind == "Q4_K" and cpu_pack.in_tiles(n, k):  # in tiles of rows, their headers among their codes
        t = cpu_pack.TILE_ROWS
        assert table.numel() == 0 and packed.shape == (n // t, k // 256, t, 144)
    else:
        assert table.shape == (n, k // 256 * (16 if kind == "Q4_K" else 18))
        assert packed.shape == (n, k // 2 if kind == "Q4_K" else k // 4 * 3)
    report = QuantReport()
    report.add("w", layer)
    assert report.int4_bytes == n * k // 256 * (144 if kind == "Q4_K" else 210)
    x = torch.randn(5, k, generator=torch.Generator().manual_seed(k))
    exact = x @ reference(raw, kind, (n, k)).T
    half_step = x.abs().view(5, k // 32, 32).amax(-1) / 254
    bound = half_step @ weights.dequantize().abs().view(n, k // 32, 32).sum(-1).T * 1.001 + 1e-5
    err = (layer(x) - exact).abs()
    assert bool((err <= bound).all()), float((err / bound).max())
    rounded = Int4Linear(dataclasses.replace(weights, headers=None), None, CPU)
    assert rounded.scales_and_zeros.dtype == torch.bfloat16 or rounded.scales_and_zeros.numel() == 0
    ints = torch.randint(-126, 127, (5, k), generator=torch.Generator().manual_seed(1)).float()
    ints[:, ::32] = 127.0  # x = 1.0 * xq exactly
    exact = (ints.double() @ reference(raw, kind, (n, k)).double().T)
    ours, theirs = (float((f(ints).double() - exact).abs().max()) for f in (layer, rounded))
    assert ours <= 1e-5 * float(exact.abs().max()) and ours * 10 < theirs, (ours, theirs)


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K"])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_tokens_row_has_the_same_bits_alone_and_in_a_pass_of_any_size(kind: str, threads: int) -> None:
    _kernel()
    layer = Int4Linear(_carried(kind, _raw(kind, 80, 4608, seed=5)), torch.randn(80), CPU)
    x = torch.randn(9, 4608, generator=torch.Generator().manual_seed(9))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        whole = layer(x)
        for m in (1, 2, 3, 4, 5, 7):
            assert torch.equal(layer(x[:m]), whole[:m])
        assert torch.equal(torch.cat([layer(x[i:i + 1]) for i in range(9)]), whole)
    finally:
        torch.set_num_threads(before)


def test_layers_join_with_their_own_tables_or_as_bf16_tables() -> None:
    """q/k (Q4_K headers) join in one product, with each row's bits. Beside a bf16-table layer (a gate and up of
    two kinds) they join too, their headers as the bf16 scales and zeros they stand for, so each row has the
    bits of its layer without headers, except where Q4_K rows come in tiles. A Q6_K with headers and one
    without do not join."""
    _kernel()
    weights = [q4_k_weights(n, 512, seed=n) for n in (64, 32)]
    q, k = (Int4Linear(w, None, CPU) for w in weights)
    v = Int4Linear(dataclasses.replace(q4_k_weights(32, 512, seed=7), headers=None), None, CPU)
    x = torch.randn(3, 512)
    alone = torch.cat([q(x), k(x)], dim=-1)
    assert Int4Linear.can_fuse([q, k]) and torch.equal(Int4Linear.fuse([q, k])(x), alone)
    if cpu_pack.tiles():  # Q4_K rows in tiles join only their own kind: the three run as two products
        assert not Int4Linear.can_fuse([q, k, v]) and not Int4Linear.can_fuse([v, q])
        return
    assert Int4Linear.can_fuse([q, k, v])
    plain = [Int4Linear(dataclasses.replace(w, headers=None), None, CPU) for w in weights]
    mixed = [Int4Linear(w, None, CPU) for w in weights]  # fuse() re-points a layer's codes: fresh layers
    assert torch.equal(Int4Linear.fuse([*mixed, v])(x), torch.cat([plain[0](x), plain[1](x), v(x)], dim=-1))
    six = q6_k_weights(32, 512, seed=8)
    a, b = Int4Linear(six, None, CPU), Int4Linear(dataclasses.replace(six, headers=None), None, CPU)
    assert Int4Linear.can_fuse([a, a]) and not Int4Linear.can_fuse([a, b])


def test_a_model_of_k_quant_layers_gives_the_same_bits_in_one_call_a_layer(int4_kernel: str) -> None:
    """csrc/layer.c's fourth and fifth product kinds (or the sixth, Q4_K rows in tiles): a two-layer model laid out as a Q4_K_M file lays out
    Qwen (Q4_K everywhere, Q6_K for v and down) runs its layers in one C call each with the bits of the
    Python calls, in prefill, steps and verify passes."""
    if int4_kernel != "specchat":
        pytest.skip("the layer call runs on specchat's CPU kernels")
    from transformers import AutoModelForCausalLM, Qwen2Config

    from tests.engine.model.test_lean import lockstep

    config = Qwen2Config(vocab_size=96, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=False)
    torch.manual_seed(5)
    model = AutoModelForCausalLM.from_config(config).eval()
    seed = 0
    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, child in list(parent.named_children()):
                if isinstance(child, torch.nn.Linear):
                    seed += 1
                    n, k = child.weight.shape
                    kind = "Q6_K" if name in ("v_proj", "down_proj") else "Q4_K"
                    setattr(parent, name, Int4Linear(_carried(kind, _raw(kind, n, k, seed)), child.bias, CPU))
    one, calls = lean_forward(model), lean_forward(model)
    assert one is not None and calls is not None and one.native_layers is not None
    kinds = {int(p.kind) for layer in one.native_layers
             for p in (*layer.qkv[: layer.n_qkv], layer.o, layer.gate_up, layer.down)}
    assert kinds == {5 if cpu_pack.tiles() else 3, 4}  # Q4_K rows in tiles on AVX-512 (cpu_pack.TILED_VARIANTS)
    calls.native_layers = None

    def equal(got: torch.Tensor, want: torch.Tensor) -> None:
        assert torch.equal(got, want)

    lockstep(one, calls, seed=7, check=equal)
