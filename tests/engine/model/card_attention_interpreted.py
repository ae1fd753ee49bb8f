"""The card's fused rope, cache write and attention (engine/model/card_attention.py) run on the CPU
through Triton's interpreter (float32): its passes against SDPA's over the same static cache, its
rows against one-token passes, a whole reply through the runner against the unfused one, and the
runner's choice of it. Triton decides at import whether it interprets, so these run in a process
of their own that starts with ``TRITON_INTERPRET=1`` (test_card_attention.py launches it)."""
from __future__ import annotations

import os

import pytest
import torch

from engine.decode.decoder import SpecDecoder
from engine.decode.drafters import ModelDrafter, NgramDrafter
from engine.model.capture import RecordingBackend, attention_span
from engine.model.device import Device
from engine.model.kv import StaticKV
from engine.model.lean import LeanForward, lean_forward
from tests.engine.decode.test_plain_burst import reply
from tests.tiny import noisy_copy, tiny_llama

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("run by test_card_attention.py, under TRITON_INTERPRET=1", allow_module_level=True)


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_llama(seed=1, hidden_size=64)  # heads of 16: the smallest a Triton dot takes


def fused(model: torch.nn.Module) -> LeanForward:
    from engine.model.card_attention import card_layer

    lean = lean_forward(model)
    assert lean is not None
    lean.step_fn = card_layer
    return lean


def static_pass(lean: LeanForward, cache: StaticKV, ids: list[int], start: int) -> torch.Tensor:
    positions = torch.arange(start, start + len(ids))
    with torch.inference_mode():
        return lean.static_pass(torch.tensor([ids]), cache, positions, len(ids),
                                attention_span(start + len(ids), cache.window))


def test_fused_passes_compute_what_sdpa_passes_compute(target) -> None:
    sdpa, card = lean_forward(target), fused(target)
    assert sdpa is not None
    a, b = StaticKV(2, 96), StaticKV(2, 96)
    start = 0
    for ids in ([3] * 40, [5], [6, 7, 8, 9], [10], list(range(11, 28))):  # a prompt (SDPA in both), steps, verifies
        want, got = static_pass(sdpa, a, ids, start), static_pass(card, b, ids, start)
        start += len(ids)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-4)
        assert torch.equal(got.argmax(-1), want.argmax(-1))
        for mine, theirs in zip(b.layers, a.layers):  # the new keys written roped, the values as they are
            torch.testing.assert_close(mine.k[:, :, :start], theirs.k[:, :, :start], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(mine.v[:, :, :start], theirs.v[:, :, :start], rtol=1e-5, atol=1e-5)
    # keys past the cached ones are never read: garbage there changes nothing
    with torch.inference_mode():
        for layer in b.layers:
            layer.k[:, :, start:] = float("nan")
            layer.v[:, :, start:] = 1e30
    torch.testing.assert_close(static_pass(card, b, [30], start), static_pass(sdpa, a, [30], start),
                               rtol=1e-5, atol=2e-4)


def test_a_rows_attention_does_not_depend_on_how_many_rows_the_pass_has(target) -> None:
    """The kernel's rows over a 4-token pass against four one-token passes, from the same cache
    (the projections around it are BLAS's, whose rounding may follow the row count; this is not)."""
    from engine.model.card_attention import rope_write_attend

    lean = fused(target)
    d = lean.dims
    torch.manual_seed(0)
    width = (d.n_heads + 2 * d.n_kv) * d.head_dim
    cached = torch.randn(1, d.n_kv, 96, d.head_dim), torch.randn(1, d.n_kv, 96, d.head_dim)
    table = lean._rope_table(96, cached[0])
    qkv = torch.randn(1, 4, width)
    wide = [c.clone() for c in cached]
    rows = rope_write_attend(qkv, table, torch.arange(30, 34), *wide, d)
    narrow = [c.clone() for c in cached]
    steps = [rope_write_attend(qkv[:, i : i + 1], table, torch.arange(30 + i, 31 + i), *narrow, d) for i in range(4)]
    assert torch.equal(rows, torch.cat(steps, dim=1))
    assert torch.equal(wide[0], narrow[0]) and torch.equal(wide[1], narrow[1])
    assert not torch.equal(wide[0], cached[0])  # the new keys were written


@pytest.mark.parametrize("drafter", ["ngram", "model"])
def test_a_runner_on_the_static_cache_takes_it_and_replies_as_without_it(target, drafter, monkeypatch) -> None:
    prompt = [3, 5, 7, 11, 13, 3, 5, 7]
    plain = reply(SpecDecoder(target, Device(torch.device("cpu"))), prompt, max_new_tokens=30, k=3)[0]

    def decoder() -> SpecDecoder:
        device = Device(torch.device("cpu"), static_cache=True, graphs=RecordingBackend())
        draft = (NgramDrafter() if drafter == "ngram"
                 else ModelDrafter(noisy_copy(target, 0.4, seed=3), device))
        return SpecDecoder(target, device, draft)

    on = decoder()
    assert on.target.why_unfused is None and on.target.passes_compiled is False
    assert reply(on, prompt, max_new_tokens=30, k=3)[0] == plain
    assert on.target.capture.replays > 0  # the fused passes were captured and replayed
    monkeypatch.setenv("SPECCHAT_CARD_ATTENTION", "0")
    off = decoder()
    assert off.target.why_unfused == "SPECCHAT_CARD_ATTENTION=0"
    assert reply(off, prompt, max_new_tokens=30, k=3)[0] == plain


def test_the_cpu_without_the_interpreter_keeps_sdpa(target, monkeypatch) -> None:
    from engine.model.card_attention import why_not_fused

    lean = lean_forward(target)
    assert lean is not None
    monkeypatch.delenv("TRITON_INTERPRET")
    assert why_not_fused(lean.dims, torch.device("cpu"), torch.float32) == "not a card"
    device = Device(torch.device("cpu"), static_cache=True, graphs=RecordingBackend())
    assert SpecDecoder(target, device).target.why_unfused == "not a card"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    odd = lean.dims._replace(head_dim=48)
    assert "heads of 48" in (why_not_fused(odd, torch.device("cpu"), torch.float32) or "")


def test_one_capture_serves_every_span_since_the_kernel_reads_no_span() -> None:
    target = tiny_llama(seed=1, hidden_size=64)
    target.config.max_position_embeddings = 1024  # the window
    prompt = [(7 * i) % 90 + 3 for i in range(250)]
    plain = reply(SpecDecoder(target, Device(torch.device("cpu"))), prompt, max_new_tokens=24)[0]
    device = Device(torch.device("cpu"), static_cache=True, graphs=RecordingBackend())
    decoder = SpecDecoder(target, device, NgramDrafter())
    decoder.set_speculation(False)
    got = reply(decoder, prompt, max_new_tokens=24)[0]
    assert got == plain  # positions 250 .. 273 cross from span 256 to 512
    capture = decoder.target.capture
    assert capture.captured_shapes() == {(1, 1)} and capture.captures == 1 and capture.replays >= 22


def reference(qkv: torch.Tensor, table: torch.Tensor, positions: torch.Tensor, keys: torch.Tensor,
              values: torch.Tensor, heads: int, kv: int, d: int) -> torch.Tensor:
    """Rope, the cache write and SDPA under a causal-by-position mask, op by op."""
    t = qkv.shape[1]
    cos, sin = table[positions, 0], table[positions, 1]  # [T, d]

    def rope(x: torch.Tensor) -> torch.Tensor:  # [T, n, d]
        return x * cos[:, None] + x.roll(d // 2, dims=-1) * sin[:, None]

    q = rope(qkv[0, :, : heads * d].view(t, heads, d))
    k = rope(qkv[0, :, heads * d : (heads + kv) * d].view(t, kv, d))
    v = qkv[0, :, (heads + kv) * d :].view(t, kv, d)
    keys[0, :, positions] = k.transpose(0, 1)
    values[0, :, positions] = v.transpose(0, 1)
    visible = torch.arange(keys.shape[2])[None, :] <= positions[:, None]  # [T, window]
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1)[None], keys, values, attn_mask=visible, scale=d**-0.5, enable_gqa=True)
    return out[0].transpose(0, 1).reshape(1, t, heads * d)


@pytest.mark.parametrize("heads,kv,d,t", [(4, 2, 16, 1), (8, 1, 32, 17), (6, 2, 64, 5), (14, 2, 64, 9),
                                          (12, 2, 128, 3), (4, 4, 32, 20)],
                         ids=["small", "rows-in-3-blocks", "pocket-like", "qwen-0.5b-like", "heads-of-128", "mha"])
def test_the_kernel_against_rope_cache_write_and_sdpa_op_by_op(heads, kv, d, t) -> None:
    from engine.model.card_attention import rope_write_attend
    from engine.model.layer_parts import Dims

    torch.manual_seed(heads * 100 + t)
    window, start = 64, 37
    dims = Dims(heads, kv, d, d**-0.5, (heads + kv) * d)
    qkv = torch.randn(1, t, (heads + 2 * kv) * d)
    angles = torch.arange(window)[:, None] * (10000.0 ** (-torch.arange(0, d, 2) / d))[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    sin = torch.sin(angles)
    sin[:, : d // 2] = -sin[:, : d // 2]
    table = torch.stack([torch.cos(angles), sin], dim=1).contiguous()  # [window, 2, d]
    positions = torch.arange(start, start + t)
    cached = torch.randn(1, kv, window, d), torch.randn(1, kv, window, d)
    mine = [c.clone() for c in cached]
    theirs = [c.clone() for c in cached]
    got = rope_write_attend(qkv, table, positions, *mine, dims)
    want = reference(qkv, table, positions, *theirs, heads, kv, d)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mine[0], theirs[0], rtol=1e-6, atol=1e-6)
    assert torch.equal(mine[1], theirs[1])
