"""The acceptance rules (engine.decode.verify), row by row on hand-made logits."""
from __future__ import annotations

import torch

from engine.model.device import Device
from engine.decode.verify import verify_greedy, verify_sampled

CPU = Device(torch.device("cpu"))


def rows(*argmaxes: int, vocab: int = 6) -> torch.Tensor:
    """Logits ``[len(argmaxes), vocab]`` whose row ``r`` peaks at ``argmaxes[r]``."""
    logits = torch.zeros(len(argmaxes), vocab)
    for r, token in enumerate(argmaxes):
        logits[r, token] = 5.0
    return logits


def test_greedy_keeps_the_agreeing_prefix_and_adds_the_targets_token_at_the_first_disagreement() -> None:
    verdict = verify_greedy(rows(3, 1, 4, 2), [3, 1, 0])
    assert (verdict.n_accepted, verdict.next_token) == (2, 4)


def test_greedy_with_every_draft_token_accepted_adds_the_bonus_token_of_the_last_row() -> None:
    verdict = verify_greedy(rows(3, 1, 5), [3, 1])
    assert (verdict.n_accepted, verdict.next_token) == (2, 5)


def test_greedy_with_no_draft_is_one_plain_step() -> None:
    verdict = verify_greedy(rows(4), [])
    assert (verdict.n_accepted, verdict.next_token) == (0, 4)


def test_a_draft_equal_to_the_target_is_always_accepted_when_sampling() -> None:
    p = torch.softmax(torch.randn(4, 6, generator=torch.Generator().manual_seed(0)), dim=-1)
    draft = [1, 2, 3]
    for seed in range(20):
        verdict = verify_sampled(p, draft, p[:3].clone(), torch.Generator().manual_seed(seed), CPU)
        assert verdict.n_accepted == 3  # p/q = 1 at every position


def test_a_token_the_target_never_makes_is_always_rejected_and_never_resampled() -> None:
    p = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    q = torch.tensor([[0.0, 0.0, 1.0]])
    for seed in range(20):
        verdict = verify_sampled(p, [2], q, torch.Generator().manual_seed(seed), CPU)
        assert verdict.n_accepted == 0 and verdict.next_token in (0, 1)  # from max(0, p - q), never 2
