"""Chains of speculative rounds decided on the device (issue 35, item 3: one read-back for several
rounds), on the CPU over a static cache with captured passes (the stand-in backend) and eager:
the same reply as plain decoding, rounds counted as rounds, a stop token or the window ending
the reply with both caches cropped behind it, one transfer a chain, and the fallbacks (a draft
that fails, NaN logits) keeping the reply."""
from __future__ import annotations

import pytest
import torch

from engine.decode.chain import CHAIN_ROUNDS, ENV, chain_rounds, chained_rounds
from engine.decode.decoder import SpecDecoder
from engine.decode.drafters import ModelDrafter
from engine.decode.runner import ModelRunner
from engine.errors import NonFiniteLogitsError, SettingError
from engine.events import GenerationParams, SamplingParams
from engine.model.capture import RecordingBackend
from engine.model.device import Device
from tests.engine.decode.test_gpu_syncs import Transfers
from tests.engine.decode.test_plain_burst import reply
from tests.tiny import noisy_copy, tiny_llama

CPU = Device(torch.device("cpu"))
PROMPT = [3, 5, 7, 11, 13]


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_llama(seed=1)


@pytest.fixture(scope="module")
def draft(target) -> torch.nn.Module:
    return noisy_copy(target, 0.4, seed=3)  # accepts some drafts, rejects others


def static(graphs: bool) -> Device:
    return Device(torch.device("cpu"), static_cache=True, graphs=RecordingBackend() if graphs else None)


def chaining(target: torch.nn.Module, draft: torch.nn.Module, device: Device, rounds: int = 3,
             **kw: object) -> SpecDecoder:
    decoder = SpecDecoder(target, device, ModelDrafter(draft, device), **kw)  # type: ignore[arg-type]
    decoder.chain = rounds
    return decoder


def rounds_per_event(events: list[object]) -> list[int]:
    counts = [e.stats.rounds for e in events]  # type: ignore[attr-defined]
    return [b - a for a, b in zip([0, *counts], counts)]


def plain(target: torch.nn.Module, prompt: list[int], **kw: object) -> list[int]:
    return reply(SpecDecoder(target, CPU), prompt, **kw)[0]


def test_rounds_a_chain_queues_on_a_card_the_cpu_and_by_hand(monkeypatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert chain_rounds(True) == CHAIN_ROUNDS > 1 and chain_rounds(False) == 1
    monkeypatch.setenv(ENV, "0")
    assert chain_rounds(True) == 1
    monkeypatch.setenv(ENV, "6")
    assert chain_rounds(False) == 6
    monkeypatch.setenv(ENV, "many")
    with pytest.raises(SettingError, match="SPECCHAT_CHAIN"):
        chain_rounds(True)


@pytest.mark.parametrize("graphs", [True, False], ids=["captured", "eager"])
@pytest.mark.parametrize("k", [1, 3, None], ids=["K=1", "K=3", "adaptive"])
def test_a_chained_reply_is_the_plain_reply(target, draft, graphs, k) -> None:
    expected = plain(target, PROMPT, max_new_tokens=48)
    decoder = chaining(target, draft, static(graphs), rounds=3, calibrate_every=0)
    got, events = reply(decoder, PROMPT, max_new_tokens=48, k=k)
    assert got == expected
    stats = events[-1].stats
    assert 0 < stats.accepted < stats.proposed  # some drafts accepted, some not: both paths ran
    assert stats.rounds == stats.target_passes and stats.tokens == 48
    assert max(rounds_per_event(events)) == 3  # three rounds an event
    assert decoder.target.cached_length() == len(PROMPT) + 48 - 1
    assert decoder.target.ids == PROMPT + got[:-1]
    turn = PROMPT + got + [4, 9]  # the next turn starts from the caches the chains left
    assert reply(decoder, turn, max_new_tokens=20, k=k)[0] == plain(target, turn, max_new_tokens=20)


def test_a_chain_counts_each_round_and_sources_each_token(target, draft) -> None:
    decoder = chaining(target, draft, static(True), rounds=4, calibrate_every=0)
    seq = list(PROMPT)
    decoder.target.catch_up(seq)
    decoder.drafter.prefill(seq)  # type: ignore[union-attr]
    chain = chained_rounds(decoder.target, decoder.drafter, decoder.device, seq, 3, 4)  # type: ignore[arg-type]
    assert len(chain) == 4
    tokens = [t for r in chain for t in r.tokens]
    assert [len(r.tokens) for r in chain] == [r.accepted + 1 for r in chain]
    assert tokens == plain(target, PROMPT, max_new_tokens=len(tokens))
    assert decoder.target.ids == seq + tokens[:-1]  # the target: all but the last token
    assert decoder.drafter.runner.ids == (seq + tokens)[: len(seq) + len(tokens) - 2]  # type: ignore[union-attr]

    got, events = reply(chaining(target, draft, static(True), rounds=4, calibrate_every=0), PROMPT,
                        max_new_tokens=40, k=3)
    for event in events:
        assert len(event.sources) == len(event.token_ids)
    stats = events[-1].stats
    assert stats.accepted == sum(e.sources.count("draft") for e in events)
    assert stats.rounds == stats.target_passes


def test_a_stop_token_ends_a_chain_there_and_crops_both_caches(target, draft) -> None:
    expected = plain(target, PROMPT, max_new_tokens=40)
    stop = expected[6]
    cut = plain(target, PROMPT, max_new_tokens=40, stop_token_ids=(stop,))
    decoder = chaining(target, draft, static(True), rounds=4, calibrate_every=0)
    got, events = reply(decoder, PROMPT, max_new_tokens=40, k=3, stop_token_ids=(stop,))
    assert got == cut and got[-1] == stop and events[-1].finish_reason == "eos"
    assert decoder.target.ids == PROMPT + got[:-1]
    assert decoder.drafter.runner.ids == (PROMPT + got)[: len(decoder.drafter.runner.ids)]  # type: ignore[union-attr]
    turn = PROMPT + got + [8]
    assert reply(decoder, turn, max_new_tokens=12, k=3)[0] == plain(target, turn, max_new_tokens=12)


def test_a_chain_never_feeds_a_position_past_the_window(target, draft) -> None:
    window = len(PROMPT) + 13
    decoder = chaining(target, draft, static(True), rounds=4, calibrate_every=0, window=window)
    got, events = reply(decoder, PROMPT, max_new_tokens=50, k=3)
    assert len(got) == 13 and events[-1].finish_reason == "context"
    assert got == plain(target, PROMPT, max_new_tokens=13)


def test_a_chain_reads_back_once(target, draft, monkeypatch) -> None:
    decoder = chaining(target, draft, static(True), rounds=4, calibrate_every=0)
    steps = decoder.generate(PROMPT, GenerationParams(max_new_tokens=60, k=2))
    next(steps)  # the prefill and a first chain: every shape captured by now
    transfers = Transfers(monkeypatch)
    event = next(steps)
    monkeypatch.undo()
    assert event.stats.rounds == 8 and transfers.calls == ["tolist"]  # four rounds, one transfer


def test_only_greedy_replies_over_static_caches_chain(target, draft) -> None:
    growing = chaining(target, draft, CPU, rounds=4, calibrate_every=0)
    _, events = reply(growing, PROMPT, max_new_tokens=24, k=2)
    assert set(rounds_per_event(events)) == {1}  # a round an event
    sampled = chaining(target, draft, static(True), rounds=4, calibrate_every=0)
    _, events = reply(sampled, PROMPT, max_new_tokens=24, k=2, sampling=SamplingParams(temperature=0.8, seed=3))
    assert set(rounds_per_event(events)) == {1}


def test_a_draft_that_fails_inside_a_chain_is_dropped_and_the_reply_goes_on(target, draft, monkeypatch) -> None:
    expected = plain(target, PROMPT, max_new_tokens=30)
    decoder = chaining(target, draft, static(True), rounds=3, calibrate_every=0)
    real = ModelRunner.draft_at
    calls = [0]

    def failing(self: ModelRunner, *a: object, **kw: object) -> tuple[torch.Tensor, torch.Tensor]:
        calls[0] += 1
        if calls[0] == 5:  # inside the second chain
            raise torch.OutOfMemoryError("CUDA out of memory (test)")
        return real(self, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(ModelRunner, "draft_at", failing)
    got, events = reply(decoder, PROMPT, max_new_tokens=30, k=2)
    assert got == expected and calls[0] == 5
    assert decoder.drafter is None and any(e.notice and "draft dropped" in e.notice for e in events)


@pytest.mark.parametrize("graphs", [True, False], ids=["captured", "eager"])
def test_nan_logits_from_the_draft_in_a_chain_drop_it_and_from_the_target_raise(target, draft, graphs,
                                                                               monkeypatch) -> None:
    expected = plain(target, PROMPT, max_new_tokens=20)
    decoder = chaining(target, draft, static(graphs), rounds=3, calibrate_every=0)
    monkeypatch.setattr(ModelDrafter, "masked", lambda self, logits: torch.full_like(logits, float("nan")))
    got, events = reply(decoder, PROMPT, max_new_tokens=20, k=2)
    assert got == expected and decoder.drafter is None
    assert any(e.notice and "non-finite" in e.notice for e in events)

    monkeypatch.undo()
    decoder = chaining(target, draft, static(graphs), rounds=3, calibrate_every=0)
    real = ModelRunner.pass_at
    tgt = decoder.target

    def nan_target(self: ModelRunner, *a: object, **kw: object) -> torch.Tensor:
        out = real(self, *a, **kw)  # type: ignore[arg-type]
        return torch.full_like(out, float("nan")) if self is tgt else out

    monkeypatch.setattr(ModelRunner, "pass_at", nan_target)
    with pytest.raises(NonFiniteLogitsError):
        reply(decoder, PROMPT, max_new_tokens=20, k=2)
    assert tgt.ids == PROMPT[:-1]  # the chain left the target as it found it


def test_a_chained_round_replays_its_whole_draft_once_and_its_verification_once(target, draft) -> None:
    decoder = chaining(target, draft, static(True), rounds=4, calibrate_every=0)
    steps = decoder.generate(PROMPT, GenerationParams(max_new_tokens=60, k=3))
    next(steps)  # the first chain captures what it uses
    runner = decoder.drafter.runner  # type: ignore[union-attr]
    assert {key[3] for key in runner.capture._captured} == {3}  # the draft: its pass and 3 steps, one capture
    before = runner.capture.replays, decoder.target.capture.replays
    event = next(steps)
    assert event.stats.rounds == 8
    assert (runner.capture.replays - before[0], decoder.target.capture.replays - before[1]) == (4, 4)


def spy_on_queues(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Record, for every chain queued, whether it was queued behind another one."""
    import engine.decode.device_rounds as rounds_module

    behind: list[bool] = []
    real = rounds_module.queue_chain

    def spied(*a: object, after: object = None, **kw: object) -> object:
        behind.append(after is not None)
        return real(*a, after=after, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(rounds_module, "queue_chain", spied)
    return behind


@pytest.mark.parametrize("graphs", [True, False], ids=["captured", "eager"])
def test_the_next_chain_is_queued_behind_the_one_being_read_and_the_reply_is_the_same(target, draft, graphs,
                                                                                       monkeypatch) -> None:
    behind = spy_on_queues(monkeypatch)
    expected = plain(target, PROMPT, max_new_tokens=64)
    decoder = chaining(target, draft, static(graphs), rounds=3, calibrate_every=0)
    got, events = reply(decoder, PROMPT, max_new_tokens=64, k=2)
    assert got == expected
    assert behind[0] is False and behind.count(True) >= 3  # one chain from the host, then chains behind chains
    assert decoder.target.ids == PROMPT + got[:-1] and decoder._queued is None


def test_a_stop_token_drops_the_chain_queued_behind_and_the_next_turn_starts_clean(target, draft, monkeypatch) -> None:
    behind = spy_on_queues(monkeypatch)
    expected = plain(target, PROMPT, max_new_tokens=60)
    stop = expected[20]  # well past the first chain: chains are queued behind others by then
    cut = plain(target, PROMPT, max_new_tokens=60, stop_token_ids=(stop,))
    decoder = chaining(target, draft, static(True), rounds=3, calibrate_every=0)
    got, events = reply(decoder, PROMPT, max_new_tokens=60, k=2, stop_token_ids=(stop,))
    assert got == cut and events[-1].finish_reason == "eos" and True in behind
    assert decoder._queued is None and decoder.target.ids == PROMPT + got[:-1]
    turn = PROMPT + got + [8, 2]
    assert reply(decoder, turn, max_new_tokens=24, k=2)[0] == plain(target, turn, max_new_tokens=24)


def test_a_reply_left_with_a_chain_queued_leaves_the_next_one_right(target, draft) -> None:
    decoder = chaining(target, draft, static(True), rounds=3, calibrate_every=0)
    steps = decoder.generate(PROMPT, GenerationParams(max_new_tokens=60, k=2))
    first = next(steps)
    next(steps)
    assert decoder._queued is not None  # a chain waits on the device
    steps.close()  # the user moved on (Esc, a new message)
    turn = PROMPT + [9, 9, 4]
    assert reply(decoder, turn, max_new_tokens=30, k=2)[0] == plain(target, turn, max_new_tokens=30)
    assert first.token_ids


def test_calibration_interrupts_the_queue_and_the_reply_is_the_same(target, draft) -> None:
    expected = plain(target, PROMPT, max_new_tokens=80)
    decoder = chaining(target, draft, static(True), rounds=3, calibrate_every=4)
    decoder.burst = 4  # as on a card: calibration rounds are bursts
    got, events = reply(decoder, PROMPT, max_new_tokens=80)
    assert got == expected
    bursts = [e for e in events if len(e.token_ids) > 1 and set(e.sources) == {"target"}]
    assert bursts and events[-1].stats.proposed > 0


def test_a_lookup_copy_that_pays_interrupts_the_queue_and_the_reply_is_the_same(target, draft) -> None:
    from engine.decode.drafters import NgramDrafter

    prompt = [3, 5, 7, 11, 13, 17, 19, 23, 29, 31] * 4 + [3, 5]  # a copy the lookup finds
    expected = plain(target, prompt, max_new_tokens=60)
    device = static(True)
    decoder = SpecDecoder(target, device, ModelDrafter(draft, device, lookup=NgramDrafter()), calibrate_every=0)
    decoder.chain = 3
    got, events = reply(decoder, prompt, max_new_tokens=60)
    assert got == expected
    origins = {e.origin for e in events}
    assert "chat" in origins and "model" in origins  # lookup rounds and chains, in one reply
    assert any(len(rounds_per_event([a, b])) and b.stats.rounds - a.stats.rounds > 1  # type: ignore[attr-defined]
               for a, b in zip(events, events[1:]))


def test_a_chain_queued_behind_another_stops_short_of_the_window(target, draft, monkeypatch) -> None:
    behind = spy_on_queues(monkeypatch)
    window = len(PROMPT) + 40
    decoder = chaining(target, draft, static(True), rounds=3, calibrate_every=0, window=window)
    got, events = reply(decoder, PROMPT, max_new_tokens=200, k=2)
    assert True in behind and events[-1].finish_reason == "context"
    assert got == plain(target, PROMPT, max_new_tokens=40)


def test_a_decoder_without_a_window_chains_up_to_its_caches_end(target, draft) -> None:
    from engine.errors import ContextLengthError

    def until_full(decoder: SpecDecoder) -> list[int]:
        got: list[int] = []
        with pytest.raises(ContextLengthError):  # a budget past the model's positions, as a bench may ask
            for event in decoder.generate(PROMPT, GenerationParams(max_new_tokens=10_000, k=3)):
                got += event.token_ids
        return got

    unchained = until_full(chaining(target, draft, static(True), rounds=1, calibrate_every=0))
    room = SpecDecoder(target, static(True)).target.window - len(PROMPT)  # the model's own positions
    assert len(unchained) >= room - 3  # a round a read-back gets to the cache's end
    assert until_full(chaining(target, draft, static(True), rounds=4, calibrate_every=0)) == unchained


def test_nan_in_a_chain_read_from_the_queue_drops_the_draft_and_the_reply_goes_on(target, draft, monkeypatch) -> None:
    expected = plain(target, PROMPT, max_new_tokens=40)
    decoder = chaining(target, draft, static(True), rounds=3, calibrate_every=0)
    real = ModelDrafter.masked
    calls = [0]

    def later_nan(self: ModelDrafter, logits: torch.Tensor) -> torch.Tensor:
        calls[0] += 1  # each draft step; the second chain (queued behind the first) turns NaN
        return torch.full_like(logits, float("nan")) if calls[0] > 6 else real(self, logits)

    monkeypatch.setattr(ModelDrafter, "masked", later_nan)
    got, events = reply(decoder, PROMPT, max_new_tokens=40, k=2)
    assert got == expected and decoder.drafter is None
    assert any(e.notice and "non-finite" in e.notice for e in events)


def test_switching_speculation_off_with_a_chain_queued_reads_it_as_speculation(target, draft) -> None:
    expected = plain(target, PROMPT, max_new_tokens=60)
    decoder = chaining(target, draft, static(True), rounds=3, calibrate_every=0)
    steps = decoder.generate(PROMPT, GenerationParams(max_new_tokens=60, k=2))
    events = [next(steps)]
    assert decoder._queued is not None
    decoder.set_speculation(False)  # F5 while a chain waits on the device
    events += list(steps)
    assert [t for e in events for t in e.token_ids] == expected
    queued_read = events[1]
    assert queued_read.origin == "model" and queued_read.stats.proposed > events[0].stats.proposed
    spec_tokens = dict(queued_read.stats.mode_tokens).get("spec", 0)
    assert spec_tokens == len(events[0].token_ids) + len(queued_read.token_ids)  # counted as the speculation it was
    assert all(set(e.sources) == {"target"} for e in events[2:])  # plain from then on
    assert events[-1].stats.mode == "plain" and decoder._queued is None


def test_a_chain_is_one_decision_of_the_schedule_and_the_cpu_counts_every_round(target, draft) -> None:
    """Explore and refresh keep their rhythm (every 3rd and 6th decision) when rounds come in chains:
    a chain's K is one choice. On the CPU, a round a read-back, decisions are rounds as before."""
    cpu = SpecDecoder(target, CPU, ModelDrafter(draft, CPU))
    reply(cpu, PROMPT, max_new_tokens=60)
    assert cpu.costs.decisions == cpu.costs.passes.passes > 20

    decoder = chaining(target, draft, static(True), rounds=8, calibrate_every=0, auto_off_window=0)
    refreshes: list[bool] = []
    real = decoder.schedule.refresh
    decoder.schedule.refresh = lambda: refreshes.append(real()) or refreshes[-1]  # type: ignore[method-assign]
    _, events = reply(decoder, PROMPT, max_new_tokens=300)
    assert decoder.costs.decisions == len(events) < decoder.costs.passes.passes  # an event: one choice
    assert any(refreshes)  # a refresh comes round when chains move the passes eight at a time
