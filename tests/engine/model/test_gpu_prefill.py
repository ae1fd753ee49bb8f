"""Prefill attention memory (issue 23, item 2) and row-exact attention only where it pays (item 4).

Stand-ins on the CPU: every SDPA call is recorded (its shape, mask, ``is_causal``), and the
bytes SDPA's math kernel would build for it are compared with what the memory plan counts.
"""
from __future__ import annotations

import types

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig

from engine.decode.decoder import SpecDecoder
from engine.decode.drafters import NgramDrafter
from engine.decode.runner import ModelRunner
from engine.events import GenerationParams
from engine.model.device import Device
from engine.model.lean import GrowingKV, lean_forward, rows_pay
from engine.model.memory import (
    PREFILL_CHUNK, estimate_activation_bytes, estimate_attention_bytes, published_config,
)
from engine.quant.int4 import quantize_model

CPU = Device(torch.device("cpu"))
WINDOW = 1400


def model(int4: bool = False) -> torch.nn.Module:
    config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048)
    torch.manual_seed(5)
    m = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0.0, 0.3)
    if int4:
        quantize_model(m, group_size=32)
    return m


class SdpaLog:
    """Records each SDPA call: query rows, key length, mask, is_causal, and the bytes of the
    fp32 scores and probabilities the math kernel would build for it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[dict[str, object]] = []
        real = F.scaled_dot_product_attention

        def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
                 *args: object, **kw: object) -> torch.Tensor:
            self.calls.append(dict(rows=q.shape[2], keys=k.shape[2], masked=attn_mask is not None,
                                   causal=bool(kw.get("is_causal", False)),
                                   math_bytes=2 * q.shape[1] * q.shape[2] * k.shape[2] * 4))
            return real(q, k, v, attn_mask, *args, **kw)

        monkeypatch.setattr(F, "scaled_dot_product_attention", sdpa)


def test_a_long_prefill_is_chunked_causal_first_and_its_peak_is_what_the_plan_counts(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    m = model()
    runner = ModelRunner(m, CPU, window=WINDOW)
    log = SdpaLog(monkeypatch)
    prompt = torch.randint(0, 96, (1300,), generator=torch.Generator().manual_seed(1)).tolist()
    runner.prefill(prompt)
    layers = 2
    assert len(log.calls) == layers * 3  # 512 + 512 + 276 tokens
    first, later = log.calls[:layers], log.calls[layers:]
    assert all(c["causal"] and not c["masked"] and c["rows"] == PREFILL_CHUNK for c in first)  # no [T, S] mask
    assert all(c["masked"] and not c["causal"] and c["rows"] <= PREFILL_CHUNK for c in later)
    assert runner.ids == prompt and runner.cached_length() == 1300
    peak = max(int(c["math_bytes"]) for c in log.calls)  # type: ignore[call-overload]
    assert peak <= estimate_attention_bytes(m.config, WINDOW, "float32")
    # The plan's figure is the bound for a chunk that ends at the window, not a loose guess:
    worst = 2 * 4 * PREFILL_CHUNK * WINDOW * 4
    assert estimate_attention_bytes(m.config, WINDOW, "float32") - worst == 2 * 4 * WINDOW * 16 * 4  # + repeated K, V


def test_the_plan_counts_attentions_scores_and_a_chunk_not_the_whole_context() -> None:
    qwen = published_config("Qwen/Qwen2.5-7B-Instruct")
    scores = 2 * 28 * PREFILL_CHUNK * 4096 * 4  # fp32 scores and probabilities [28 heads, 512, 4096]
    repeated = 2 * 28 * 4096 * 128 * 2  # bf16 K and V repeated to every query head
    assert estimate_attention_bytes(qwen, 4096, "bfloat16") == scores + repeated
    block = PREFILL_CHUNK * (4 * 3584 + 3 * 18944) * 2
    logits = 9 * 152064 * 4
    assert estimate_activation_bytes(qwen, 4096, "bfloat16") == block + scores + repeated + logits
    short = estimate_activation_bytes(qwen, 100, "bfloat16")  # a window under one chunk
    assert short == 100 * (4 * 3584 + 3 * 18944) * 2 + 2 * 28 * 100 * 100 * 4 + 2 * 28 * 100 * 128 * 2 + 9 * 152064 * 4


def test_chunked_prefill_keeps_the_logits_of_a_whole_pass() -> None:
    """Within the tolerance tests/engine/model/test_lean.py allows against transformers."""
    m = model()
    prompt = torch.randint(0, 96, (1100,), generator=torch.Generator().manual_seed(2)).tolist()
    runner = ModelRunner(m, CPU, window=WINDOW)
    runner.prefill(prompt[:-1])
    got = runner.forward(prompt[-1:], logits_to_keep=1)
    with torch.no_grad():
        want = m(input_ids=torch.tensor([prompt]), past_key_values=DynamicCache(config=m.config),
                 use_cache=True, logits_to_keep=1).logits[0].float()
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))


def test_greedy_speculation_stays_plain_decoding_after_a_chunked_prefill() -> None:
    """int4 on the CPU: bit-exact row by row, so the outputs must be equal token for token."""
    m = model(int4=True)
    gen = torch.Generator().manual_seed(3)
    motif = torch.randint(0, 96, (40,), generator=gen).tolist()
    prompt = (motif * 20)[:900]  # repetitive: the n-gram drafter finds copies to propose
    params = GenerationParams(max_new_tokens=40)
    plain = [t for e in SpecDecoder(m, CPU, window=WINDOW).generate(prompt, params) for t in e.token_ids]
    spec_decoder = SpecDecoder(m, CPU, NgramDrafter(), window=WINDOW)
    events = list(spec_decoder.generate(prompt, params))
    assert [t for e in events for t in e.token_ids] == plain
    assert events[-1].stats.accepted > 0  # drafts were verified in K+1-token passes


def test_the_kv_cache_is_capped_at_the_window_and_does_not_double_on_the_first_prefill() -> None:
    runner = ModelRunner(model(), CPU, window=600)
    runner.prefill(list(range(1, 91)) * 6 + [1, 2, 3, 4])  # 544 tokens: 2 x 544 would be 1088
    cache = runner.cache
    assert isinstance(cache, GrowingKV) and cache.limit == 600
    assert all(layer.k is not None and layer.k.shape[2] == 600 for layer in cache.layers)
    runner.forward([5] * 50, logits_to_keep=1)  # up to 594: no growth past the window
    assert all(layer.k is not None and layer.k.shape[2] == 600 for layer in cache.layers)
    uncapped = GrowingKV(1)
    uncapped.update(torch.zeros(1, 2, 300, 4), torch.zeros(1, 2, 300, 4), 0)
    assert uncapped.layers[0].k is not None and uncapped.layers[0].k.shape[2] == 600  # doubling, as before
    default = ModelRunner(model(), CPU)
    assert isinstance(default.cache, GrowingKV) and default.cache.limit == 2048  # max_position_embeddings


def test_the_decoder_caps_both_caches_at_its_window() -> None:
    from engine.decode.drafters import ModelDrafter

    m = model()
    drafter = ModelDrafter(model(), CPU)
    decoder = SpecDecoder(m, CPU, drafter, window=700)
    assert decoder.target.window == 700 and drafter.runner.window == 700
    assert isinstance(drafter.runner.cache, GrowingKV) and drafter.runner.cache.limit == 700


def test_per_row_attention_only_off_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    m = model(int4=True)
    lean = lean_forward(m)
    assert lean is not None and lean.rows_pay  # the CPU: row-exact verify passes
    cuda_weight = types.SimpleNamespace(is_cuda=True)
    assert rows_pay([torch.zeros(1), cuda_weight]) is False and rows_pay([torch.zeros(1)]) is True
    runner = ModelRunner(m, CPU)
    assert runner._lean is not None
    runner._lean.native_attention = False  # torch's ops (specchat's attention step takes no SDPA call)
    runner.prefill(list(range(20)))
    log = SdpaLog(monkeypatch)
    runner.forward([1, 2, 3, 4, 5], logits_to_keep=5)
    assert len(log.calls) == 2 * 5  # one call per row and layer
    runner.truncate(20)
    assert runner._lean is not None
    runner._lean.rows_pay = False  # what a model on CUDA gets
    log.calls.clear()
    runner.forward([1, 2, 3, 4, 5], logits_to_keep=5)
    assert len(log.calls) == 2 and all(c["masked"] and c["rows"] == 5 for c in log.calls)  # one call a layer
