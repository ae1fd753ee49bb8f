"""A draft that proposes from a subset of the vocabulary (FR-Spec) keeps the output exact:
greedy equals plain, and sampled replies follow the target's distribution."""
from __future__ import annotations

import pytest
import torch

from engine.decode.decoder import SpecDecoder
from engine.model.device import Device
from engine.decode.drafters import ModelDrafter
from engine.events import GenerationParams, SamplingParams
from engine.load.loader import frequent_token_ids
from engine.quant.int4 import quantize_model
from tests.engine.decode.test_sampling import (
    VOCAB,
    chi_square_p_value,
    exact_distribution,
    rejection_sampling_seeded_per_draw,
    sample_replies,
)
from tests.tiny import make_tokenizer
from tests.tiny import noisy_copy, tiny_llama

CPU = Device(torch.device("cpu"))


def test_subset_head_scores_only_the_subset() -> None:
    model = tiny_llama(seed=1)
    drafter = ModelDrafter(model, CPU, vocab_subset=torch.arange(0, 96, 2))
    logits = drafter.runner.forward([1, 2, 3], logits_to_keep=1)[-1]
    assert torch.isinf(logits[1::2]).all() and torch.isfinite(logits[0::2]).all()
    full = tiny_llama(seed=1)(torch.tensor([[1, 2, 3]])).logits[0, -1]
    assert torch.allclose(logits[0::2], full[0::2], atol=1e-4)
    assert "48-token head" in drafter.name


def test_an_int4_subset_head_scores_with_the_full_heads_own_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """On specchat's CPU kernel the subset head is the int4 head's own rows, gathered (not rebuilt
    by running the head over an identity matrix, seconds on a real draft), the final norm folded in
    as the full head folds it (torch's norm and the kernel's round differently now and then): each
    kept logit is the full head's, bit for bit."""
    from engine.model import head

    def rebuilt(*args: object) -> None:
        raise AssertionError("the head's rows were rebuilt instead of gathered")

    monkeypatch.setattr(head, "_head_rows", rebuilt)
    full, part = tiny_llama(seed=1, hidden_size=64), tiny_llama(seed=1, hidden_size=64)  # K = 64: the kernel's
    for model in (full, part):
        quantize_model(model, group_size=32)
    if full.get_output_embeddings().kernel != "specchat":
        pytest.skip("specchat's CPU int4 kernel cannot run here")
    subset = torch.arange(0, 96, 2)
    want = ModelDrafter(full, CPU).runner.forward([1, 2, 3, 4], logits_to_keep=2)
    got = ModelDrafter(part, CPU, vocab_subset=subset).runner.forward([1, 2, 3, 4], logits_to_keep=2)
    assert torch.equal(got[:, subset], want[:, subset]) and torch.isinf(got[:, 1::2]).all()


@pytest.mark.parametrize("int4", [False, True])
def test_greedy_spec_with_a_subset_draft_equals_plain(int4: bool) -> None:
    target = tiny_llama(seed=1)
    draft = noisy_copy(target, 0.05, seed=2)
    if int4:
        quantize_model(draft, group_size=32)
    subset = torch.arange(0, 64)  # a third of the vocabulary is never proposed
    for prompt in ([3, 5, 7, 11, 13], [1, 2, 3, 1, 2, 3], [90, 91]):
        plain = [t for e in SpecDecoder(target, CPU).generate(prompt, GenerationParams(max_new_tokens=24))
                 for t in e.token_ids]
        for k in (3, None):
            decoder = SpecDecoder(target, CPU, ModelDrafter(draft, CPU, vocab_subset=subset))
            events = list(decoder.generate(prompt, GenerationParams(max_new_tokens=24, k=k)))
            assert [t for e in events for t in e.token_ids] == plain
            assert events[-1].stats.proposed > 0


@pytest.mark.parametrize("sampler", ["coupled", "rejection"])
def test_sampled_replies_with_a_subset_draft_follow_the_target(sampler: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if sampler == "rejection":
        rejection_sampling_seeded_per_draw(monkeypatch)
    target = tiny_llama(seed=5, vocab_size=VOCAB, hidden_size=16, layers=1, sharpness=1.0)
    draft = noisy_copy(target, 0.1, seed=1)
    # Tokens 3 and 4 are never proposed: only the residual can emit them.
    decoder = SpecDecoder(target, CPU, ModelDrafter(draft, CPU, vocab_subset=torch.tensor([0, 1, 2])), calibrate_every=0)
    prompt, length, n = [1, 2, 3, 1, 2], 3, 1500
    sampling = SamplingParams(temperature=1.0)
    counts = sample_replies(decoder, prompt, length, sampling, n, k=2)
    expected = exact_distribution(target, prompt, length, sampling)
    assert chi_square_p_value(counts, expected, n) > 1e-3
    assert any(3 in s or 4 in s for s in counts)  # tokens outside the subset do come out


def test_frequent_token_ids_keep_specials_and_pack_in_sixteens() -> None:
    tok = make_tokenizer()
    ids = frequent_token_ids(tok, 20).tolist()
    assert set(tok.all_special_ids) <= set(ids)
    assert len(ids) % 16 == 0 and len(ids) >= 20 and ids == sorted(set(ids))
