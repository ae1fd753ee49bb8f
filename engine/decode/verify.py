"""Deciding which drafted tokens the target accepts, and the token it adds.

One target pass scores the pending token plus the K drafted tokens
``x_1..x_K``: row ``i`` of its output is the target's distribution ``p_i`` for
the token after ``x_i`` (row 0 follows the pending token). The round then emits
the longest accepted prefix ``x_1..x_n`` and one token of the target's own:

* greedy: ``x_i`` is accepted while it equals ``argmax p_{i-1}``; the target's
  token is ``argmax p_n``. The output is therefore token-identical to plain
  greedy decoding of the target.
* sampling (Leviathan et al. 2022, Chen et al. 2023): ``x_i`` drawn from the
  draft's ``q_{i-1}`` is accepted with probability ``min(1, p(x_i) / q(x_i))``;
  on the first rejection the target's token is drawn from the residual
  ``norm(max(0, p - q))``; if all K are accepted, the bonus token is drawn from
  ``p_K``. Every emitted token then follows the target's distribution exactly.

A deterministic drafter (n-gram lookup) proposes with ``q`` = one-hot on
``x_i``; its acceptance probability is then ``p(x_i)`` and the residual is ``p``
with ``x_i`` removed.

* seeded sampling, coupled by shared Gumbel noise (Daliri et al. 2025,
  "Coupling without Communication and Drafter-Invariant Speculative
  Decoding"): reply position ``j`` has its own noise ``g_j`` over the
  vocabulary, drawn from (seed, j) alone (:class:`engine.decode.sampling.GumbelNoise`).
  The target's token there is ``y_j = argmax_v(log p_j(v) + g_j(v))``, a draw
  from ``p_j`` (the Gumbel-max trick). A model draft proposes
  ``x_j = argmax_v(log q_j(v) + g_j(v))`` with the same noise, so it agrees
  with the target exactly where the noise makes them agree, i.e. with
  probability at least ``(1 - TV(p, q)) / (1 + TV(p, q))`` (rejection sampling
  reaches ``1 - TV``). ``x_j`` is accepted iff ``x_j == y_j``; the first
  mismatch emits ``y_j``. That is greedy verification on the noised scores
  ``log p + g``: every emitted token is ``y_j``, which depends on the seed,
  ``j`` and the target's scores only, so the reply equals plain sampling with
  the same seed whatever the drafter (model, n-gram) or K.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.model.device import Device
from engine.events import SamplingParams
from engine.decode.sampling import check_finite, finite, gumbel_argmax, non_finite_error, sample, to_host, uniform


@dataclass(frozen=True)
class Verdict:
    """Outcome of one verification: ``n_accepted`` drafted tokens, then ``next_token``."""

    n_accepted: int
    next_token: int


def verify_greedy(target_logits: torch.Tensor, draft_tokens: Sequence[int]) -> Verdict:
    """Greedy acceptance.

    Args:
        target_logits: ``[K + 1, V]`` target logits after the pending token and
            after each drafted token.
        draft_tokens: ``[K]`` drafted ids.

    The argmax and the logits' finiteness come to the host in one transfer, from
    one pass over the logits (a row's maximum is NaN or inf exactly when the row
    is not usable); NaN or inf logits raise :class:`~engine.errors.NonFiniteLogitsError`.
    """
    best, choices = target_logits.max(dim=-1)
    return _accept_matching(to_host(choices, torch.isfinite(best).all()), draft_tokens)


def verify_coupled(
    target_logits: torch.Tensor,
    draft_tokens: Sequence[int],
    sampling: SamplingParams,
    noise: torch.Tensor,
) -> Verdict:
    """Seeded acceptance: greedy verification on Gumbel-noised warped scores.

    Args:
        target_logits: ``[K + 1, V]`` target logits after the pending token and
            after each drafted token.
        draft_tokens: ``[K]`` drafted ids (by a model with the same noise, or
            by lookup).
        sampling: the warping (temperature > 0, top-k, top-p).
        noise: ``[K + 1, V]`` the Gumbel rows of the positions the rows of
            ``target_logits`` choose.
    """
    choices = to_host(gumbel_argmax(target_logits, sampling, noise), finite(target_logits))
    return _accept_matching(choices, draft_tokens)


def verify_matching_on_device(
    choices: torch.Tensor,
    target_ok: torch.Tensor,
    draft_picks: torch.Tensor,
    draft_ok: torch.Tensor,
) -> tuple[list[int], Verdict]:
    """Greedy or seeded acceptance of a draft that never left the device.

    Args:
        choices: ``[K + 1]`` the target's picks (argmax, or Gumbel-argmax for a seeded reply)
            after the pending token and after each drafted token.
        target_ok: 0-d bool, the target's logits finite.
        draft_picks: ``[K]`` drafted ids, fed to the target's pass from the device.
        draft_ok: 0-d bool, the draft's logits finite.

    Returns the ``[K]`` drafted ids on the host and the verdict. The draft, the choices and both
    flags come back in **one** transfer: a round on a card then waits for it once, not once
    after drafting and again after verifying. NaN or inf logits raise
    :class:`~engine.errors.NonFiniteLogitsError`, the draft's first (role ``"draft"``: the
    decoder drops it and verifies without it).
    """
    k = draft_picks.numel()
    flags = torch.stack([draft_ok, target_ok]).long()
    host = torch.cat([draft_picks.reshape(-1).long(), choices.reshape(-1).long(), flags]).tolist()
    if not host[-2]:
        raise non_finite_error("draft")
    if not host[-1]:
        raise non_finite_error("target")
    drafted = [int(x) for x in host[:k]]
    return drafted, _accept_matching(host[k:-2], drafted)


def _accept_matching(choices: Sequence[int], draft_tokens: Sequence[int]) -> Verdict:
    """Accept drafted tokens while they equal the target's ``[K + 1]`` choices."""
    n = 0
    while n < len(draft_tokens) and draft_tokens[n] == choices[n]:
        n += 1
    return Verdict(n, int(choices[n]))


def verify_sampled(
    p: torch.Tensor,
    draft_tokens: Sequence[int],
    q: torch.Tensor | None,
    generator: torch.Generator | None,
    device: Device,
) -> Verdict:
    """Rejection sampling against the target's warped distribution.

    Args:
        p: ``[K + 1, V]`` target probabilities (already warped).
        draft_tokens: ``[K]`` drafted ids.
        q: ``[K, V]`` the draft probabilities each token was sampled from
            (warped the same way, zero-padded to ``V``), or None for a
            deterministic proposal (one-hot).
        generator: the reply's random generator.

    ``p`` is checked for NaN first (one transfer), so that ``multinomial`` never sees it.
    """
    check_finite(p)
    for i, x in enumerate(draft_tokens):
        p_x = float(p[i, x])
        q_x = float(q[i, x]) if q is not None else 1.0
        if q_x > 0 and uniform(generator, device) < min(1.0, p_x / q_x):
            continue
        return Verdict(i, sample(residual(p[i], q[i] if q is not None else None, x), generator))
    return Verdict(len(draft_tokens), sample(p[len(draft_tokens)], generator))


def residual(p: torch.Tensor, q: torch.Tensor | None, x: int) -> torch.Tensor:
    """``norm(max(0, p - q))`` over ``[V]``; ``q`` None means one-hot on ``x``.

    When ``p == q`` nothing is left (a rejection then has probability zero, so
    this only guards rounding); fall back to ``p``.
    """
    if q is None:
        r = p.clone()
        r[x] = 0.0
    else:
        r = torch.clamp(p - q, min=0.0)
    total = float(r.sum())
    return r / total if total > 0 else p
