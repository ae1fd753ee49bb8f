"""Drafters: cheap guesses at the target's next K tokens.

A :class:`Drafter` proposes up to K tokens (with the probabilities it drew them
from) and is told afterwards which sequence was accepted. Two kinds:

* :class:`ModelDrafter`: a small causal LM sharing the target's tokenizer; it
  owns its own :class:`~engine.decode.runner.ModelRunner` (and KV cache), and may hold
  a :class:`NgramDrafter` as its ``lookup``: the decoder then takes the
  lookup's free copy instead of the model's draft in rounds where the measured
  costs say the copy pays (:meth:`engine.decode.cost_model.CostModel.lookup_pays`).
* :class:`NgramDrafter`: prompt-lookup decoding, no model at all: find the most
  recent earlier occurrence of the context's last few tokens and propose what
  followed it. Strong when the reply repeats its input (code edits, summaries).
"""
from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
from transformers import PreTrainedModel

from engine.model.device import Device
from engine.events import DraftOrigin, SamplingParams
from engine.decode.runner import ModelRunner
from engine.decode.sampling import GumbelNoise, Randomness, finite, gumbel_argmax, sample_on_device, to_host, warp


@dataclass(frozen=True)
class Draft:
    """Proposed tokens ``[n]`` (``n <= K``) and, for a sampling model drafter,
    the ``[n, V]`` probabilities each was drawn from (None = deterministic; ``V`` the
    target's vocabulary, see :class:`ModelDrafter`'s ``vocab_limit``).

    ``key`` groups proposals whose acceptance behaves alike, so it is measured
    separately (the n-gram drafter uses the length of the matched suffix: a
    3-token match is accepted far more often than a 1-token one). ``origin`` says
    who proposed it, for the HUD.
    """

    tokens: tuple[int, ...]
    probs: torch.Tensor | None = None
    key: int = 0
    origin: DraftOrigin = "model"

    def first(self, k: int) -> "Draft":
        """The first ``k`` proposals (the draft itself when it has no more)."""
        if len(self.tokens) <= k:
            return self
        return Draft(self.tokens[:k], self.probs[:k] if self.probs is not None else None, self.key, self.origin)


EMPTY_DRAFT = Draft(())


@dataclass(frozen=True)
class DeviceDraft:
    """A model's draft not yet read back: ``picks`` ``[k]`` long ids, ``ok`` a 0-d bool (every
    step's logits finite), ``probs`` ``[k, V]`` for a sampled draft, else None; all on the device."""

    picks: torch.Tensor
    ok: torch.Tensor
    probs: torch.Tensor | None = None


class Drafter(Protocol):
    """What the decoder needs from a drafter."""

    name: str
    kind: Literal["model", "ngram"]
    free_proposals: bool
    """True when proposing costs (nearly) nothing: the decoder then asks for
    ``k_max`` tokens and trims the proposal to the K that pays."""

    def propose(
        self,
        context: Sequence[int],
        k: int,
        sampling: SamplingParams,
        generator: Randomness,
    ) -> Draft:
        """Propose up to ``k`` tokens to follow ``context`` (``[L]`` ids).

        ``generator`` is the reply's randomness: a ``torch.Generator`` to sample
        from, or (seeded) the reply's :class:`~engine.decode.sampling.GumbelNoise`,
        whose row for sequence index ``len(context) + i`` the ``i``-th proposed
        token must be chosen with; None when greedy.
        """
        ...

    def prefill(self, context: Sequence[int], cancel: threading.Event | None = None) -> None:
        """Read a new prompt ``[L]`` ahead of the first round (all but its last token); a model
        draft stops between two pieces once ``cancel`` is set (Esc while it reads a long prompt)."""
        ...

    def commit(self, context: Sequence[int]) -> None:
        """``context`` is now the accepted sequence: drop anything rejected."""
        ...

    def release(self) -> None:
        """Free the drafter's memory; it is not used again."""
        ...


class ModelDrafter:
    """Drafts with a small causal LM (greedy, or sampled with the reply's warping)."""

    kind: Literal["model"] = "model"
    free_proposals = False

    def __init__(
        self, model: PreTrainedModel, device: Device, name: str = "draft model",
        vocab_subset: torch.Tensor | None = None, vocab_limit: int | None = None,
        lookup: "NgramDrafter | None" = None,
    ) -> None:
        """``vocab_subset``: token ids ``[n]`` the draft may propose (FR-Spec: a head over
        frequent tokens costs a fraction of the full one; verification still uses
        the target's full distribution, so output stays exact). ``vocab_limit``: the
        target's vocabulary size when it differs from the draft's (tokenizers with
        padded heads): no id at or past it is proposed, and the draft's
        probabilities come as ``[k, vocab_limit]``, cut or zero-padded. ``lookup``: an
        n-gram drafter the decoder may ask first (it is fed with the model's context)."""
        self.runner = ModelRunner(model, device)
        self.name = name
        if vocab_subset is not None and self.runner.restrict_vocab(vocab_subset):
            self.name = f"{name}, {len(vocab_subset)}-token head"
        self.vocab_limit = vocab_limit
        self.lookup = lookup
        if lookup is not None:
            self.name = f"{self.name}, n-gram lookup first"

    def propose(
        self,
        context: Sequence[int],
        k: int,
        sampling: SamplingParams,
        generator: Randomness,
    ) -> Draft:
        """Run the draft model ``k`` steps from ``context``.

        Greedy: argmax. Seeded: the Gumbel-argmax with the target's noise for
        each position (no probabilities returned: acceptance is by equality).
        Otherwise sampled from the warped draft distribution.

        The draft's cache catches up here: tokens of ``context`` it has not seen
        (the target's last token, and the last drafted token when all K were
        accepted) are fed in the first step.

        The picks stay on the device and feed the next step there; they, and
        whether every step's logits were finite, come to the host in one
        transfer at the end (a CUDA draft would otherwise wait for the card at
        every token). NaN or inf logits raise
        :class:`~engine.errors.NonFiniteLogitsError` (role ``"draft"``).
        """
        if k <= 0:
            return EMPTY_DRAFT
        drafted = self.draft_on_device(context, k, sampling, generator)
        tokens = to_host(drafted.picks, drafted.ok, role="draft")
        self.settle(tokens)
        return Draft(tuple(tokens), drafted.probs)

    def draft_on_device(self, context: Sequence[int], k: int, sampling: SamplingParams,
                        generator: Randomness) -> "DeviceDraft":
        """:meth:`propose`'s ``k >= 1`` steps without the read-back: the picks ``[k]``, their
        finiteness and probabilities stay on the device (a decoder that verifies them there
        reads everything back once a round, then calls :meth:`settle`)."""
        kept = self.runner.sync(context, leave=1)
        logits = self.runner.forward(context[kept:], logits_to_keep=1)[-1]
        picks: list[torch.Tensor] = []
        probs: list[torch.Tensor] = []
        ok = finite(logits)
        for i in range(k):
            logits = self.masked(logits)
            if sampling.greedy:
                token = torch.argmax(logits)
            elif isinstance(generator, GumbelNoise):
                token = gumbel_argmax(logits, sampling, generator.row(len(context) + i))
            else:
                dist = warp(logits, sampling)
                token = sample_on_device(dist, generator)  # never a device-side assert on NaN
                probs.append(dist)
            picks.append(token)
            if i + 1 < k:
                logits = self.runner.forward(token.reshape(1), logits_to_keep=1)[-1]
                ok = ok & finite(logits)
        return DeviceDraft(torch.stack(picks).reshape(-1), ok, self._fit_vocab(torch.stack(probs)) if probs else None)

    def settle(self, tokens: Sequence[int]) -> None:
        """The ``[k]`` picks of the last :meth:`draft_on_device`, read back: the runner holds all
        but the last as device ids until it is told them."""
        self.runner.resolve_pending(tokens[: len(tokens) - 1])

    def masked(self, logits: torch.Tensor) -> torch.Tensor:
        """``[..., V]`` logits with the ids past the target's vocabulary at ``-inf`` (where the draft's
        head is wider: padding rows)."""
        if self.vocab_limit is not None and logits.shape[-1] > self.vocab_limit:
            logits = logits.clone()
            logits[self.vocab_limit :] = float("-inf")
        return logits

    def _fit_vocab(self, q: torch.Tensor) -> torch.Tensor:
        """Draft probabilities ``[k, V_draft]`` as ``[k, vocab_limit]`` (cut or zero-padded)."""
        if self.vocab_limit is None or q.shape[-1] == self.vocab_limit:
            return q
        if q.shape[-1] > self.vocab_limit:
            return q[:, : self.vocab_limit]
        return torch.nn.functional.pad(q, (0, self.vocab_limit - q.shape[-1]))

    def prefill(self, context: Sequence[int], cancel: threading.Event | None = None) -> None:
        """Feed the prompt (all but its last token) past what the cache shares with it, in pieces,
        stopping between two once ``cancel`` is set (the next reply's catch-up reads the rest)."""
        self.runner.catch_up(context, cancel)
        if self.lookup is not None:
            self.lookup.prefill(context)

    def commit(self, context: Sequence[int]) -> None:
        """Crop the draft cache to what was accepted (after a lookup's round the cache lags
        behind; the next :meth:`propose` feeds what it missed in one pass)."""
        self.runner.sync(context, leave=0)
        if self.lookup is not None:
            self.lookup.commit(context)

    def release(self) -> None:
        self.runner.release()
        if self.lookup is not None:
            self.lookup.release()


MATCH_BUCKETS = (1, 2, 3, 4, 8, 16)
"""Match lengths that key the n-gram drafter's acceptance statistics (a match is
counted back to at most the last bucket)."""


class NgramDrafter:
    """Prompt-lookup decoding over the prompt and the reply so far.

    For ``n`` from ``max_ngram`` down to ``min_ngram``, the last ``n`` tokens
    are looked up among earlier positions of the context (the most recent
    occurrence wins) and up to ``k`` tokens that followed are proposed. The
    decoder asks for ``k_max`` and keeps as many as the fitted verification
    cost pays for at this draft's acceptance, which is measured per draft
    position and per **match length**: the match is counted backwards past
    ``max_ngram`` (up to ``MATCH_BUCKETS[-1]`` tokens) and bucketed into
    ``Draft.key``, so a copy in progress (a long match, accepted nearly always)
    is told apart from a chance 1-token match.

    Cost. An index maps every n-gram of the context to the position after its
    latest occurrence. :meth:`prefill` compares the new prompt with what is
    indexed, O(L) once per reply, and re-indexes from scratch if they differ
    (O(L * max_ngram) dict updates). :meth:`propose` and :meth:`commit` rely
    on the context growing by appending, as it does within a reply: they check
    the last ``max_ngram`` indexed tokens and index only the new tokens
    (O(new * max_ngram)); a lookup is at most ``max_ngram`` dict probes plus
    ``MATCH_BUCKETS[-1]`` comparisons. A context that diverged anywhere else
    between two prefills is not noticed; the decoder never does that.
    """

    kind: Literal["ngram"] = "ngram"
    free_proposals = True

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.name = "n-gram lookup"
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self._ids: list[int] = []
        self._index: dict[tuple[int, ...], int] = {}
        self._indexed = 0  # n-grams ending before this position are indexed
        self.last_match = 0
        """How many tokens the last proposal's match covered (0: none; counted to ``MATCH_BUCKETS[-1]``)."""

    def propose(
        self,
        context: Sequence[int],
        k: int,
        sampling: SamplingParams,
        generator: Randomness,
    ) -> Draft:
        """Up to ``k`` tokens that followed the longest matching suffix of ``context``
        (``[L]`` ids), keyed by the match length's bucket (may be empty)."""
        self.last_match = 0
        if k <= 0:
            return EMPTY_DRAFT
        self._extend(context)
        ids = self._ids
        for n in range(min(self.max_ngram, len(ids)), self.min_ngram - 1, -1):
            start = self._index.get(tuple(ids[-n:]))
            if start is not None:
                self.last_match = self._match_length(start, n)
                return Draft(tuple(ids[start : start + k]), key=match_key(self.last_match), origin="chat")
        return EMPTY_DRAFT

    def _match_length(self, start: int, n: int) -> int:
        """How many tokens before ``start`` equal the context's last ones (at least ``n``)."""
        ids, end, longest = self._ids, len(self._ids), MATCH_BUCKETS[-1]
        m = n
        while m < longest and start - m - 1 >= 0 and ids[start - m - 1] == ids[end - m - 1]:
            m += 1
        return m

    def _extend(self, context: Sequence[int], full_check: bool = False) -> None:
        """Index what ``context`` added; start over if it does not extend the indexed ids."""
        have = len(self._ids)
        tail = max(have - self.max_ngram, 0) if not full_check else 0
        if len(context) < have or list(context[tail:have]) != self._ids[tail:]:
            self._ids, self._index, self._indexed = [], {}, 0
            have = 0
        self._ids.extend(context[have:])
        ids = self._ids
        # An n-gram ending at position j has the follower j + 1 when j + 1 < L.
        for j in range(self._indexed, len(ids) - 1):
            for n in range(self.min_ngram, min(self.max_ngram, j + 1) + 1):
                self._index[tuple(ids[j - n + 1 : j + 1])] = j + 1
        self._indexed = max(self._indexed, len(ids) - 1)

    def prefill(self, context: Sequence[int], cancel: threading.Event | None = None) -> None:
        """Index the prompt ``[L]`` (compared in full with what is indexed; quick: ``cancel`` unused)."""
        self._extend(context, full_check=True)

    def commit(self, context: Sequence[int]) -> None:
        """Index the accepted tokens (nothing to crop: rejected drafts were never indexed)."""
        self._extend(context)

    def release(self) -> None:
        self._ids, self._index, self._indexed = [], {}, 0


def match_key(length: int) -> int:
    """The bucket of :data:`MATCH_BUCKETS` a match of ``length`` tokens falls in."""
    return max(b for b in MATCH_BUCKETS if b <= max(length, 1))
