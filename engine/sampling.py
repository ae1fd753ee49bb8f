"""Pure functions from logits to tokens: warping, greedy choice, sampling.

The same :func:`warp` is applied to the target's and the draft's logits, so
rejection sampling compares like with like and the emitted stream follows the
target's *warped* distribution (temperature, top-k, top-p) exactly.
Randomness only comes from an explicit ``torch.Generator``.
"""
from __future__ import annotations

import torch

from engine.device import Device
from engine.events import SamplingParams


def make_generator(params: SamplingParams, device: Device) -> torch.Generator | None:
    """A generator seeded from ``params.seed`` (fresh entropy when None); None when greedy."""
    if params.greedy:
        return None
    gen = torch.Generator(device=device.torch_device)
    if params.seed is None:
        gen.seed()
    else:
        gen.manual_seed(params.seed)
    return gen


def warp(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Turn logits into the probabilities tokens are sampled from.

    Args:
        logits: ``[..., V]`` raw logits.
        params: temperature (> 0 here), top-k (0 = off), top-p (1 = off).

    Returns:
        ``[..., V]`` float32 probabilities, zero outside the top-k / top-p set
        (the most likely token is always kept).
    """
    if params.greedy:
        raise ValueError("warp is for sampling; greedy decoding uses argmax")
    scores = logits.float() / params.temperature
    if params.top_k and params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        sorted_probs = torch.softmax(sorted_scores, dim=-1)
        # Drop a token when the tokens ranked above it already cover top_p.
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = mass_before >= params.top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return torch.softmax(scores, dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token id from ``probs`` (``[V]``, summing to 1)."""
    return int(torch.multinomial(probs, 1, generator=generator).item())


def uniform(generator: torch.Generator | None, device: Device) -> float:
    """One draw from U[0, 1) on ``device`` with ``generator``."""
    return float(torch.rand((), generator=generator, device=device.torch_device).item())
