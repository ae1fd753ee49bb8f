"""Chains of speculative rounds decided on the device and read back once (issue 35, item 3).

On a card a round of speculation is short: a model draft's K one-token passes and the target's
pass over K + 1 tokens, about a millisecond for docs/gpu.md's pair. A round that waits for the
card at its end leaves the card idle while the host reads the verdict and queues the next one,
and that host time (about 1 ms on an H200) is as long as the round's kernels. Plain decoding
hides the host by bursts (:data:`~engine.decode.decoder.BURST`); this module does the same for
greedy speculation: ``R`` rounds are queued back to back, every decision is made on the card, and
the host reads all of them back in one transfer. The rounds draft with a model (its captured
steps) or a prompt lookup over a copy of the sequence on the card (:mod:`engine.decode.chain_drafts`).

It can because over a :class:`~engine.model.kv.StaticKV` a pass writes its keys at positions held
in a device tensor and attends under a causal mask, so a cache is cropped by moving a position,
with nothing copied. On the device the chain keeps:

* ``tail`` ``[2 + R·(K+1)]``: the sequence from position ``p0 - 1`` on (``p0 = L - 1`` is the
  pending token's position when the chain starts), filled in as rounds accept tokens;
* ``at``: the tail's index of the pending token, whose position is ``p = p0 - 1 + at``.

A round, with ``p`` the pending token's position:

1. the draft's pass over the tail's last two tokens ``[x_{p-1}, x_p]`` at ``p - 1, p``, then
   ``K - 1`` one-token passes: its picks ``d_1 .. d_K`` (argmax);
2. the target's pass over ``[x_p, d_1 .. d_K]`` at ``p .. p + K``: its choices ``c_0 .. c_K``;
3. ``n = Σ_i Π_{j<=i} [d_j = c_{j-1}]``, the longest agreeing prefix; the tail gets
   ``c_0 .. c_K`` at ``p + 1 ..`` (``c_0 .. c_n`` are the round's tokens, ``d_1 .. d_n`` and the
   target's own ``c_n``; the next round overwrites the rest); ``p += n + 1``.

Invariants from round to round, with no host in between: the target holds every position below
``p`` (its pass wrote ``x_p, d_1 .. d_n`` there, all accepted); a draft model holds every
position below ``p - 1`` (it wrote ``d_j`` at ``p + j`` for ``j < K``, and ``n <= K``); a
lookup's copy of the sequence holds every position up to ``p`` (each round writes ``c_0 .. c_K``
at ``p + 1 ..``, and ``c_0 .. c_n`` are the sequence). A lookup proposes ``-1`` where it found
nothing (fed as token 0, never accepted), so every round verifies ``K + 1`` tokens. Keys written past
them are never visible (the mask hides every key after a row's own position), and the next
pass there overwrites them.

The reply is the one a round at a time gives: the target's passes are the same (``[x_p, d_1 ..
d_K]`` at the same positions), and so are the argmax and the acceptance rule
(:func:`~engine.decode.verify.verify_greedy`); on a card, up to floating-point near-ties
(docs/gpu.md), as any verify width is. Only the draft's first pass differs, always feeding two
tokens where a round at a time feeds one or two: that may change a draft by rounding, never the
reply.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from engine.environment import whole
from engine.decode.chain_drafts import ChainDrafting, ModelChainDraft
from engine.decode.drafters import ModelDrafter, NgramDrafter
from engine.decode.runner import ModelRunner
from engine.decode.sampling import non_finite_error
from engine.model.device import Device, Mark

CHAIN_ROUNDS = 8
"""Speculative rounds a chain queues before it reads back, on a card. More hides more of the
host's round (its read-back and bookkeeping); fewer wastes less past a stop token (at most
``R·(K+1) - 1`` tokens are computed and cropped). The CPU's passes are synchronous: one round."""
ENV = "SPECCHAT_CHAIN"
"""Rounds a chain queues: ``0`` or ``1`` turns chains off, a number sets ``R`` (on the CPU too,
over a static cache: the tests)."""


def chain_rounds(is_cuda: bool) -> int:
    """``R`` for a decoder on a card (``is_cuda``) or not: ``SPECCHAT_CHAIN`` where set, else
    :data:`CHAIN_ROUNDS` on a card and 1 on the CPU."""
    value = whole(ENV, 0)
    if value is not None:
        return max(1, value)
    return CHAIN_ROUNDS if is_cuda else 1


def chains_allowed(target: ModelRunner, drafter: object) -> bool:
    """Whether rounds can chain on the device: the target keeps a static cache, and so does a
    model draft's runner; a prompt lookup (:class:`NgramDrafter` itself) drafts on the device too."""
    if not target.static:
        return False
    if type(drafter) is NgramDrafter:
        return True
    runner = getattr(drafter, "runner", None)
    return isinstance(drafter, ModelDrafter) and isinstance(runner, ModelRunner) and runner.static


@dataclass(frozen=True)
class ChainedRound:
    """One round of a chain: its tokens (the accepted drafts, then the target's own), how many
    drafts were accepted, the device seconds its draft and its verification took, and what it drafted."""

    tokens: tuple[int, ...]
    accepted: int
    draft_s: float
    verify_s: float
    proposed: int
    """Drafted tokens the round verified (a lookup may find fewer than K, or none)."""
    key: int = 0
    """A lookup's match length (:data:`~engine.decode.drafters.MATCH_BUCKETS`); 0 for a model draft."""


@dataclass
class QueuedChain:
    """A chain whose passes are queued on the device and not read back yet (:func:`queue_chain`).

    ``tail``, ``at`` and ``base`` (the position of ``tail[0]``, 0-d) are its device state after its
    last round, from which a next chain can be queued before this one is read
    (:func:`queue_chain`'s ``after``)."""

    k: int
    rounds: int
    tail: torch.Tensor
    at: torch.Tensor
    base: torch.Tensor
    read: Callable[[], list[int]]
    marks: list[Mark]

    @property
    def most(self) -> int:
        """The most tokens its rounds can give: ``R·(K+1)``."""
        return self.rounds * (self.k + 1)


@torch.inference_mode()
def queue_chain(target: ModelRunner, drafting: ChainDrafting, device: Device, k: int, rounds: int,
                seq: Sequence[int], after: QueuedChain | None = None) -> QueuedChain:
    """Queue ``rounds`` greedy rounds of ``k`` drafted tokens on the device, reading nothing back.

    Either after ``seq`` (``[L]`` ids, ``L >= 2``; the target's cache holds all but the last; the
    drafting is brought to it here: a draft model's cache to all but the last two tokens), or
    ``after`` a chain queued before and not read yet: this one goes on from that one's device
    state, so the card runs the two back to back while the host reads the first
    (:func:`read_chain` waits for that chain's own transfer only). There ``seq`` is the context
    ``after`` started from: its positions bound this chain's from the host's knowledge, not from a
    bound on ``after``'s (which would drift by the tokens each chain could have given and did not)."""
    if k < 1 or rounds < 1:
        raise ValueError(f"a chain needs K >= 1 and a round (got {k}, {rounds})")
    width = k + 1
    on = device.torch_device
    last_two = torch.arange(-1, 1, device=on)
    tail = torch.zeros(2 + rounds * width, dtype=torch.long, device=on)
    if after is None:
        if len(seq) < 2:
            raise ValueError("a chain needs 2 or more tokens of context")
        if len(target) != len(seq) - 1:
            raise AssertionError(f"target cache holds {len(target)} tokens, expected {len(seq) - 1}")
        drafting.begin(seq)
        tail[:2] = device.ids_tensor(seq[-2:]).reshape(-1)
        base = torch.full((), len(seq) - 2, dtype=torch.long, device=on)
        end = len(seq) - 1 + rounds * width
    else:  # seq: the context ``after`` goes on from (its own tokens not read yet)
        tail[:2] = after.tail.index_select(0, after.at + last_two)
        base = after.base + after.at - 1
        end = len(seq) - 1 + after.most + rounds * width
    at = torch.ones((), dtype=torch.long, device=on)
    behind = torch.arange(1, width + 1, device=on)
    counts = torch.zeros(3, rounds, dtype=torch.long, device=on)  # accepted, proposed, key: a row each
    draft_ok = target_ok = torch.ones((), dtype=torch.bool, device=on)
    marks = [device.mark()]
    for r in range(rounds):
        fed = tail.index_select(0, at + last_two)  # [x_{p-1}, x_p]
        p = base + at  # the pending token's position
        drafted, ok, key = drafting.draft(fed, p, k, end)  # -1: nothing proposed there
        draft_ok = draft_ok & ok
        marks.append(device.mark())
        verified = torch.cat([fed[1:], drafted.clamp(min=0)])
        best, choices = target.pass_at(verified, p, end, width).max(dim=-1)
        target_ok = target_ok & torch.isfinite(best).all()
        n = (choices[:k] == drafted).long().cumprod(0).sum()
        tail.index_copy_(0, at + behind, choices)
        drafting.kept(p, choices)
        counts[:, r] = torch.stack([n, (drafted >= 0).long().sum(), key])
        at = at + n + 1
        marks.append(device.mark())
    read = device.start_read(torch.cat([tail, counts.reshape(-1), torch.stack([draft_ok, target_ok]).long()]))
    return QueuedChain(k, rounds, tail, at, base, read, marks)


def read_chain(target: ModelRunner, drafting: ChainDrafting, device: Device, queued: QueuedChain,
               seq: Sequence[int]) -> list[ChainedRound]:
    """Wait for ``queued``'s transfer (not for a chain queued after it) and take its rounds, which
    follow ``seq`` (``[L]`` ids: the target's cache holds all but the last). Returns the rounds in
    order; their tokens, joined, extend ``seq`` (``R <= n <= R·(K+1)`` ids). The target and the
    drafting are then told what the chain wrote (:meth:`ModelRunner.wrote`): the target holds all
    of the new sequence but its last token; the caller crops at a stop token as after any round.
    NaN or inf logits raise :class:`~engine.errors.NonFiniteLogitsError` (the draft's first) with
    both runners as they were."""
    host = queued.read()
    if not host[-2]:
        raise non_finite_error("draft")
    if not host[-1]:
        raise non_finite_error("target")
    if len(target) != len(seq) - 1:
        raise AssertionError(f"target cache holds {len(target)} tokens, expected {len(seq) - 1}")
    seconds = device.seconds_between(queued.marks)
    r_n = queued.rounds
    size = len(host) - 3 * r_n - 2
    accepted, proposed, keys = (host[size + i * r_n : size + (i + 1) * r_n] for i in range(3))
    chain: list[ChainedRound] = []
    begin = 2
    for r in range(r_n):
        n = int(accepted[r])
        chain.append(ChainedRound(tuple(int(t) for t in host[begin : begin + n + 1]), n, seconds[2 * r],
                                  seconds[2 * r + 1], int(proposed[r]), int(keys[r])))
        begin += n + 1
    tokens = [int(t) for t in host[2:begin]]
    target.wrote([seq[-1], *tokens[:-1]])
    drafting.wrote(seq, tokens)
    return chain


def chained_rounds(target: ModelRunner, drafter: ModelDrafter, device: Device, seq: Sequence[int], k: int,
                   rounds: int) -> list[ChainedRound]:
    """:func:`queue_chain` after ``seq`` with a model draft, then :func:`read_chain`: ``rounds`` rounds read back once."""
    drafting = ModelChainDraft(drafter)
    return read_chain(target, drafting, device, queue_chain(target, drafting, device, k, rounds, seq), seq)
