"""Seeded sampling is drafter-invariant: Gumbel-max coupling (engine.decode.sampling.GumbelNoise).

With a seed, a reply is a function of (prompt, seed, target) alone: the model
draft of any quality, the n-gram drafter and plain decoding give the same ids,
whatever K (fixed, adaptive, or changed at random every round). The cache
invariants are checked after every round by ``decode``. That the replies also
follow the target's distribution is tested in test_sampling.py.
"""
from __future__ import annotations

import random

import pytest
import torch

from engine.decode.decoder import SpecDecoder
from engine.model.device import Device
from engine.decode.drafters import ModelDrafter, NgramDrafter
from engine.events import GenerationParams, SamplingParams
from engine.decode.sampling import GumbelNoise, gumbel_argmax, gumbel_row, make_randomness, warp
from engine.decode.verify import verify_coupled
from tests.engine.decode.test_decoder import decode
from tests.tiny import noisy_copy, tiny_llama

CPU = Device(torch.device("cpu"))
PROMPTS = [[3, 5, 7, 11, 13], [1, 2, 3, 1, 2, 3, 1, 2]]
SAMPLINGS = [
    SamplingParams(temperature=0.7, seed=11),
    SamplingParams(temperature=1.0, seed=11),
    SamplingParams(temperature=1.0, top_p=0.9, seed=5),
    SamplingParams(temperature=0.7, top_k=20, seed=5),
]


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    # Soft logits (sharpness 1): at T = 1 the target really samples.
    return tiny_llama(seed=1, sharpness=1.0)


@pytest.fixture(scope="module")
def drafts(target: torch.nn.Module) -> dict[str, torch.nn.Module]:
    return {
        "close": noisy_copy(target, 0.05, seed=2),
        "noisy": noisy_copy(target, 0.4, seed=3),
        "unrelated": tiny_llama(seed=99, sharpness=1.0),
    }


def reply(decoder: SpecDecoder, prompt: list[int], sampling: SamplingParams, k: int | None, n: int = 30) -> list[int]:
    return decode(decoder, prompt, GenerationParams(sampling=sampling, max_new_tokens=n, k=k))[0]


def drafter_for(kind: str, drafts: dict[str, torch.nn.Module]) -> ModelDrafter | NgramDrafter:
    return NgramDrafter() if kind == "ngram" else ModelDrafter(drafts[kind], CPU)


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=lambda s: f"T{s.temperature}-p{s.top_p}-k{s.top_k}")
@pytest.mark.parametrize("kind", ["close", "noisy", "unrelated", "ngram"])
def test_seeded_reply_is_the_plain_reply_for_every_k(target, drafts, kind, sampling) -> None:
    for prompt in PROMPTS:
        expected = reply(SpecDecoder(target, CPU), prompt, sampling, k=None)
        accepted = proposed = 0
        for k in [1, 2, 3, 4, 5, 6, 7, 8, None]:
            decoder = SpecDecoder(target, CPU, drafter_for(kind, drafts), calibrate_every=7)
            got, events = decode(decoder, prompt, GenerationParams(sampling=sampling, max_new_tokens=30, k=k))
            assert got == expected, f"K={k}"
            accepted += events[-1].stats.accepted
            proposed += events[-1].stats.proposed
        if kind == "close":
            assert 0 < accepted < proposed  # drafts were both accepted and rejected


@pytest.mark.parametrize("kind", ["close", "unrelated", "ngram"])
def test_a_random_schedule_changes_nothing(target, drafts, kind, monkeypatch) -> None:
    """K drawn at random every round (0 = a plain round): still the plain reply."""
    sampling = SamplingParams(temperature=1.0, seed=3)
    expected = reply(SpecDecoder(target, CPU), PROMPTS[1], sampling, k=None, n=40)
    for schedule_seed in range(3):
        decoder = SpecDecoder(target, CPU, drafter_for(kind, drafts), calibrate_every=0)
        rng = random.Random(schedule_seed)
        monkeypatch.setattr(decoder.schedule, "policy_k", lambda drafter, enabled, params: rng.randint(0, 8))
        assert reply(decoder, PROMPTS[1], sampling, k=None, n=40) == expected


def test_different_seeds_give_different_replies(target, drafts) -> None:
    replies = set()
    for seed in range(4):
        sampling = SamplingParams(temperature=0.7, seed=seed)
        plain = reply(SpecDecoder(target, CPU), PROMPTS[0], sampling, k=None)
        assert reply(SpecDecoder(target, CPU, ModelDrafter(drafts["close"], CPU)), PROMPTS[0], sampling, k=4) == plain
        replies.add(tuple(plain))
    assert len(replies) == 4


def test_a_follow_up_turn_uses_the_reply_positions(target, drafts) -> None:
    """Noise is keyed by the position within the reply: a cached earlier turn changes nothing."""
    sampling = SamplingParams(temperature=1.0, seed=8)
    decoder = SpecDecoder(target, CPU, ModelDrafter(drafts["noisy"], CPU))
    first = reply(decoder, PROMPTS[0], sampling, k=3, n=10)
    follow = PROMPTS[0] + first + [17, 19]
    assert reply(decoder, follow, sampling, k=3, n=10) == reply(SpecDecoder(target, CPU), follow, sampling, k=None, n=10)


def test_noise_is_a_function_of_seed_and_reply_position() -> None:
    a = GumbelNoise(seed=7, start=10, width=50, device=CPU)
    b = GumbelNoise(seed=7, start=3, width=50, device=CPU)
    assert torch.equal(a.row(12), b.row(5))  # reply position 2 in both
    assert torch.equal(a.row(12), gumbel_row(7, 2, 50))
    assert torch.equal(a.rows(10, 3)[2], a.row(12))
    assert not torch.equal(a.row(12), a.row(13))
    assert not torch.equal(a.row(12), GumbelNoise(8, 10, 50, CPU).row(12))
    with pytest.raises(ValueError, match="inside the prompt"):
        a.row(9)
    # Standard Gumbel: mean is the Euler-Mascheroni constant, variance pi^2 / 6.
    g = torch.cat([gumbel_row(1, i, 10_000) for i in range(10)]).double()
    assert float(g.mean()) == pytest.approx(0.5772, abs=0.02)
    assert float(g.var()) == pytest.approx(torch.pi**2 / 6, rel=0.03)


def test_gumbel_argmax_samples_the_warped_distribution() -> None:
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    params = SamplingParams(temperature=0.8, top_k=5)
    n = 20_000
    noise = torch.stack([gumbel_row(4, i, 6) for i in range(n)])
    counts = torch.bincount(gumbel_argmax(logits.expand(n, 6), params, noise), minlength=6).double()
    expected = warp(logits, params).double() * n
    assert counts[5] == 0  # outside top-k: never
    assert torch.allclose(counts[:5], expected[:5], rtol=0.06, atol=30)


def test_noise_width_follows_the_logits() -> None:
    """A draft with more (masked) or fewer logits than the target uses the same noise per id."""
    params = SamplingParams(temperature=1.0)
    noise = gumbel_row(1, 0, 8)
    logits = torch.randn(8, generator=torch.Generator().manual_seed(0))
    wider = torch.cat([logits, torch.full((4,), float("-inf"))])
    assert int(gumbel_argmax(wider, params, noise)) == int(gumbel_argmax(logits, params, noise))
    narrower = logits[:6]
    assert int(gumbel_argmax(narrower, params, noise)) == int(torch.argmax(narrower + noise[:6]))


def test_verify_coupled_accepts_exactly_the_matching_prefix() -> None:
    params = SamplingParams(temperature=1.0)
    logits = torch.randn(4, 10, generator=torch.Generator().manual_seed(1))
    noise = torch.stack([gumbel_row(2, i, 10) for i in range(4)])
    choices = gumbel_argmax(logits, params, noise).tolist()
    assert verify_coupled(logits, choices[:3], params, noise).n_accepted == 3
    assert verify_coupled(logits, choices[:3], params, noise).next_token == choices[3]
    wrong = (choices[1] + 1) % 10
    verdict = verify_coupled(logits, [choices[0], wrong, choices[2]], params, noise)
    assert (verdict.n_accepted, verdict.next_token) == (1, choices[1])


def test_make_randomness_picks_the_sampler() -> None:
    assert make_randomness(SamplingParams(), 0, 10, CPU) is None
    assert isinstance(make_randomness(SamplingParams(temperature=1.0, seed=0), 0, 10, CPU), GumbelNoise)
    assert isinstance(make_randomness(SamplingParams(temperature=1.0), 0, 10, CPU), torch.Generator)
