"""The one owner of a KV cache (engine.decode.runner): sync, catch up, truncate, and the invariant."""
from __future__ import annotations

import torch

from engine.model.device import Device
from engine.decode.runner import ModelRunner
from tests.tiny import tiny_llama

CPU = Device(torch.device("cpu"))


def runner() -> ModelRunner:
    return ModelRunner(tiny_llama(seed=3), CPU)


def test_catch_up_feeds_all_but_the_last_token_and_keeps_what_is_shared() -> None:
    r = runner()
    r.catch_up([5, 6, 7, 8])
    assert r.ids == [5, 6, 7] and r.cached_length() == 3
    r.catch_up([5, 6, 9, 10, 11])  # diverges after two tokens: cropped there, the rest fed
    assert r.ids == [5, 6, 9, 10] and r.cached_length() == 4


def test_sync_keeps_the_common_prefix_and_leaves_room_for_the_callers_pass() -> None:
    r = runner()
    r.prefill([1, 2, 3, 4])
    assert r.sync([1, 2, 3, 4], leave=1) == 3 and r.ids == [1, 2, 3]
    assert r.sync([1, 2, 9]) == 2 and r.cached_length() == 2


def test_a_cached_prefix_gives_the_logits_a_fresh_pass_gives() -> None:
    """Up to float rounding: fp32 matrix products over 4 rows and over 1 are not bit-equal."""
    fresh = runner().forward([4, 5, 6, 7], logits_to_keep=1)
    r = runner()
    r.catch_up([4, 5, 6, 7])
    cached = r.forward([7], logits_to_keep=1)
    assert torch.allclose(cached, fresh, atol=1e-4) and int(cached.argmax()) == int(fresh.argmax())


def test_truncate_refuses_a_negative_length() -> None:
    r = runner()
    r.prefill([1, 2])
    try:
        r.truncate(-1)
    except ValueError as exc:
        assert "cannot keep -1" in str(exc)
    else:
        raise AssertionError("truncate(-1) was accepted")
    r.truncate(0)
    assert r.ids == [] and r.cached_length() == 0
