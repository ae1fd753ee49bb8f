"""Running out of memory mid-reply, and speculation switching itself off."""
from __future__ import annotations


import pytest
import torch

from engine.decode.decoder import SpecDecoder
from engine.model.device import Device
from engine.decode.drafters import ModelDrafter
from engine.errors import EngineError
from engine.events import NOT_PAYING, GenerationParams, SamplingParams
from tests.tiny import SlowDraft, noisy_copy, tiny_llama

CPU = Device(torch.device("cpu"))
PROMPT = [3, 5, 7, 11, 13]


class FailingForward(torch.nn.Module):
    """Wraps a model; its forward raises CUDA's OOM error on chosen calls."""

    def __init__(self, model: torch.nn.Module, fail_on: set[int], error: type[BaseException] = torch.cuda.OutOfMemoryError) -> None:
        super().__init__()
        self.model = model
        self.config = model.config
        self.fail_on = fail_on
        self.error = error
        self.calls = 0

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.model.get_output_embeddings()

    def forward(self, **kwargs):  # type: ignore[no-untyped-def]
        self.calls += 1
        if self.calls in self.fail_on:
            raise self.error("CUDA out of memory. Tried to allocate 2.00 GiB (injected by the test)")
        return self.model(**kwargs)


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_llama(seed=1)


def run(decoder: SpecDecoder, prompt: list[int], params: GenerationParams) -> tuple[list[int], list]:
    events = list(decoder.generate(prompt, params))
    return [t for e in events for t in e.token_ids], events


def plain(target: torch.nn.Module, n: int) -> list[int]:
    return run(SpecDecoder(target, CPU), PROMPT, GenerationParams(max_new_tokens=n))[0]


@pytest.mark.parametrize("fail_on_call", [2, 3, 7])  # call 1 is the draft's prefill
def test_oom_in_the_draft_finishes_the_same_reply_with_plain_decoding(target, fail_on_call: int) -> None:
    draft = FailingForward(noisy_copy(target, 0.05, seed=2), {fail_on_call})
    decoder = SpecDecoder(target, CPU, ModelDrafter(draft, CPU), calibrate_every=0)
    out, events = run(decoder, PROMPT, GenerationParams(max_new_tokens=30, k=3))
    assert out == plain(target, 30)  # nothing lost, nothing changed
    notices = [e.notice for e in events if e.notice]
    assert len(notices) == 1 and "out of memory while drafting" in notices[0]
    assert decoder.drafter is None and decoder.mode == "plain"
    assert events[-1].stats.mode == "plain"
    assert "out of memory" in (events[-1].stats.speculation_off_reason or "")
    # The next reply works, plainly.
    assert run(decoder, PROMPT, GenerationParams(max_new_tokens=10))[0] == plain(target, 10)


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.8, seed=3)], ids=["greedy", "seeded"])
def test_oom_while_verifying_a_draft_drops_the_draft_and_retries_plainly(target, sampling: SamplingParams) -> None:
    wrapped = FailingForward(target, {3})  # call 1 prefill, 2 first round, 3 a verify pass
    decoder = SpecDecoder(wrapped, CPU, ModelDrafter(noisy_copy(target, 0.05, seed=2), CPU), calibrate_every=0)
    out, events = run(decoder, PROMPT, GenerationParams(max_new_tokens=30, k=3, sampling=sampling))
    assert out == run(SpecDecoder(target, CPU), PROMPT, GenerationParams(max_new_tokens=30, sampling=sampling))[0]
    assert any("out of memory while verifying" in (e.notice or "") for e in events)
    assert decoder.target.ids == (PROMPT + out)[:-1]


def test_oom_in_the_target_without_a_draft_is_an_engine_error(target) -> None:
    decoder = SpecDecoder(FailingForward(target, {4}), CPU)
    with pytest.raises(EngineError, match="target model ran out of memory"):
        run(decoder, PROMPT, GenerationParams(max_new_tokens=30))
    # The engine is still usable and consistent afterwards.
    decoder.target.model.fail_on = set()
    assert run(decoder, PROMPT, GenerationParams(max_new_tokens=12))[0] == plain(target, 12)


def test_errors_other_than_oom_are_not_swallowed(target) -> None:
    draft = FailingForward(noisy_copy(target, 0.05, seed=2), {2}, error=ValueError)
    decoder = SpecDecoder(target, CPU, ModelDrafter(draft, CPU))
    with pytest.raises(ValueError):
        run(decoder, PROMPT, GenerationParams(max_new_tokens=30, k=3))


def test_speculation_switches_itself_off_when_it_does_not_pay_and_back_on(target) -> None:
    draft = SlowDraft(tiny_llama(seed=99), delay_s=0.01)
    decoder = SpecDecoder(target, CPU, ModelDrafter(draft, CPU), calibrate_every=4, auto_off_window=6)
    out, events = run(decoder, PROMPT, GenerationParams(max_new_tokens=40))  # adaptive K
    assert out == plain(target, 40)
    assert not any(e.notice for e in events)  # quietly: the stats say why
    assert decoder.mode == "plain" and not decoder.speculation_enabled
    assert events[-1].stats.speculation_off_reason == NOT_PAYING
    assert "standard errors" in (events[-1].stats.speculation_off_detail or "")
    decoder.set_speculation(True)
    assert decoder.mode == "spec" and decoder.off_reason is None
    _, again = run(decoder, PROMPT, GenerationParams(max_new_tokens=6, k=2))
    assert again[-1].stats.proposed > 0


def test_fixed_k_is_never_switched_off(target) -> None:
    draft = SlowDraft(tiny_llama(seed=99), delay_s=0.01)
    decoder = SpecDecoder(target, CPU, ModelDrafter(draft, CPU), calibrate_every=4, auto_off_window=6)
    _, events = run(decoder, PROMPT, GenerationParams(max_new_tokens=30, k=2))
    assert decoder.speculation_enabled and not any(e.notice for e in events)


def test_oom_while_the_draft_reads_the_prompt_falls_back_before_the_first_round(target) -> None:
    draft = FailingForward(noisy_copy(target, 0.05, seed=2), {1})
    decoder = SpecDecoder(target, CPU, ModelDrafter(draft, CPU))
    out, events = run(decoder, PROMPT, GenerationParams(max_new_tokens=12, k=3))
    assert out == plain(target, 12)
    assert "out of memory while the draft read the prompt" in (events[0].notice or "")
