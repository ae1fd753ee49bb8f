"""The lean forward pass computes what transformers computes, over the same weights and cache."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig, Qwen2Config

from engine.device import Device
from engine.lean import LeanForward, lean_forward
from engine.quant.int4 import quantize_model
from engine.runner import ModelRunner


def _model(kind: str) -> torch.nn.Module:
    common = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    config = LlamaConfig(**common) if kind == "llama" else Qwen2Config(**common, tie_word_embeddings=False)
    torch.manual_seed(5)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model


@pytest.mark.parametrize("kind", ["llama", "qwen2"])  # qwen2: q/k/v biases
@pytest.mark.parametrize("int4", [False, True])
def test_lean_forward_matches_transformers(kind: str, int4: bool) -> None:
    model = _model(kind)
    if int4:
        quantize_model(model, group_size=32)
    lean = lean_forward(model)
    assert isinstance(lean, LeanForward)
    ours, theirs = DynamicCache(config=model.config), DynamicCache(config=model.config)
    chunks = [[3, 1, 4, 1, 5, 9, 2], [6], [5, 3, 5], [8]]  # a prefill, steps and a verify-sized pass
    start = 0
    with torch.no_grad():
        for chunk in chunks:
            ids = torch.tensor([chunk])
            got = lean(ids, ours, start, logits_to_keep=len(chunk))
            want = model(input_ids=ids, past_key_values=theirs, use_cache=True, logits_to_keep=len(chunk)).logits
            start += len(chunk)
            assert got.shape == want.shape
            assert torch.allclose(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))
    assert ours.get_seq_length() == theirs.get_seq_length() == start


def test_unsupported_models_keep_transformers_forward() -> None:
    model = _model("llama")
    model.config.hidden_act = "gelu"
    assert lean_forward(model) is None
    runner = ModelRunner(model, Device(torch.device("cpu")))
    assert runner.forward([1, 2, 3]).shape == (1, 96)


@pytest.mark.parametrize("rows, fusable", [((576, 192, 192), True), ((64, 32, 32), False), ((1536, 1536), True)])
def test_int4_fusion_is_exact_where_it_is_allowed(rows: tuple[int, ...], fusable: bool) -> None:
    from engine.quant import Int4Linear, quantize_weight

    gen = torch.Generator().manual_seed(1)
    layers = [Int4Linear(quantize_weight(torch.randn(n, 128, generator=gen), 32), None, torch.device("cpu"))
              for n in rows]
    x = torch.randn(3, 128, generator=gen)
    separate = torch.cat([layer(x) for layer in layers], dim=-1)
    assert Int4Linear.can_fuse(layers) is fusable
    if fusable:
        fused = Int4Linear.fuse(layers)
        assert torch.equal(fused(x), separate)
        assert torch.equal(torch.cat([layer(x) for layer in layers], dim=-1), separate)  # views still right
