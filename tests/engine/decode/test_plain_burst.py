"""Plain greedy decoding in bursts (issue 35, item 3: no host sync per token): on a card, a plain
round runs several one-token steps whose picks feed the next step on the device and come back
in one transfer. Checked on the CPU with the burst forced on: the same tokens as one step a
round, a stop token or the window ending the reply where it stands with the cache cropped
behind it, one read-back a burst, and the tally counting a pass a token."""
from __future__ import annotations

import pytest
import torch

from engine.decode.decoder import BURST, SpecDecoder
from engine.decode.drafters import ModelDrafter, NgramDrafter
from engine.events import GenerationParams, SamplingParams
from engine.model.capture import RecordingBackend
from engine.model.device import Device
from tests.engine.decode.test_gpu_syncs import Transfers
from tests.tiny import noisy_copy, tiny_llama

CPU = Device(torch.device("cpu"))
PROMPT = [3, 5, 7, 11, 13]


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_llama(seed=1)


def reply(decoder: SpecDecoder, prompt: list[int], **kw: object) -> tuple[list[int], list[object]]:
    out: list[int] = []
    events = []
    for event in decoder.generate(prompt, GenerationParams(**kw)):
        out += event.token_ids
        events.append(event)
    return out, events


def bursting(target: torch.nn.Module, device: Device = CPU, burst: int = 4, **kw: object) -> SpecDecoder:
    decoder = SpecDecoder(target, device, **kw)  # type: ignore[arg-type]
    decoder.burst = burst
    return decoder


def test_a_card_bursts_and_the_cpu_does_not(target) -> None:
    assert SpecDecoder(target, CPU).burst == 1
    assert BURST > 1


@pytest.mark.parametrize("device", [CPU, Device(torch.device("cpu"), static_cache=True, graphs=RecordingBackend())],
                         ids=["growing cache", "captured static cache"])
def test_bursts_give_the_tokens_of_one_step_a_round(target, device) -> None:
    expected, _ = reply(SpecDecoder(target, CPU), PROMPT, max_new_tokens=30)
    decoder = bursting(target, device, burst=4)
    got, events = reply(decoder, PROMPT, max_new_tokens=30)
    assert got == expected
    assert [len(e.token_ids) for e in events] == [4] * 7 + [2]  # the last burst is cut to the budget
    stats = events[-1].stats
    assert stats.target_passes == 30 and stats.tau == 1.0 and stats.mode == "plain"
    assert decoder.target.cached_length() == len(PROMPT) + 30 - 1  # all but the last token
    turn = PROMPT + got + [4, 9]  # the next turn reuses the cache the bursts left
    assert reply(decoder, turn, max_new_tokens=9)[0] == reply(SpecDecoder(target, CPU), turn, max_new_tokens=9)[0]


def test_a_stop_token_inside_a_burst_ends_the_reply_there_and_crops_the_steps_after_it(target) -> None:
    plain, _ = reply(SpecDecoder(target, CPU), PROMPT, max_new_tokens=30)
    stop = plain[5]  # the sixth token: inside the second burst of four
    expected, _ = reply(SpecDecoder(target, CPU), PROMPT, max_new_tokens=30, stop_token_ids=(stop,))
    decoder = bursting(target, burst=4)
    got, events = reply(decoder, PROMPT, max_new_tokens=30, stop_token_ids=(stop,))
    assert got == expected and got[-1] == stop and events[-1].finish_reason == "eos"
    assert decoder.target.ids == PROMPT + got[:-1]  # the steps past the stop token are gone
    turn = PROMPT + got + [8]
    assert reply(decoder, turn, max_new_tokens=6)[0] == reply(SpecDecoder(target, CPU), turn, max_new_tokens=6)[0]


def test_a_burst_never_feeds_a_position_past_the_window(target) -> None:
    decoder = bursting(target, burst=8, window=len(PROMPT) + 6)
    got, events = reply(decoder, PROMPT, max_new_tokens=50)
    assert len(got) == 6 and events[-1].finish_reason == "context"
    assert got == reply(SpecDecoder(target, CPU), PROMPT, max_new_tokens=6)[0]


def test_a_burst_reads_back_once(target, monkeypatch) -> None:
    decoder = bursting(target, burst=6)
    steps = decoder.generate(PROMPT, GenerationParams(max_new_tokens=24))
    next(steps)  # the prefill and a first burst
    transfers = Transfers(monkeypatch)
    event = next(steps)
    monkeypatch.undo()
    assert len(event.token_ids) == 6 and transfers.calls == ["tolist"]  # six steps, one transfer


def test_speculation_keeps_its_rounds(target) -> None:
    decoder = bursting(target, burst=4, drafter=NgramDrafter())
    _, events = reply(decoder, [1, 2, 3, 1, 2, 3, 1, 2], max_new_tokens=12)
    stats = events[-1].stats
    bursts = [e for e in events if len(e.token_ids) > 1 and set(e.sources) == {"target"}]
    assert stats.mode == "ngram" and bursts  # the plain step calibrated by bursts
    assert stats.rounds == sum(len(e.token_ids) if e in bursts else 1 for e in events)  # a round a pass


def test_speculation_calibrates_the_plain_step_with_bursts(target) -> None:
    """While speculating on a card, the plain step the speedup divides by is a burst's: the
    calibration round is a burst (its tokens from the target, none drafted), the mode stays
    speculative, and the reply is still plain decoding's."""
    expected, _ = reply(SpecDecoder(target, CPU), PROMPT, max_new_tokens=60)
    decoder = bursting(target, burst=4, drafter=ModelDrafter(noisy_copy(target, 0.4, seed=3), CPU), calibrate_every=5,
                       auto_off_window=0)
    got, events = reply(decoder, PROMPT, max_new_tokens=60)
    assert got == expected
    calibrations = [e for e in events if e.sources and set(e.sources) == {"target"} and len(e.token_ids) > 1]
    assert calibrations, "no calibration burst"
    assert all(e.stats.mode == "spec" for e in calibrations)
    assert any(e.stats.proposed > 0 for e in events)  # it did speculate between them
    assert decoder.costs.passes.plain_samples >= 4  # a burst's steps, each one plain sample
    assert events[-1].stats.target_passes == sum(1 if "draft" in e.sources or len(e.token_ids) == 1 else len(e.token_ids)
                                                 for e in events)


def test_with_bursts_a_lookup_miss_is_not_a_sample_of_the_plain_step(target) -> None:
    """On a card a miss of the n-gram lookup is one synchronised step, dearer than a step of
    bursted plain decoding: the plain step the speedup divides by comes from bursts only."""
    decoder = bursting(target, burst=4, drafter=NgramDrafter(), calibrate_every=6, auto_off_window=0)
    got, events = reply(decoder, PROMPT, max_new_tokens=48)
    assert got == reply(SpecDecoder(target, CPU), PROMPT, max_new_tokens=48)[0]
    steps = list(zip([None, *events], events))
    bursts = [e for before, e in steps if e.stats.plain_rounds > (before.stats.plain_rounds if before else 0)]
    misses = [e for before, e in steps if before is not None and len(e.token_ids) == 1
              and (e.stats.proposed, e.stats.plain_rounds) == (before.stats.proposed, before.stats.plain_rounds)]
    assert bursts and misses  # calibration bursts (the last may hold one token), and lookup misses between them
    assert decoder.costs.passes.plain_samples == sum(len(e.token_ids) for e in bursts)
    cpu = SpecDecoder(target, CPU, NgramDrafter(), calibrate_every=6, auto_off_window=0)
    _, events = reply(cpu, PROMPT, max_new_tokens=48)
    proposed = [e.stats.proposed for e in events]
    misses = sum(1 for before, after in zip([0, *proposed], proposed) if after == before)
    assert 0 < misses < len(events)
    assert cpu.costs.passes.plain_samples == misses  # one step a round: every miss is the plain step


def test_a_calibration_burst_is_one_round_of_the_switchs_evidence(target, monkeypatch) -> None:
    """The automatic switch-off weighs rounds: a calibration burst of n plain tokens is one round
    that emitted n, not n rounds at 1.0× that would dilute the evidence of the rounds around it."""
    decoder = bursting(target, burst=4, drafter=ModelDrafter(noisy_copy(target, 0.4, seed=3), CPU), calibrate_every=5,
                       auto_off_window=1000)  # never switched off: plain mode's steps are a verdict each
    verdicts: list[tuple[str, int]] = []
    real = decoder.schedule.verdict

    def verdict(params, round_mode, emitted, plain_equivalent):  # type: ignore[no-untyped-def]
        verdicts.append((round_mode, emitted))
        return real(params, round_mode, emitted, plain_equivalent)

    monkeypatch.setattr(decoder.schedule, "verdict", verdict)
    _, events = reply(decoder, PROMPT, max_new_tokens=60)
    assert len(verdicts) == len(events)  # one verdict a round, bursts included
    calibrations = [len(e.token_ids) for e in events if len(e.token_ids) > 1 and set(e.sources) == {"target"}]
    assert calibrations and any(mode == "spec" and n in calibrations for mode, n in verdicts if n > 1)


@pytest.mark.parametrize("kind", ["seeded", "generator"])
def test_sampled_bursts_give_the_tokens_of_one_step_a_round(target, monkeypatch, kind: str) -> None:
    """A sampled reply bursts too: each step picks as a plain round does (the seeded Gumbel-argmax
    with its position's noise row, or a draw from the same generator), so the same tokens."""
    sampling = SamplingParams(temperature=0.9, top_p=0.9, seed=5 if kind == "seeded" else None)
    if kind == "generator":  # an unseeded reply's generator, made the same for both runs
        import engine.decode.decoder as decoder_module

        def fixed(params: SamplingParams, start: int, width: int, device: Device) -> torch.Generator:
            return torch.Generator().manual_seed(11)

        monkeypatch.setattr(decoder_module, "make_randomness", fixed)
    expected, _ = reply(SpecDecoder(target, CPU), PROMPT, max_new_tokens=30, sampling=sampling)
    got, events = reply(bursting(target, burst=4), PROMPT, max_new_tokens=30, sampling=sampling)
    assert got == expected
    assert [len(e.token_ids) for e in events] == [4] * 7 + [2]


def test_a_burst_whose_later_step_gives_nan_logits_ends_with_the_target_s_error(target) -> None:
    """The burst checks its steps' maxima once at its end: a NaN in any step, not only the first,
    still ends the reply with the error that names the fix."""
    from engine.errors import NonFiniteLogitsError

    decoder = bursting(target, burst=4)
    runner = decoder.target
    real = runner.forward
    calls = [0]

    def nan_on_third(ids: object, logits_to_keep: int = 1) -> torch.Tensor:
        logits = real(ids, logits_to_keep)  # type: ignore[arg-type]
        calls[0] += 1
        if calls[0] == 3 and logits_to_keep == 1:
            logits = logits.clone()
            logits[..., 5] = float("nan")
        return logits

    runner.forward = nan_on_third  # type: ignore[method-assign]
    with pytest.raises(NonFiniteLogitsError) as err:
        for _ in decoder.generate(PROMPT, GenerationParams(max_new_tokens=8)):
            pass
    assert err.value.role == "target"
