"""The lean forward pass computes what transformers computes, over the same weights and cache."""
from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig, Qwen2Config

from engine.model.device import Device
from engine.model.kv import GrowingKV
from engine.model.lean import LeanForward, lean_forward
from engine.quant.int4 import quantize_model
from engine.decode.runner import ModelRunner


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


LOCKSTEP_PASSES = (40, 1, 1, 5, 3, 1)
"""A prompt, one-token steps and verify-sized passes."""


def lockstep(a: LeanForward, b: LeanForward, seed: int,
             check: Callable[[torch.Tensor, torch.Tensor], None]) -> tuple[GrowingKV, GrowingKV]:
    """Feed two forwards of one two-layer model the same random ids in passes of
    :data:`LOCKSTEP_PASSES` tokens, each over a cache of its own; ``check(a's logits, b's)`` after
    every pass. Returns the two caches."""
    caches = GrowingKV(2), GrowingKV(2)
    gen = torch.Generator().manual_seed(seed)
    start = 0
    with torch.no_grad():
        for n in LOCKSTEP_PASSES:
            ids = torch.randint(0, 96, (1, n), generator=gen)
            check(a(ids, caches[0], start, n), b(ids, caches[1], start, n))
            start += n
    return caches


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
def test_int4_fusion_is_exact_where_it_is_allowed(rows: tuple[int, ...], fusable: bool, int4_kernel: str) -> None:
    """torch's kernel packs rows in blocks of 64, so only layers on those boundaries join;
    specchat's keeps every row apart and joins any."""
    from engine.quant import Int4Linear, quantize_weight

    fusable = fusable or int4_kernel == "specchat"
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


def test_the_residual_shortcuts_are_the_same_numbers_bit_for_bit(int4_kernel: str) -> None:
    """Two shortcuts of the lean forward change no bit: an o/down layer's bf16 result added to
    the float32 stream as it is (the sum promotes it; specchat's kernel answers in fp32 anyway),
    and rope's rotate_half folded into a roll by a sine whose first half is negated."""
    from engine.model.lean import _signed_sin
    from engine.quant import Int4Linear, quantize_weight

    gen = torch.Generator().manual_seed(3)
    bias = torch.randn(64, generator=gen)
    layer = Int4Linear(quantize_weight(torch.randn(64, 128, generator=gen), 32), bias, torch.device("cpu"))
    x, stream = torch.randn(1, 5, 128, generator=gen), torch.randn(1, 5, 64, generator=gen)
    widened = stream + Int4Linear.fuse([layer])(x)
    raw = Int4Linear.fuse([layer], widen=False)(x)
    assert raw.dtype == torch.float32 and torch.equal(stream + raw, widened)  # the bias promotes it already
    no_bias = Int4Linear(quantize_weight(torch.randn(64, 128, generator=gen), 32), None, torch.device("cpu"))
    raw = Int4Linear.fuse([no_bias], widen=False)(x)
    kernel_dtype = torch.bfloat16 if int4_kernel == "torch" else torch.float32
    assert raw.dtype == kernel_dtype and torch.equal(stream + raw, stream + Int4Linear.fuse([no_bias])(x))

    qk, cos, sin = (torch.randn(1, 6, 7, 64, generator=gen) for _ in range(3))
    half = 32
    rotated = torch.cat((-qk[..., half:], qk[..., :half]), dim=-1)
    assert torch.equal(qk * cos + qk.roll(half, dims=-1) * _signed_sin(sin), qk * cos + rotated * sin)


def test_growing_cache_matches_dynamic_cache_through_crops_and_growth() -> None:
    """The lean path's cache gives the same logits as transformers' through prefill, steps,
    rejected drafts (crops) and growth past its first buffer."""
    from engine.model.lean import GrowingKV

    model = _model("llama")
    lean = lean_forward(model)
    assert lean is not None
    ours, theirs = GrowingKV(2), DynamicCache(config=model.config)
    gen = torch.Generator().manual_seed(0)
    length = 0
    with torch.no_grad():
        for step in range(40):
            n = 1 + step % 7 if step else 200  # a long prompt, then passes of 1..7 tokens
            ids = torch.randint(0, 96, (1, n), generator=gen)
            got = lean(ids, ours, length, logits_to_keep=n)
            want = model(input_ids=ids, past_key_values=theirs, use_cache=True, logits_to_keep=n).logits
            assert torch.allclose(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))
            length += n
            drop = step % 3  # a rejected tail, as after a verify pass
            if drop and length > drop:
                for layer in ours.layers:
                    layer.crop(-drop)
                theirs.crop(-drop)
                length -= drop
            assert ours.get_seq_length() == theirs.get_seq_length() == length
    assert ours.layers[0].k is not None and ours.layers[0].k.shape[2] > 256  # it grew


@pytest.mark.parametrize("int4", [True, False])
def test_a_verify_pass_gives_each_row_the_one_token_step_numbers(int4: bool, int4_kernel: str) -> None:
    """Greedy speculation is token-identical to plain decoding only if a K+1-token
    pass computes every row bit for bit as one-token steps would. The int4 path
    guarantees it (batch-invariant kernels, one-row attention; on specchat's kernel with
    the norms and residual adds folded into the matmuls); fp32 BLAS matmuls
    pick kernels by row count, so there only near-ties can differ."""
    model = _model("llama")
    if int4:
        quantize_model(model, group_size=32)
    runner = ModelRunner(model, Device(torch.device("cpu")))
    lean = runner._lean
    assert lean is not None
    assert [layer.folded for layer in lean.layers] == [int4 and int4_kernel == "specchat"] * 2
    assert lean.head_folds is (int4 and int4_kernel == "specchat")
    assert lean.native_attention is (int4 and int4_kernel == "specchat")
    gen = torch.Generator().manual_seed(4)
    prompt, tail = torch.randint(0, 96, (300,), generator=gen).tolist(), [6, 5, 3, 5, 8]
    runner.prefill(prompt)
    batch = runner.forward(tail, logits_to_keep=len(tail))
    runner.truncate(len(prompt))
    steps = torch.cat([runner.forward([t], logits_to_keep=1) for t in tail])
    if int4:
        assert torch.equal(batch, steps)
    else:
        assert torch.allclose(batch, steps, rtol=0, atol=1e-5 * float(steps.abs().max()))


def test_row_exact_attention_equals_one_row_calls_where_one_masked_call_does_not() -> None:
    model = _model("llama")
    lean = lean_forward(model)
    assert lean is not None
    gen = torch.Generator().manual_seed(2)
    start, t = 294, 6
    q = torch.randn(1, 4, t, 16, generator=gen)
    k, v = torch.randn(1, 2, start + t, 16, generator=gen), torch.randn(1, 2, start + t, 16, generator=gen)
    mask = torch.ones(t, start + t, dtype=torch.bool).tril(diagonal=start)
    one_row = [lean._attention(q[:, :, i : i + 1], k[:, :, : start + i + 1], v[:, :, : start + i + 1], None,
                               start + i, True) for i in range(t)]
    exact = lean._attention(q, k, v, mask, start, True)
    assert all(torch.equal(exact[:, :, i : i + 1], one_row[i]) for i in range(t))
    masked = lean._attention(q, k, v, mask, start, False)
    assert not all(torch.equal(masked[:, :, i : i + 1], one_row[i]) for i in range(t))  # why row_exact exists


def test_the_native_attention_step_computes_what_the_torch_ops_compute(int4_kernel: str) -> None:
    """On specchat's kernels a layer's rope, cache write and attention are one call
    (engine/model/cpu_attention.py); through prefill, steps and verify-sized passes the logits
    are the torch ops' to float rounding, and the first layer's cached keys (roped from the same
    q/k/v) are the same bit for bit. Both keep the cache in fp16, as the step reads it (the torch
    path's buffers come from the same ``_kv_like``)."""
    if int4_kernel != "specchat":
        pytest.skip("the attention step runs beside specchat's int4 kernel")
    model = _model("qwen2")
    quantize_model(model, group_size=32)
    native, ops = lean_forward(model), lean_forward(model)
    assert native is not None and ops is not None and native.native_attention
    ops.native_attention = False

    def close(got: torch.Tensor, want: torch.Tensor) -> None:
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))

    caches = lockstep(native, ops, seed=6, check=close)
    assert torch.equal(caches[0].layers[0].keys, caches[1].layers[0].keys)  # the first layer's: rope alike


@pytest.mark.parametrize("int4", [True, False])
def test_a_prompt_is_read_the_same_way_whether_or_not_it_can_be_stopped(int4: bool, int4_kernel: str) -> None:
    """The app reads a prompt with a cancel flag (Esc stops the reading between pieces of
    PREFILL_PIECE tokens), the command line without one: both must leave the same cache and the
    same logits, or their greedy replies part (pocket's did, at token 99 of a 512-token reply:
    one read of the whole prompt took SDPA's causal kernel, the pieces specchat's attention step)."""
    import threading

    from engine.decode.runner import PREFILL_PIECE

    model = _model("llama")
    if int4:
        quantize_model(model, group_size=32)
    gen = torch.Generator().manual_seed(9)
    prompt = torch.randint(0, 96, (3 * PREFILL_PIECE + 5,), generator=gen).tolist()
    logits = []
    for cancel in (None, threading.Event()):
        runner = ModelRunner(model, Device(torch.device("cpu")))
        runner.catch_up(prompt, cancel)
        assert runner.ids == prompt[:-1]
        logits.append(runner.forward(prompt[-1:]))
    assert torch.equal(logits[0], logits[1])


@pytest.mark.parametrize("shared", [0, 7, 40])
def test_a_prompt_is_read_the_same_way_whatever_the_engine_read_before(shared: int, int4_kernel: str) -> None:
    """The app keeps one engine a session: a new chat's prompt shares the chat template's first
    tokens with the chat before, so its reading starts past them, in other pieces than a cold read
    (``specchat generate``). Every prompt position must come out the same either way, or the app's
    greedy (and seeded) replies part from generate's and the bench's: pocket's did on 4 of 11
    prompts (a reviewer's; the first piece of a cold read took SDPA's causal kernel)."""
    from engine.decode.runner import PREFILL_PIECE

    model = _model("llama")
    quantize_model(model, group_size=32)
    gen = torch.Generator().manual_seed(11)
    prompt = torch.randint(0, 96, (2 * PREFILL_PIECE + 9,), generator=gen).tolist()
    earlier = prompt[:shared] + torch.randint(0, 96, (PREFILL_PIECE + 3,), generator=gen).tolist()
    cold = ModelRunner(model, Device(torch.device("cpu")))
    cold.catch_up(prompt)
    warm = ModelRunner(model, Device(torch.device("cpu")))
    warm.catch_up(earlier)
    warm.forward(earlier[-1:])  # the earlier chat's last prompt token, read as a reply's first step
    warm.catch_up(prompt)
    assert warm.ids == cold.ids == prompt[:-1]
    assert torch.equal(warm.forward(prompt[-1:]), cold.forward(prompt[-1:]))
