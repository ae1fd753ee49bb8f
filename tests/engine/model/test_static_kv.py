"""The static KV cache (issue 35, item 1): the window preallocated, keys written at device
positions, cropping by moving the length, attention over the whole window under a mask.

Whole-window attention under a mask sums other terms in another order than attention over the
cached slice, so in float32 its logits may differ from the growing cache's in the last bits:
those are compared with a tolerance, and the greedy replies, which is what must not change,
token for token (the tiny models' logits are sharp, so rounding does not flip an argmax).
"""
from __future__ import annotations

import pytest
import torch

from engine.decode.decoder import SpecDecoder
from engine.decode.drafters import ModelDrafter, NgramDrafter
from engine.decode.runner import ModelRunner
from engine.events import GenerationParams
from engine.model.device import Device
from engine.model.kv import GrowingKV, StaticKV
from engine.model.lean import lean_forward
from tests.tiny import noisy_copy, tiny_llama

CPU = Device(torch.device("cpu"))
STATIC = Device(torch.device("cpu"), static_cache=True)
PROMPTS = [[3, 5, 7, 11, 13], [1, 2, 3, 1, 2, 3, 1, 2], [42], [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 9, 8]]


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_llama(seed=1)


def reply(decoder: SpecDecoder, prompt: list[int], **kw: object) -> list[int]:
    out: list[int] = []
    for event in decoder.generate(prompt, GenerationParams(**kw)):
        out += event.token_ids
        assert decoder.target.ids == (prompt + out)[:-1]
        assert decoder.target.cached_length() == len(prompt + out) - 1
    return out


def test_static_passes_give_the_growing_caches_logits_through_crops(target) -> None:
    lean = lean_forward(target)
    assert lean is not None
    growing, static = GrowingKV(2), StaticKV(2, 64)
    ids = torch.tensor([[3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37]])
    steps = [(0, 5, 5), (5, 1, 1), (6, 4, 4), ("crop", 7, 0), (7, 3, 3), ("crop", 8, 0), (8, 1, 1)]
    for start, t, keep in steps:
        if start == "crop":
            for cache in (growing, static):
                for layer in cache.layers:
                    layer.crop(t - layer.length)
            continue
        a = lean(ids[:, start : start + t], growing, start, keep)
        b = lean(ids[:, start : start + t], static, start, keep)
        assert a.shape == b.shape == (1, keep, 96)
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-4)
        assert static.get_seq_length() == growing.get_seq_length() == start + t


def test_cropping_moves_the_length_and_copies_nothing(target) -> None:
    runner = ModelRunner(target, STATIC)
    assert isinstance(runner.cache, StaticKV) and runner.cache.window == 512
    runner.forward([3, 5, 7, 11, 13, 17])
    layer = runner.cache.layers[0]
    buffer, before = layer.k, layer.k.clone()
    runner.truncate(2)
    assert runner.cached_length() == 2 and runner.ids == [3, 5]
    assert layer.k is buffer and torch.equal(layer.k, before)  # the length moved, nothing else
    # What the crop left behind is never seen: the next pass equals one over a fresh cache.
    again = runner.forward([8, 9], logits_to_keep=2)
    fresh = ModelRunner(target, STATIC)
    torch.testing.assert_close(again, fresh.forward([3, 5, 8, 9], logits_to_keep=2), rtol=1e-5, atol=1e-4)


def test_the_mask_has_the_windows_shape_at_every_step() -> None:
    cache = StaticKV(1, 8)
    mask = cache.mask(torch.tensor([2, 3]))
    assert mask.shape == (2, 8)
    assert mask.tolist() == [[True] * 3 + [False] * 5, [True] * 4 + [False] * 4]
    assert cache.mask(torch.tensor([6])).shape == (1, 8)


@pytest.mark.parametrize("k", [1, 3, None])
def test_greedy_spec_with_rejections_equals_plain_on_the_static_cache(target, k) -> None:
    for quality, seed in ((0.05, 2), (0.4, 3)):
        for prompt in PROMPTS:
            growing = reply(SpecDecoder(target, CPU), prompt, max_new_tokens=30)
            plain = reply(SpecDecoder(target, STATIC), prompt, max_new_tokens=30)
            decoder = SpecDecoder(target, STATIC, ModelDrafter(noisy_copy(target, quality, seed=seed), STATIC))
            spec = reply(decoder, prompt, max_new_tokens=30, k=k)
            assert isinstance(decoder.target.cache, StaticKV)
            assert isinstance(decoder.drafter.runner.cache, StaticKV)  # type: ignore[union-attr]
            assert plain == growing and spec == plain


def test_ngram_drafts_and_a_second_chat_turn_on_the_static_cache(target) -> None:
    first, second = [1, 2, 3, 1, 2, 3, 1, 2], [4, 5, 4, 5]
    expected = SpecDecoder(target, CPU)
    got = SpecDecoder(target, STATIC, NgramDrafter())
    a1, b1 = reply(expected, first, max_new_tokens=20), reply(got, first, max_new_tokens=20)
    assert b1 == a1
    turn = first + a1 + second  # the second turn syncs the cache to the common prefix
    held = got.target.cache.layers[0].k
    assert reply(got, turn, max_new_tokens=20, k=4) == reply(expected, turn, max_new_tokens=20)
    assert got.target.cache.layers[0].k is held  # the same buffers across turns


def test_the_device_chooses_the_cache_and_the_cpu_keeps_the_growing_one(target, monkeypatch) -> None:
    assert isinstance(ModelRunner(target, CPU).cache, GrowingKV)
    assert not ModelRunner(target, CPU).static
    monkeypatch.setenv("SPECCHAT_STATIC_CACHE", "1")
    assert isinstance(ModelRunner(target, CPU).cache, StaticKV)
    monkeypatch.setenv("SPECCHAT_STATIC_CACHE", "0")
    assert isinstance(ModelRunner(target, Device(torch.device("cuda"))).cache, GrowingKV)  # built lazily: no card needed
    monkeypatch.delenv("SPECCHAT_STATIC_CACHE")
    assert Device(torch.device("cuda")).uses_static_cache() and not CPU.uses_static_cache()


def test_a_new_window_reallocates_the_static_cache_and_keeps_what_it_held(target) -> None:
    runner = ModelRunner(target, STATIC)
    runner.forward([3, 5, 7, 11])
    old = runner.cache
    runner.set_window(100)
    assert isinstance(runner.cache, StaticKV) and runner.cache is not old and runner.cache.window == 100
    assert runner.cached_length() == 4 and runner.ids == [3, 5, 7, 11]
    fresh = ModelRunner(target, STATIC)
    torch.testing.assert_close(runner.forward([13]), fresh.forward([3, 5, 7, 11, 13]), rtol=1e-5, atol=1e-4)


def test_a_static_cache_needs_a_window() -> None:
    with pytest.raises(ValueError, match="window of at least one token"):
        StaticKV(2, 0)


def test_a_pass_past_the_static_window_is_refused_before_any_kernel(target) -> None:
    from engine.errors import ContextLengthError

    runner = ModelRunner(target, STATIC, window=8)
    runner.forward([1, 2, 3, 4, 5, 6])
    with pytest.raises(ContextLengthError, match="do not fit the 8-token window"):
        runner.forward([7, 8, 9])
    assert runner.ids == [1, 2, 3, 4, 5, 6] and runner.cached_length() == 6  # nothing lost
    runner.forward([7, 8])  # the window's last two positions still take a pass
    assert runner.cached_length() == 8


def test_the_loaders_warm_up_pass_allocates_eight_tokens_not_the_window(target, monkeypatch) -> None:
    from engine.load.loader import _free_after_warm_up

    windows: list[int] = []
    real = StaticKV.allocate

    def spy(self: StaticKV, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        windows.append(self.window)
        return real(self, like)

    monkeypatch.setattr(StaticKV, "allocate", spy)
    assert _free_after_warm_up(target, STATIC, 2**40) is not None
    assert windows and set(windows) == {8}  # the model's own window is 512
