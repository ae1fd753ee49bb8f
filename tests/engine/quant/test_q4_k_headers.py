"""A GGUF's Q4_K rows on specchat's CPU kernel keep their super-blocks' 16-byte headers in place of a bf16
scale and zero per group (4.5 bits a weight, not 5): the kernel computes ``d·sc`` and ``−dmin·m`` from them
exactly, so it multiplies the file's own weights, with the batch invariance every layout has."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.model.lean import lean_forward
from engine.quant import cpu_kernel
from engine.quant.gguf_blocks import decode_q4_rows, q4_k_headers
from engine.quant.int4 import Int4Linear, Int4Weights, QuantReport
from tests.engine.quant.test_gguf_blocks import raw_blocks, reference

CPU = torch.device("cpu")


def q4_k_weights(n: int, k: int, seed: int) -> Int4Weights:
    """Random valid Q4_K rows ``[n, k]`` carried as :mod:`engine.quant.gguf_blocks` carries them."""
    raw = raw_blocks("Q4_K", n, k, rng=np.random.default_rng(seed))
    codes, scale, zero = decode_q4_rows(raw, "Q4_K")
    return Int4Weights(*(torch.from_numpy(a) for a in (codes, scale, zero)), 32,
                       headers=torch.from_numpy(q4_k_headers(raw)))


def _kernel() -> None:
    if cpu_kernel.matmul4k() is None:
        pytest.skip(f"specchat's CPU kernel cannot run here: {cpu_kernel.why_not()}")


def test_the_headers_give_the_carried_scales_exactly_and_the_mins_to_fp32_rounding() -> None:
    weights = q4_k_weights(24, 768, seed=3)
    assert weights.headers is not None and weights.headers.shape == (24, 768 // 256 * 16)
    scale, mins = cpu_kernel.header_scales(weights.headers)
    assert torch.equal(scale, weights.scale)
    assert torch.allclose(weights.zero - 8.0 * weights.scale, -mins, rtol=0, atol=1e-6 * float(weights.zero.abs().max()))


def test_headers_of_other_weights_are_refused() -> None:
    weights, other = q4_k_weights(8, 512, seed=1), q4_k_weights(8, 512, seed=2)
    with pytest.raises(ValueError, match="do not give these weights"):
        cpu_kernel.pack(weights.codes, weights.scale, weights.zero, 1, headers=other.headers)
    with pytest.raises(ValueError, match="do not fit"):
        cpu_kernel.pack(weights.codes, weights.scale, weights.zero, 1, headers=other.headers[:, :16])


@pytest.mark.parametrize("n, k", [(48, 256), (32, 1536), (16, 8960)])
def test_the_layer_keeps_16_bytes_a_256_weights_and_multiplies_the_files_weights(n: int, k: int) -> None:
    """Against the GGUF's own dequantization (gguf-py), each output is within the bound the activations'
    int8 rounding allows, and closer than the bf16-rounded scales of the earlier layout get."""
    _kernel()
    raw = raw_blocks("Q4_K", n, k, rng=np.random.default_rng(n))
    codes, scale, zero = decode_q4_rows(raw, "Q4_K")
    weights = Int4Weights(*(torch.from_numpy(a) for a in (codes, scale, zero)), 32,
                          headers=torch.from_numpy(q4_k_headers(raw)))
    layer = Int4Linear(weights, None, CPU)
    table = layer.scales_and_zeros
    assert layer.kernel == "specchat" and table.dtype == torch.uint8 and table.shape == (n, k // 256 * 16)
    report = QuantReport()
    report.add("w", layer)
    assert report.int4_bytes == n * k // 2 + n * k // 16  # 144 bytes a super-block, as in the file
    x = torch.randn(5, k, generator=torch.Generator().manual_seed(k))
    exact = x @ reference(raw, "Q4_K", (n, k)).T
    half_step = x.abs().view(5, k // 32, 32).amax(-1) / 254
    bound = half_step @ weights.dequantize().abs().view(n, k // 32, 32).sum(-1).T * 1.001 + 1e-5
    err = (layer(x) - exact).abs()
    assert bool((err <= bound).all()), float((err / bound).max())
    rounded = Int4Linear(Int4Weights(weights.codes, weights.scale, weights.zero, 32), None, CPU)
    assert rounded.scales_and_zeros.dtype == torch.bfloat16
    assert float(err.max()) <= float((rounded(x) - exact).abs().max())


@pytest.mark.parametrize("threads", [1, 2])
def test_a_tokens_row_has_the_same_bits_alone_and_in_a_pass_of_any_size(threads: int) -> None:
    _kernel()
    layer = Int4Linear(q4_k_weights(80, 4608, seed=5), torch.randn(80), CPU)
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


def test_layers_join_only_with_layers_of_the_same_table() -> None:
    """q/k (Q4_K headers) join in one product, with each row's bits; a bf16-table layer beside them does not."""
    _kernel()
    q, k = (Int4Linear(q4_k_weights(n, 512, seed=n), None, CPU) for n in (64, 32))
    v = Int4Linear(Int4Weights(*(getattr(q4_k_weights(32, 512, seed=7), f) for f in ("codes", "scale", "zero")), 32),
                   None, CPU)
    x = torch.randn(3, 512)
    alone = torch.cat([q(x), k(x)], dim=-1)
    assert Int4Linear.can_fuse([q, k]) and not Int4Linear.can_fuse([q, k, v])
    assert torch.equal(Int4Linear.fuse([q, k])(x), alone)


def test_a_model_of_q4_k_layers_gives_the_same_bits_in_one_call_a_layer(int4_kernel: str) -> None:
    """csrc/layer.c's fourth product kind: a two-layer model whose projections all keep Q4_K headers runs
    its layers in one C call each with the bits of the Python calls, in prefill, steps and verify passes."""
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
                    setattr(parent, name, Int4Linear(q4_k_weights(n, k, seed), child.bias, CPU))
    one, calls = lean_forward(model), lean_forward(model)
    assert one is not None and calls is not None and one.native_layers is not None
    assert {int(p.kind) for layer in one.native_layers for p in (layer.qkv[0], layer.o, layer.gate_up, layer.down)} == {3}
    calls.native_layers = None

    def equal(got: torch.Tensor, want: torch.Tensor) -> None:
        assert torch.equal(got, want)

    lockstep(one, calls, seed=7, check=equal)
