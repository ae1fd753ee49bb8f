"""Rounds whose picks stay on the device until one transfer at the end (issue 35, item 3).

On a card a pass is short enough that the host's share of a round (launching it, then
waiting for its result) would otherwise add to every step: each wait leaves the card idle
while the host decides what to queue next. So a round queues everything it can before it
reads anything back:

* :func:`plain_steps`: ``n`` one-token steps (greedy or sampled), each pick feeding the next pass;
* :func:`draft_and_verify`: a model draft's ``k`` steps, then the target's pass over
  ``[pending, *draft]`` fed with the drafted ids as they lie on the device; the picks,
  the target's choices and both finiteness flags come back together, and acceptance by
  equality (greedy, or seeded Gumbel-argmax: :mod:`engine.decode.verify`) is decided then.

Both return what a round done the plain way returns, token for token: the same passes,
the same argmax. The runners hold the fed ids as device ids until they are told them
(:meth:`~engine.decode.runner.ModelRunner.resolve_pending`), which these functions do.
"""
from __future__ import annotations

import torch

from engine.decode.drafters import Draft, ModelDrafter
from engine.decode.runner import ModelRunner
from engine.decode.sampling import GumbelNoise, Randomness, finite, gumbel_argmax, sample_on_device, to_host, warp
from engine.decode.verify import Verdict, verify_matching_on_device
from engine.errors import NonFiniteLogitsError
from engine.events import GenerationParams, SamplingParams
from engine.model.device import Device, Mark

GREEDY = SamplingParams()


def matching(params: GenerationParams, generator: Randomness) -> bool:
    """Whether a draft is accepted by equality with the target's picks (greedy, or seeded:
    Gumbel-argmax), so that it can be verified without leaving the device."""
    return params.sampling.greedy or isinstance(generator, GumbelNoise)


def plain_steps(target: ModelRunner, seq: list[int], n: int, sampling: SamplingParams = GREEDY,
                generator: Randomness = None) -> list[int]:
    """``n`` plain steps of ``target`` after ``seq`` (``[L]`` ids; its cache holds all but the
    last): returns the ``[n]`` picks. Each pick feeds the next one-token pass on the device;
    the picks and their logits' finiteness come to the host in one transfer.

    A step picks as one plain round of the decoder would (:mod:`engine.decode.verify` with an
    empty draft), so the tokens are the same as one step a round: greedy, ``max`` over the
    ``[1, V]`` logits; seeded, the Gumbel-argmax with the noise row of the token's position;
    otherwise a draw from the warped distribution with the reply's generator (the same
    ``multinomial`` over the same probabilities, on the device)."""
    target.truncate(len(seq) - 1)  # a retry after a failed step starts where the round did
    if len(target) != len(seq) - 1:
        raise AssertionError(f"target cache holds {len(target)} tokens, expected {len(seq) - 1}")
    logits = target.forward([seq[-1]], logits_to_keep=1)
    picks: list[torch.Tensor] = []
    ok: torch.Tensor | None = None
    bests: list[torch.Tensor] = []  # greedy: each step's max, checked once for the burst (max keeps a NaN)
    for i in range(n):
        if sampling.greedy:
            best, choice = logits.max(dim=-1)
            bests.append(best)
        else:
            choice, finite_now = _pick(logits, sampling, generator, len(seq) + i)
            ok = finite_now if ok is None else ok & finite_now
        picks.append(choice)
        if i + 1 < n:
            logits = target.forward(choice, logits_to_keep=1)
    if bests:  # one check for the burst: three kernels, where each step's own took three
        ok = torch.isfinite(torch.cat(bests)).all()
    assert ok is not None
    tokens = to_host(torch.cat(picks), ok)
    target.resolve_pending(tokens[: n - 1])  # the runner holds them as device ids
    return tokens


def _pick(logits: torch.Tensor, sampling: SamplingParams, generator: Randomness,
          first: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's tokens ``[n]`` after ``[n, V]`` logits whose row ``r`` chooses the token at
    sequence index ``first + r``, and whether the logits were finite (0-d bool); nothing read
    back. Picked as :mod:`engine.decode.verify` picks: greedy, ``max`` (verify_greedy's);
    seeded, the Gumbel-argmax with each position's noise row (verify_coupled's); otherwise, for
    one row only, one ``multinomial`` draw from the warped distribution (verify_sampled's, which
    checks ``p`` first)."""
    if sampling.greedy:
        best, choices = logits.max(dim=-1)
        return choices, torch.isfinite(best).all()
    if isinstance(generator, GumbelNoise):
        return gumbel_argmax(logits, sampling, generator.rows(first, logits.shape[0])), finite(logits)
    if logits.shape[0] != 1:
        raise ValueError("an unseeded draw is picked one row at a time")
    probs = warp(logits, sampling)
    return sample_on_device(probs[0], generator).reshape(1), finite(probs)


def draft_and_verify(target: ModelRunner, drafter: ModelDrafter, device: Device, seq: list[int], k: int,
                     params: GenerationParams, generator: Randomness, stage: list[str]) -> tuple[Draft, Verdict, Mark]:
    """A model draft of ``k >= 1`` tokens after ``seq`` (``[L]`` ids; the target's cache holds
    all but the last) and its verification, read back once. The drafted ids ``[k]`` feed the
    target's pass over ``[pending, *draft]`` on the device; its ``[k + 1]`` picks are compared
    with them on the host after the one transfer
    (:func:`~engine.decode.verify.verify_matching_on_device`). Returns the draft, the verdict
    and the device mark between drafting and verifying; ``stage[0]`` says how far it got (for
    the notice when it fails: a draft's NaN is known only at the read-back)."""
    if len(target) != len(seq) - 1:
        raise AssertionError(f"target cache holds {len(target)} tokens, expected {len(seq) - 1}")
    pending = device.ids_tensor([seq[-1]]).reshape(-1)  # queued before the draft's passes
    drafted = drafter.draft_on_device(seq, k, params.sampling, generator)
    t_draft = device.mark()
    stage[0] = "verifying a draft"
    logits = target.forward(torch.cat([pending, drafted.picks]), logits_to_keep=k + 1)
    choices, target_ok = _pick(logits, params.sampling, generator, len(seq))  # acceptance by equality: matching()
    try:
        tokens, verdict = verify_matching_on_device(choices, target_ok, drafted.picks, drafted.ok)
    except NonFiniteLogitsError as exc:
        if exc.role == "draft":
            stage[0] = "drafting"
        raise
    drafter.settle(tokens)
    target.resolve_pending([seq[-1], *tokens])
    return Draft(tuple(tokens)), verdict, t_draft
