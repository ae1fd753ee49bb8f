"""The draft-verify loop: greedy output identical to plain decoding, caches
consistent after every round, stops, cancellation, chat-turn reuse."""
from __future__ import annotations

import threading

import pytest
import torch

from engine.decode.decoder import SpecDecoder
from engine.model.device import Device
from engine.decode.drafters import ModelDrafter, NgramDrafter
from engine.events import GenerationParams, SamplingParams
from tests.tiny import noisy_copy, tiny_llama

CPU = Device(torch.device("cpu"))
PROMPTS = [[3, 5, 7, 11, 13], [1, 2, 3, 1, 2, 3, 1, 2], [42], [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 9, 8]]


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_llama(seed=1)


@pytest.fixture(scope="module")
def drafts(target: torch.nn.Module) -> dict[str, torch.nn.Module]:
    return {
        "same": noisy_copy(target, 0.0, seed=0),
        "close": noisy_copy(target, 0.05, seed=2),
        "noisy": noisy_copy(target, 0.4, seed=3),
        "unrelated": tiny_llama(seed=99),
    }


def decode(decoder: SpecDecoder, prompt: list[int], params: GenerationParams) -> tuple[list[int], list]:
    """Run a reply, checking the cache invariants after every round."""
    out: list[int] = []
    events = []
    proposed_before = 0
    for event in decoder.generate(prompt, params):
        out += event.token_ids
        events.append(event)
        seq = prompt + out
        assert decoder.target.ids == seq[:-1]
        assert decoder.target.cached_length() == len(seq) - 1
        drafter = decoder.drafter
        if isinstance(drafter, ModelDrafter) and drafter.runner.ids:
            # The draft cache holds a prefix of the sequence; after a round that
            # drafted, it is at most two tokens behind (the last draft token and
            # the target's bonus when all K were accepted).
            assert drafter.runner.ids == seq[: len(drafter.runner.ids)]
            assert drafter.runner.cached_length() == len(drafter.runner.ids)
            if event.stats.proposed > proposed_before and drafter.lookup is None:  # a lookup's round leaves it behind
                assert len(seq) - len(drafter.runner.ids) <= 2
        proposed_before = event.stats.proposed
    return out, events


def plain(target: torch.nn.Module, prompt: list[int], **kw: object) -> list[int]:
    return decode(SpecDecoder(target, CPU), prompt, GenerationParams(**kw))[0]


@pytest.mark.parametrize("quality", ["same", "close", "noisy", "unrelated"])
@pytest.mark.parametrize("k", [1, 2, 3, 5, 8, None])
def test_greedy_spec_equals_plain(target, drafts, quality, k) -> None:
    for prompt in PROMPTS:
        expected = plain(target, prompt, max_new_tokens=30)
        decoder = SpecDecoder(target, CPU, ModelDrafter(drafts[quality], CPU), calibrate_every=7)
        got, events = decode(decoder, prompt, GenerationParams(max_new_tokens=30, k=k))
        assert got == expected
        assert events[-1].finish_reason == "length"


@pytest.mark.parametrize("k", [1, 4, None])
def test_greedy_ngram_equals_plain(target, k) -> None:
    for prompt in PROMPTS:
        expected = plain(target, prompt, max_new_tokens=40)
        got, _ = decode(SpecDecoder(target, CPU, NgramDrafter()), prompt, GenerationParams(max_new_tokens=40, k=k))
        assert got == expected


def test_same_weights_draft_is_always_accepted(target, drafts) -> None:
    decoder = SpecDecoder(target, CPU, ModelDrafter(drafts["same"], CPU), calibrate_every=0)
    _, events = decode(decoder, PROMPTS[0], GenerationParams(max_new_tokens=25, k=4))
    stats = events[-1].stats
    assert stats.alpha == 1.0
    assert stats.tau == pytest.approx(5.0)  # K accepted + the target's bonus token, every pass
    assert stats.per_position == (1.0, 1.0, 1.0, 1.0)
    # Every round: four draft tokens, then one of the target's own.
    assert events[0].sources == ("draft",) * 4 + ("target",)


def test_eos_inside_a_draft(target, drafts) -> None:
    prompt = PROMPTS[0]
    reference = plain(target, prompt, max_new_tokens=30)
    eos = reference[9]
    cut = reference[: reference.index(eos) + 1]
    for quality in ("same", "close"):
        decoder = SpecDecoder(target, CPU, ModelDrafter(drafts[quality], CPU), calibrate_every=0)
        got, events = decode(decoder, prompt, GenerationParams(max_new_tokens=30, k=6, stop_token_ids=(eos,)))
        assert got == cut
        assert events[-1].finish_reason == "eos"
    assert plain(target, prompt, max_new_tokens=30, stop_token_ids=(eos,)) == cut


@pytest.mark.parametrize("max_new", [1, 2, 3, 4, 5, 6, 9])
def test_max_tokens_inside_a_draft(target, drafts, max_new) -> None:
    decoder = SpecDecoder(target, CPU, ModelDrafter(drafts["same"], CPU), calibrate_every=0)
    got, events = decode(decoder, PROMPTS[1], GenerationParams(max_new_tokens=max_new, k=4))
    assert got == plain(target, PROMPTS[1], max_new_tokens=max_new)
    assert len(got) == max_new
    assert events[-1].finish_reason == "length"


def test_follow_up_turn_reuses_the_cached_prefix(target, drafts) -> None:
    decoder = SpecDecoder(target, CPU, ModelDrafter(drafts["close"], CPU))
    first, _ = decode(decoder, PROMPTS[0], GenerationParams(max_new_tokens=12, k=3))
    second_prompt = PROMPTS[0] + first + [17, 19, 23]
    fed: list[int] = []
    original = decoder.target.forward

    def counting_forward(ids, logits_to_keep=1):  # type: ignore[no-untyped-def]
        fed.append(len(ids))
        return original(ids, logits_to_keep)

    decoder.target.forward = counting_forward  # type: ignore[method-assign]
    second, _ = decode(decoder, second_prompt, GenerationParams(max_new_tokens=12, k=3))
    # The prefill read only the new user tokens (the cache already held the rest).
    assert fed[0] == 3
    assert second == plain(target, second_prompt, max_new_tokens=12)


def test_a_diverging_next_turn_crops_to_the_common_prefix(target, drafts) -> None:
    decoder = SpecDecoder(target, CPU, ModelDrafter(drafts["close"], CPU))
    decode(decoder, PROMPTS[3], GenerationParams(max_new_tokens=10, k=3))
    edited = PROMPTS[3][:5] + [1, 1, 1]
    got, _ = decode(decoder, edited, GenerationParams(max_new_tokens=10, k=3))
    assert got == plain(target, edited, max_new_tokens=10)


def test_cancel_between_rounds_keeps_the_engine_ready(target, drafts) -> None:
    decoder = SpecDecoder(target, CPU, ModelDrafter(drafts["close"], CPU))
    cancel = threading.Event()
    out: list[int] = []
    events = []
    for event in decoder.generate(PROMPTS[0], GenerationParams(max_new_tokens=40, k=3), cancel):
        out += event.token_ids
        events.append(event)
        if len(events) == 2:
            cancel.set()
    assert events[-1].finish_reason == "cancelled"
    assert events[-1].token_ids == ()
    assert out == plain(target, PROMPTS[0], max_new_tokens=40)[: len(out)]
    assert decoder.target.ids == (PROMPTS[0] + out)[:-1]
    follow = PROMPTS[0] + out + [5]
    assert decode(decoder, follow, GenerationParams(max_new_tokens=8, k=3))[0] == plain(target, follow, max_new_tokens=8)



def tokens(events: object) -> list[int]:
    return [t for e in events for t in e.token_ids]  # type: ignore[attr-defined]


def test_esc_during_a_long_prompt_stops_the_reading_within_a_piece(target) -> None:
    """A prompt the cache cannot reuse is read in pieces of PREFILL_PIECE tokens with the cancel
    flag looked at between them (Esc took 1.2-3.7 s in the app once a conversation passed the
    window and its whole prompt was read again): the reply ends cancelled at once, the cache
    keeps what was read, and the next reply reuses it."""
    from engine.decode.runner import PREFILL_PIECE

    prompt = [(7 * i) % 90 + 3 for i in range(300)]
    decoder = SpecDecoder(target, CPU)
    cancel = threading.Event()
    pieces: list[int] = []
    real = decoder.target.prefill

    def reading(ids: list[int]) -> None:
        pieces.append(len(ids))
        real(ids)
        if len(pieces) == 2:
            cancel.set()  # Esc while the second piece is read

    decoder.target.prefill = reading  # type: ignore[method-assign]
    events = list(decoder.generate(prompt, GenerationParams(max_new_tokens=10), cancel))
    assert [e.finish_reason for e in events] == ["cancelled"] and events[0].token_ids == ()
    assert pieces == [PREFILL_PIECE, PREFILL_PIECE] and decoder.target.ids == prompt[: 2 * PREFILL_PIECE]
    got = tokens(decoder.generate(prompt, GenerationParams(max_new_tokens=10)))
    rest = len(prompt) - 1 - 2 * PREFILL_PIECE  # no cancel flag this time: the same pieces all the same
    assert pieces[2:] == [PREFILL_PIECE] * (rest // PREFILL_PIECE) + [rest % PREFILL_PIECE]
    assert got == tokens(SpecDecoder(target, CPU).generate(prompt, GenerationParams(max_new_tokens=10)))
    pieced = SpecDecoder(target, CPU).generate(prompt, GenerationParams(max_new_tokens=10), threading.Event())
    assert tokens(pieced) == got  # read in pieces, the same reply


def test_plain_mode_is_k_zero_through_the_same_loop(target) -> None:
    _, events = decode(SpecDecoder(target, CPU), PROMPTS[0], GenerationParams(max_new_tokens=10))
    stats = events[-1].stats
    assert stats.mode == "plain"
    assert stats.proposed == 0 and stats.alpha is None
    assert stats.tau == 1.0 and stats.target_passes == 10
    assert stats.k == 0 and not stats.adaptive  # no K schedule ran (generate --json said "adaptive": true)
    assert all(e.sources == ("target",) for e in events)
    assert stats.speedup is None and stats.speedup_note == "decoded plainly"  # nothing to show "× vs plain"
    assert stats.plain_tokens_per_s is not None


def test_stats_are_consistent(target, drafts) -> None:
    decoder = SpecDecoder(target, CPU, ModelDrafter(drafts["noisy"], CPU), calibrate_every=5)
    out, events = decode(decoder, PROMPTS[0], GenerationParams(max_new_tokens=40, k=3))
    s = events[-1].stats
    assert s.tokens == len(out) == 40
    assert s.accepted == sum(1 for e in events for src in e.sources if src == "draft")
    assert s.alpha == pytest.approx(s.accepted / s.proposed)
    assert s.tau == pytest.approx(s.tokens / s.target_passes)
    assert s.mode == "spec" and s.k == 3 and not s.adaptive
    assert s.tokens_per_s and s.plain_tokens_per_s and s.speedup == pytest.approx(s.tokens_per_s / s.plain_tokens_per_s)
    assert s.draft_s > 0 and s.verify_s > 0 and s.elapsed_s >= s.draft_s + s.verify_s
    # Every drafted round was the model's (the calibration rounds proposed nothing).
    assert [(o.origin, o.proposed, o.accepted) for o in s.by_origin] == [("model", s.proposed, s.accepted)]
    assert {e.origin for e in events if e.stats.proposed} <= {"model", None}
    assert all(e.origin == "model" for e in events if "draft" in e.sources)


@pytest.mark.parametrize("quality", ["unrelated", "close"])
def test_a_lookup_first_copies_when_it_pays_and_stays_exact(target, drafts, quality) -> None:
    """A model drafter with a lookup: rounds where the conversation's copy is expected to pay
    more than the model's draft take the copy; every output is still plain decoding's."""
    copied = 0
    for prompt in PROMPTS:
        expected = plain(target, prompt, max_new_tokens=60)
        drafter = ModelDrafter(drafts[quality], CPU, lookup=NgramDrafter())
        decoder = SpecDecoder(target, CPU, drafter, calibrate_every=7)
        got, events = decode(decoder, prompt, GenerationParams(max_new_tokens=60))
        assert got == expected
        copied += sum(decoder.costs.positions[key].reached[0] for key in decoder.costs.positions if key != 0)
        by_origin = {o.origin: o.rounds for o in events[-1].stats.by_origin}  # the copies' rounds
        assert by_origin.get("chat", 0) == sum(decoder.costs.positions[key].reached[0]
                                               for key in decoder.costs.positions if key != 0)
        assert drafter.runner.ids == (prompt + got)[: len(drafter.runner.ids)]  # behind, never wrong
    assert copied > 0  # the tiny target repeats itself: some rounds were copies


def test_a_lookup_first_keeps_seeded_sampling_drafter_invariant(target, drafts) -> None:
    sampling = SamplingParams(temperature=0.8, seed=3)
    for prompt in PROMPTS:
        expected = plain(target, prompt, max_new_tokens=40, sampling=sampling)
        drafter = ModelDrafter(drafts["close"], CPU, lookup=NgramDrafter())
        got, _ = decode(SpecDecoder(target, CPU, drafter), prompt, GenerationParams(max_new_tokens=40, sampling=sampling))
        assert got == expected


def test_a_fixed_k_never_asks_the_lookup(target, drafts) -> None:
    lookup = NgramDrafter()
    calls: list[int] = []
    real = lookup.propose
    lookup.propose = lambda *a, **kw: calls.append(1) or real(*a, **kw)  # type: ignore[method-assign]
    decoder = SpecDecoder(target, CPU, ModelDrafter(drafts["close"], CPU, lookup=lookup))
    decode(decoder, PROMPTS[1], GenerationParams(max_new_tokens=20, k=3))
    assert calls == []


@pytest.mark.parametrize("ids, bad", [([1, 2, 10**6], "1000000"), ([1, -1], "-1"), ([1.5, 2.7], "1.5"),
                                      ([True, 2], "True")])
def test_prompt_ids_that_are_no_token_of_the_model_are_refused_by_name(ids: list[object], bad: str) -> None:
    """An id past the vocabulary raised a bare IndexError in the embedding; floats were read as ints."""
    decoder = SpecDecoder(tiny_llama(0), CPU)
    with pytest.raises(ValueError, match=rf"prompt token id {bad} is not a token of this model"):
        next(decoder.generate(ids, GenerationParams(max_new_tokens=2)))  # type: ignore[arg-type]


def test_a_seed_must_be_a_whole_number_in_range() -> None:
    for bad in (1.5, -3, 2**63):
        with pytest.raises(ValueError, match=rf"seed must be a whole number from 0 to {2**63 - 1} or None, got {bad}"):
            SamplingParams(seed=bad)  # type: ignore[arg-type]
    assert SamplingParams(seed=2**63 - 1).seed == 2**63 - 1


def test_a_draft_model_reading_a_prompt_stops_once_the_reply_is_cancelled() -> None:
    """It read the whole prompt regardless (a 4,096-token context: tens of seconds on a CPU), so the
    engine's child could be ended as hung after Esc (engine.child.backend.STOP_WAIT_S)."""
    target = tiny_llama(0)
    drafter = ModelDrafter(noisy_copy(target, 0.05, seed=1), CPU)
    cancel = threading.Event()
    cancel.set()
    drafter.prefill(list(range(1, 90)), cancel)
    assert len(drafter.runner) == 0
    drafter.prefill(list(range(1, 90)))
    assert len(drafter.runner) == 88
