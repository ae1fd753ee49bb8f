"""What coder's GGUF blocks become on a CUDA card (issue 35 item 7), decided on the CPU: the
layout functions are pure, so no card is needed to check them (docs/gpu.md lists what a card
checks). Q4_K groups go to torch's CUDA kernel code for code; Q6_K's groups of 16, which those
kernels do not take, become 8-bit groups of 32, requantized a slice of rows at a time with the
very codes of the whole; every layer of coder's pair packs with a tile width the kernel takes."""
from __future__ import annotations

import torch

from engine.model.published import published_config
from engine.quant.int4 import (
    Int4Weights, check_shape, cuda_inner_k_tiles, is_six_bit, kernel_weights, nibble_pairs, quantize_weight, two_planes,
)
from engine.quant.stream import pack_for_cache

CARD = torch.device("cuda:0")  # never touched: these functions only read its type


def six_bit(n: int, k: int, seed: int) -> Int4Weights:
    """Random Q6_K-shaped groups as engine.quant.gguf_blocks carries them (codes 0..63 + 96, a scale per 16)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 64, (n, k), generator=gen)
    s = (torch.randn(n, k // 16, generator=gen) * 1e-3).bfloat16().float()
    return two_planes(q + 96, s, 8.0 * s, torch.zeros_like(s), 16)


def test_q6_k_groups_become_8_bit_groups_of_32_for_the_card_within_half_a_step() -> None:
    weights = six_bit(24, 256, seed=4)
    placed = kernel_weights(weights, CARD)
    assert not is_six_bit(placed) and placed.group_size == 32 and placed.planes == 2 and placed.shape == (24, 256)
    err = (placed.dequantize() - weights.dequantize()).abs().view(24, 8, 32).amax(-1)
    assert bool((err <= placed.scale[:, :8] / 2 + placed.zero[:, :8].abs() * 2.0**-9 + 1e-7).all())


def test_a_tall_q6_k_weight_is_requantized_in_slices_with_the_codes_of_the_whole() -> None:
    weights = six_bit(40, 128, seed=5)
    whole = kernel_weights(weights, CARD, rows=10**9)
    sliced = kernel_weights(weights, CARD, rows=16)  # 16 + 16 + 8 rows
    for field in ("codes", "scale", "zero"):
        assert torch.equal(getattr(sliced, field), getattr(whole, field)), field
    assert (sliced.group_size, sliced.planes) == (whole.group_size, whole.planes)
    # computed elsewhere (a card, in Int4Linear; here the CPU stands in), brought back where they lay
    moved = kernel_weights(weights, CARD, rows=16, work=torch.device("cpu"))
    assert all(torch.equal(getattr(moved, f), getattr(whole, f)) for f in ("codes", "scale", "zero"))
    assert moved.codes.device == weights.codes.device


def test_four_bit_groups_go_to_the_card_code_for_code() -> None:
    q4 = quantize_weight(torch.randn(16, 256), 32)  # a Q4_K's groups have this form (one plane, groups of 32)
    assert kernel_weights(q4, CARD) is q4


def test_the_cuda_pack_is_fed_two_codes_a_byte_even_column_high() -> None:
    codes = torch.tensor([[1, 2, 3, 4], [15, 0, 7, 8]], dtype=torch.uint8)
    assert nibble_pairs(codes).tolist() == [[0x12, 0x34], [0xF0, 0x78]]
    weights = quantize_weight(torch.randn(16, 64), 32)
    assert torch.equal(nibble_pairs(weights.codes), pack_for_cache(weights).codes)  # the cache's own form


def test_every_linear_of_coders_pair_packs_on_a_card_one_or_two_planes() -> None:
    for repo in ("Qwen/Qwen2.5-Coder-1.5B-Instruct", "Qwen/Qwen2.5-Coder-0.5B-Instruct"):
        c = published_config(repo)
        hd = c.hidden_size // c.num_attention_heads
        shapes = {"q": (c.hidden_size, c.hidden_size), "kv": (c.num_key_value_heads * hd, c.hidden_size),
                  "gate_up": (c.intermediate_size, c.hidden_size), "down": (c.hidden_size, c.intermediate_size),
                  "head": (c.vocab_size, c.hidden_size)}
        for name, (n, k) in shapes.items():
            for planes in (1, 2):  # Q4_K, or Q6_K/Q5_0/Q8_0 as two planes
                check_shape(n, k, 32, CARD, planes)
                assert cuda_inner_k_tiles(planes * k) == 8, (repo, name, planes)
