"""NaN/inf logits (float16 overflow on cards below compute capability 8.0) end a reply with an
EngineError that names the fix, never with a device-side assert from ``multinomial``; a draft
that produces them is dropped (issue 23, item 3). Stand-in: tiny models whose output layer
holds a NaN, and a cuBLAS allocation failure injected into a draft's pass (item 7)."""
from __future__ import annotations

import pytest
import torch

from engine.decode.decoder import SpecDecoder
from engine.decode.drafters import ModelDrafter, NgramDrafter
from engine.decode.sampling import sample_on_device, to_host, finite
from engine.errors import EngineError, NonFiniteLogitsError
from engine.events import GenerationParams, SamplingParams
from engine.model.device import Device
from tests.tiny import noisy_copy, tiny_llama

CPU = Device(torch.device("cpu"))
PROMPT = [5, 6, 7, 8, 5, 6, 7]


def nan_model(seed: int = 1) -> torch.nn.Module:
    """A tiny Llama whose logits are NaN in every row (one NaN in the final norm's weight)."""
    model = tiny_llama(seed=seed)
    with torch.no_grad():
        model.model.norm.weight[3] = float("nan")
    return model


def reply(decoder: SpecDecoder, params: GenerationParams) -> tuple[list[int], list[str]]:
    tokens: list[int] = []
    notices: list[str] = []
    for event in decoder.generate(PROMPT, params):
        tokens.extend(event.token_ids)
        if event.notice:
            notices.append(event.notice)
    return tokens, notices


@pytest.mark.parametrize("sampling", [
    SamplingParams(),  # greedy
    SamplingParams(temperature=0.8, seed=3),  # seeded: Gumbel-max
    SamplingParams(temperature=0.8),  # rejection sampling: multinomial
], ids=["greedy", "seeded", "sampled"])
@pytest.mark.parametrize("drafter", [None, "ngram"])
def test_a_target_with_nan_logits_raises_an_engine_error_naming_the_fix(sampling: SamplingParams,
                                                                        drafter: str | None) -> None:
    decoder = SpecDecoder(nan_model(), CPU, NgramDrafter() if drafter else None)
    with pytest.raises(NonFiniteLogitsError) as err:
        reply(decoder, GenerationParams(max_new_tokens=4, sampling=sampling))
    assert isinstance(err.value, EngineError) and err.value.role == "target"
    msg = str(err.value)
    assert "NaN or inf" in msg and 'dtype = "float32"' in msg and "float16" in msg
    assert "its files in the cache may be damaged: `specchat models remove` it" in msg  # random bytes in an int4 cache: only the dtype was blamed


def test_multinomial_never_sees_nan_probabilities() -> None:
    nan = torch.full((16,), float("nan"))
    with pytest.raises(RuntimeError):  # what the guard is for (on CUDA: a device-side assert)
        torch.multinomial(nan, 1)
    token = sample_on_device(nan, torch.Generator().manual_seed(0))
    assert token.dim() == 0 and 0 <= int(token) < 16
    probs = torch.softmax(torch.randn(16, generator=torch.Generator().manual_seed(1)), -1)
    same = [int(sample_on_device(probs, torch.Generator().manual_seed(s))) for s in range(20)]
    plain = [int(torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(s))) for s in range(20)]
    assert same == plain  # a finite distribution draws exactly what multinomial draws


def test_the_finiteness_flag_rides_on_the_ids_transfer() -> None:
    good = torch.tensor([[0.0, float("-inf"), 2.0], [1.0, 0.5, float("-inf")]])  # -inf: a masked head
    assert to_host(good.argmax(-1), finite(good)) == [2, 0]
    for bad in (float("nan"), float("inf")):
        logits = good.clone()
        logits[1, 1] = bad
        with pytest.raises(NonFiniteLogitsError):
            to_host(logits.argmax(-1), finite(logits))
    with pytest.raises(NonFiniteLogitsError):
        to_host(torch.tensor([0]), finite(torch.full((1, 3), float("-inf"))))  # nothing to choose


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.8, seed=3), SamplingParams(temperature=0.8)],
                         ids=["greedy", "seeded", "sampled"])
def test_a_draft_with_nan_logits_is_dropped_and_the_reply_goes_on(sampling: SamplingParams) -> None:
    target = tiny_llama(seed=1)
    plain, _ = reply(SpecDecoder(target, CPU), GenerationParams(max_new_tokens=12, sampling=sampling, k=3))
    decoder = SpecDecoder(target, CPU, ModelDrafter(nan_model(seed=1), CPU))
    tokens, notices = reply(decoder, GenerationParams(max_new_tokens=12, sampling=sampling, k=3))
    assert decoder.drafter is None and decoder.mode == "plain"
    assert notices and notices[0].startswith("draft dropped (non-finite logits while drafting")
    assert "draft model's logits are NaN or inf" in notices[0]
    assert len(tokens) == 12
    if sampling.greedy or sampling.seed is not None:  # a seeded reply is plain sampling's, whatever drafted it
        assert tokens == plain


def test_a_cublas_allocation_failure_in_the_draft_counts_as_out_of_memory() -> None:
    """cuBLAS reports a full card from inside a matmul as a plain RuntimeError."""
    error = RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")
    assert Device.is_out_of_memory(error)
    assert not Device.is_out_of_memory(RuntimeError("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED"))

    class FailingDraft(torch.nn.Module):
        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.model, self.config, self.calls = model, model.config, 0

        def get_output_embeddings(self) -> torch.nn.Module:
            return self.model.get_output_embeddings()

        def forward(self, **kwargs):  # type: ignore[no-untyped-def]
            self.calls += 1
            if self.calls == 3:
                raise error
            return self.model(**kwargs)

    target = tiny_llama(seed=1)
    plain, _ = reply(SpecDecoder(target, CPU), GenerationParams(max_new_tokens=10))
    decoder = SpecDecoder(target, CPU, ModelDrafter(FailingDraft(noisy_copy(target, 0.05, seed=2)), CPU))
    tokens, notices = reply(decoder, GenerationParams(max_new_tokens=10, k=3))
    assert tokens == plain and decoder.drafter is None
    assert notices == ["draft dropped (out of memory while drafting); continuing with plain decoding"]
