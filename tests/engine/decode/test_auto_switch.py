"""Speculation switches itself off only on strong evidence, and tries again later."""
from __future__ import annotations


import pytest
import torch

from engine.decode.decoder import SpecDecoder
from engine.model.device import Device
from engine.decode.drafters import ModelDrafter
from engine.events import NOT_PAYING, TOO_SHORT, GenerationParams
from engine.decode.auto_switch import AutoSwitch
from tests.tiny import SlowDraft, tiny_llama

CPU = Device(torch.device("cpu"))
PROMPT = [3, 5, 7, 11, 13]
SLOW = [(1, 2.0)]  # a round worth 2 plain tokens that emitted 1: 0.5x


def test_a_full_window_of_consistent_evidence_switches_off() -> None:
    switch = AutoSwitch(window=8)
    assert all(switch.observe(1, 2.0) is None for _ in range(7))
    reason = switch.observe(1, 2.0)
    assert reason is not None and "0.50× over the last 8 rounds" in reason and switch.off


def test_noisy_or_marginal_evidence_does_not_switch_off() -> None:
    noisy = AutoSwitch(window=8)
    assert all(noisy.observe(e, c) is None for e, c in [(4, 2.0), (1, 6.0)] * 8)  # 0.62x, but all over the place
    marginal = AutoSwitch(window=8)
    assert all(marginal.observe(97, 100.0) is None for _ in range(20))  # 0.97x: inside the margin
    assert not noisy.off and not marginal.off
    assert AutoSwitch(window=8).observe(1, None) is None  # no sound estimate: no evidence


def test_the_window_starts_empty_with_every_reply() -> None:
    switch = AutoSwitch(window=8)
    for _ in range(7):
        switch.observe(1, 2.0)
    switch.new_reply()
    assert all(switch.observe(1, 2.0) is None for _ in range(7))


def test_reprobe_after_plain_rounds_with_backoff_counted_across_replies() -> None:
    switch = AutoSwitch(window=4, reprobe_after=3)
    for _ in range(4):
        switch.observe(1, 2.0)
    assert switch.off
    assert switch.plain_round() is None and switch.plain_round() is None
    assert switch.plain_round() == 3 and not switch.off
    for _ in range(4):
        switch.observe(1, 2.0)
    assert switch.off and switch.reprobe_after == 6  # the next wait is longer
    switch.new_reply()
    assert switch.off  # a new reply does not lift it: the plain rounds go on counting
    assert [switch.plain_round() for _ in range(6)] == [None] * 5 + [6] and not switch.off
    switch.reset()
    assert switch.reprobe_after == 3  # a switch by hand forgets the backoff


def test_forced_on_ignores_the_evidence_until_the_next_switch_by_hand() -> None:
    switch = AutoSwitch(window=4)
    switch.reset(forced=True)
    assert all(switch.observe(1, 2.0) is None for _ in range(20)) and not switch.off
    switch.reset()
    assert [switch.observe(1, 2.0) for _ in range(4)][-1] is not None and switch.off


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_llama(seed=1)


def slow_decoder(target: torch.nn.Module, window: int, reprobe_after: int = 64) -> SpecDecoder:
    draft = ModelDrafter(SlowDraft(tiny_llama(seed=99), delay_s=0.01), CPU)
    return SpecDecoder(target, CPU, draft, calibrate_every=4, auto_off_window=window, reprobe_after=reprobe_after)


def reply(decoder: SpecDecoder, n: int, k: int | None = None) -> list:
    return list(decoder.generate(PROMPT, GenerationParams(max_new_tokens=n, k=k)))


def test_short_replies_never_add_up_to_a_switch_off(target) -> None:
    decoder = slow_decoder(target, window=10)
    reply(decoder, 30, k=2)  # fixed K: measures costs, never switched off
    for _ in range(3):  # 3 replies of at most 8 rounds: 24 slow rounds, never 10 in one reply
        events = reply(decoder, 8)
        assert not any(e.notice for e in events) and decoder.mode == "spec"
        # 8 tokens are below the evidence floor: no speedup is shown for such a reply
        assert events[-1].stats.speedup is None and events[-1].stats.speedup_note == TOO_SHORT
    events = reply(decoder, 40)  # the same evidence within one reply is enough
    assert decoder.mode == "plain" and decoder.off_reason == NOT_PAYING
    assert not any(e.notice for e in events)  # quietly: the stats say it, no notice
    assert events[-1].stats.speculation_off_reason == NOT_PAYING
    assert "standard errors" in (events[-1].stats.speculation_off_detail or "")


def test_reprobed_in_the_same_reply_and_at_the_next_one(target) -> None:
    decoder = slow_decoder(target, window=6, reprobe_after=5)
    plain_ids = [t for e in list(SpecDecoder(target, CPU).generate(PROMPT, GenerationParams(max_new_tokens=60)))
                 for t in e.token_ids]
    events = reply(decoder, 60)
    assert [t for e in events for t in e.token_ids] == plain_ids  # switching loses nothing
    assert not any(e.notice for e in events)
    reasons = [e.stats.speculation_off_reason for e in events]
    off = reasons.index(NOT_PAYING)
    assert None in reasons[off:]  # switched off, then back on for a re-probe, all quietly
    modes = dict(events[-1].stats.mode_tokens)
    assert modes["spec"] > 0 and modes["plain"] > 0 and sum(modes.values()) == 60


def test_a_switch_off_outlives_the_reply_and_f5_then_forces_it_on(target) -> None:
    decoder = slow_decoder(target, window=6, reprobe_after=1000)
    reply(decoder, 40)
    assert decoder.mode == "plain" and decoder.off_reason == NOT_PAYING
    first = reply(decoder, 3)[0]
    assert first.stats.mode_tokens[0][0] == "plain"  # the next reply does not pay for a re-probe
    assert first.stats.speculation_off_reason == NOT_PAYING
    decoder.set_speculation(True)  # by hand, over the automatic switch-off: forced on
    events = reply(decoder, 40)
    assert decoder.mode == "spec" and dict(events[-1].stats.mode_tokens) == {"spec": 40}
    decoder.set_speculation(False)
    decoder.set_speculation(True)  # on by hand from off by hand: the evidence counts again
    reply(decoder, 40)
    assert decoder.mode == "plain" and decoder.off_reason == NOT_PAYING
