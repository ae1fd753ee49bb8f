"""Sampled output follows the target's (warped) distribution exactly."""
from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest
import torch

import engine.decode.sampling
from engine.decode.decoder import SpecDecoder
from engine.model.device import Device
from engine.decode.drafters import ModelDrafter, NgramDrafter
from engine.events import GenerationParams, SamplingParams
from engine.decode.sampling import make_generator, warp
from engine.decode.verify import residual, verify_sampled
from tests.tiny import noisy_copy, tiny_llama

CPU = Device(torch.device("cpu"))


def chi_square_p_value(observed: Counter, expected: dict, n: int) -> float:
    """p-value of Pearson's chi-square test, cells with expected count < 5 pooled."""
    stat, df, pooled_obs, pooled_exp = 0.0, -1, 0.0, 0.0
    for cell, prob in expected.items():
        e = prob * n
        if e < 5:
            pooled_obs += observed.get(cell, 0)
            pooled_exp += e
            continue
        stat += (observed.get(cell, 0) - e) ** 2 / e
        df += 1
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        df += 1
    unexpected = sum(c for cell, c in observed.items() if expected.get(cell, 0.0) == 0.0)
    if unexpected:
        return 0.0  # a sequence the target can never produce
    return float(torch.special.gammaincc(torch.tensor(df / 2.0), torch.tensor(stat / 2.0)))


def test_warp_temperature_top_k_top_p() -> None:
    logits = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0])
    p = warp(logits, SamplingParams(temperature=1.0))
    assert torch.allclose(p, torch.softmax(logits, -1))
    p = warp(logits, SamplingParams(temperature=0.5))
    assert torch.allclose(p, torch.softmax(logits / 0.5, -1))
    p = warp(logits, SamplingParams(temperature=1.0, top_k=2))
    assert (p[2:] == 0).all() and torch.allclose(p[:2], torch.softmax(logits[:2], -1))
    full = torch.softmax(logits, -1)  # 0.636, 0.234, 0.086, ...
    p = warp(logits, SamplingParams(temperature=1.0, top_p=0.8))
    assert (p[:2] > 0).all() and (p[2:] == 0).all()  # 0.636 < 0.8 needs the second token
    p = warp(logits, SamplingParams(temperature=1.0, top_p=0.5))
    assert p[0] == 1.0  # the top token alone already covers 0.5
    assert full.sum() == pytest.approx(1.0)


def test_residual_is_normalised_positive_part() -> None:
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.6, 0.2])
    assert torch.allclose(residual(p, q, 1), torch.tensor([1.0, 0.0, 0.0]))
    assert torch.allclose(residual(p, None, 0), torch.tensor([0.0, 0.6, 0.4]))
    assert torch.allclose(residual(p, p.clone(), 0), p)  # nothing left: fall back to p


@pytest.mark.parametrize("deterministic", [False, True])
def test_one_verification_step_follows_p(deterministic: bool) -> None:
    """The first emitted token of a round is distributed as p, whatever q is."""
    p = torch.tensor([[0.05, 0.4, 0.25, 0.1, 0.2, 0.0], [1 / 6] * 6])
    q_row = torch.tensor([0.5, 0.1, 0.1, 0.1, 0.1, 0.1])
    gen = make_generator(SamplingParams(temperature=1.0, seed=7), CPU)
    n = 20000
    counts: Counter = Counter()
    for _ in range(n):
        if deterministic:
            x, q = 0, None  # an n-gram proposal: q is one-hot on x
        else:
            x = int(torch.multinomial(q_row, 1, generator=gen))
            q = q_row[None, :]
        verdict = verify_sampled(p, (x,), q, gen, CPU)
        counts[x if verdict.n_accepted == 1 else verdict.next_token] += 1
    expected = {i: float(p[0, i]) for i in range(6)}
    assert chi_square_p_value(counts, expected, n) > 1e-3
    assert counts[5] == 0  # zero target probability is never emitted


VOCAB = 5


@pytest.fixture(scope="module")
def small_target() -> torch.nn.Module:
    return tiny_llama(seed=5, vocab_size=VOCAB, hidden_size=16, layers=1, sharpness=1.0)


def exact_distribution(target: torch.nn.Module, prompt: list[int], length: int, params: SamplingParams) -> dict:
    """P(sequence) for every continuation of ``length`` tokens under the warped target."""
    probs: dict[tuple[int, ...], float] = {}
    with torch.inference_mode():
        for seq in itertools.product(range(VOCAB), repeat=length):
            logits = target(torch.tensor([prompt + list(seq)])).logits[0].float()
            dist = warp(logits, params)
            prob = 1.0
            for i, tok in enumerate(seq):
                prob *= float(dist[len(prompt) - 1 + i, tok])
            probs[seq] = prob
    return probs


def sample_replies(decoder: SpecDecoder, prompt: list[int], length: int, sampling: SamplingParams, n: int, k: int) -> Counter:
    """``n`` replies with seeds 0 .. n - 1: Gumbel coupling, one seed per draw."""
    counts: Counter = Counter()
    for i in range(n):
        params = GenerationParams(
            sampling=SamplingParams(sampling.temperature, sampling.top_p, sampling.top_k, seed=i),
            max_new_tokens=length,
            k=k,
        )
        out: list[int] = []
        for event in decoder.generate(prompt, params):
            out += event.token_ids
        counts[tuple(out)] += 1
    return counts


def rejection_sampling_seeded_per_draw(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the decoder use rejection sampling (the unseeded sampler) with a
    generator seeded from the draw's seed, so the test is reproducible."""

    def stream(params: SamplingParams, start: int, width: int, device: Device) -> torch.Generator | None:
        return make_generator(params, device)

    monkeypatch.setattr("engine.decode.decoder.make_randomness", stream)


def spec_decoder(small_target: torch.nn.Module, draft_kind: str) -> SpecDecoder:
    if draft_kind == "ngram":
        drafter: ModelDrafter | NgramDrafter = NgramDrafter()
    else:
        draft = noisy_copy(small_target, 0.1, seed=1) if draft_kind == "close" else tiny_llama(seed=77, vocab_size=VOCAB, hidden_size=16, layers=1, sharpness=1.0)
        drafter = ModelDrafter(draft, CPU)
    return SpecDecoder(small_target, CPU, drafter, calibrate_every=0)


@pytest.mark.parametrize("sampler", ["coupled", "rejection"])
@pytest.mark.parametrize(
    "draft_kind,sampling",
    [
        ("far", SamplingParams(temperature=1.0)),
        ("ngram", SamplingParams(temperature=1.0)),
        ("close", SamplingParams(temperature=0.7, top_p=0.8)),
        ("far", SamplingParams(temperature=1.3, top_k=3)),
    ],
)
def test_sampled_replies_follow_the_target(small_target, draft_kind: str, sampling: SamplingParams, sampler: str, monkeypatch) -> None:
    """The joint distribution of 3 tokens is the target's, for both samplers:
    Gumbel coupling (seeded; the seed changes per draw) and rejection sampling."""
    if sampler == "rejection":
        rejection_sampling_seeded_per_draw(monkeypatch)
    prompt = [1, 2, 3, 1, 2]  # repeats, so the n-gram drafter has something to propose
    length, n = 3, 1500
    decoder = spec_decoder(small_target, draft_kind)
    counts = sample_replies(decoder, prompt, length, sampling, n, k=2)
    expected = exact_distribution(small_target, prompt, length, sampling)
    assert chi_square_p_value(counts, expected, n) > 1e-3
    tv = 0.5 * sum(abs(counts.get(s, 0) / n - p) for s, p in expected.items())
    assert tv < 0.1
    if draft_kind != "ngram":
        assert decoder.costs.positions[0].reached[0] > 0  # speculation really ran


def test_unseeded_sampling_is_rejection_sampling(small_target, monkeypatch) -> None:
    """Without a seed the decoder verifies by rejection sampling, from fresh entropy."""
    calls: list[int] = []
    original = verify_sampled

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr("engine.decode.decoder.verify_sampled", counting)
    decoder = spec_decoder(small_target, "close")
    params = GenerationParams(sampling=SamplingParams(temperature=1.0), max_new_tokens=12, k=2)
    replies = {tuple(t for e in decoder.generate([1, 2], params) for t in e.token_ids) for _ in range(5)}
    assert calls and len(replies) > 1


def test_noise_shared_across_positions_is_caught(small_target, monkeypatch) -> None:
    """Negative control: a coupled sampler whose noise ignores the position
    (the same Gumbel row for every token of a reply) is rejected by the test above."""
    real_row = engine.decode.sampling.gumbel_row
    monkeypatch.setattr("engine.decode.sampling.gumbel_row", lambda seed, position, width: real_row(seed, 0, width))
    sampling = SamplingParams(temperature=1.0)
    prompt, length, n = [1, 2, 3, 1, 2], 3, 1500
    counts = sample_replies(spec_decoder(small_target, "far"), prompt, length, sampling, n, k=2)
    expected = exact_distribution(small_target, prompt, length, sampling)
    assert chi_square_p_value(counts, expected, n) < 1e-6


def test_same_seed_same_reply(small_target) -> None:
    decoder = SpecDecoder(small_target, CPU, ModelDrafter(noisy_copy(small_target, 0.2, seed=4), CPU))
    params = GenerationParams(sampling=SamplingParams(temperature=1.0, seed=1234), max_new_tokens=20, k=3)
    first = [t for e in decoder.generate([1, 2], params) for t in e.token_ids]
    second = [t for e in decoder.generate([1, 2], params) for t in e.token_ids]
    assert first == second
    other = GenerationParams(sampling=SamplingParams(temperature=1.0, seed=99), max_new_tokens=20, k=3)
    assert [t for e in decoder.generate([1, 2], other) for t in e.token_ids] != first


def test_chi_square_detects_a_wrong_distribution() -> None:
    """The test statistic used above can fail: a biased sampler is caught."""
    expected = {0: 0.5, 1: 0.3, 2: 0.2}
    biased = Counter({0: 1400, 1: 900, 2: 200})
    assert chi_square_p_value(biased, expected, 2500) < 1e-6
    assert math.isclose(chi_square_p_value(Counter({0: 1250, 1: 750, 2: 500}), expected, 2500), 1.0)
