"""What a chain of rounds drafts with (:mod:`engine.decode.chain`), on the device, without the host.

* :class:`ModelChainDraft`: the draft model's pass over ``[x_{p-1}, x_p]`` and its ``K`` greedy
  steps, one captured graph (:meth:`~engine.decode.device_passes.DevicePositionPasses.draft_at`).
* :class:`DeviceLookup`: prompt lookup (:class:`~engine.decode.drafters.NgramDrafter`'s rule) over a
  copy of the sequence kept on the device. For ``n`` from ``max_ngram`` down to ``min_ngram``, the
  latest ``j < p`` whose ``n`` tokens ending at ``j`` equal those ending at ``p`` (one
  comparison over the whole buffer per token of the n-gram: ``ids.roll(t)[j] = ids[j - t]``);
  the draft is ``ids[j + 1 .. j + K]``, cut where it would pass ``p`` (``-1``: nothing proposed
  there, never accepted). The same proposal as the host's lookup, token for token
  (``tests/engine/decode/test_chain_lookup.py``), so that on a card an n-gram round costs its
  verification only, and rounds chain as a model draft's do.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from engine.decode.drafters import MATCH_BUCKETS, ModelDrafter, NgramDrafter
from engine.decode.prefix import common_prefix_length
from engine.events import DraftOrigin
from engine.model.device import Device

SLACK = 1
"""Positions a lookup's buffer holds past the cache's window: a round writes its ``K + 1`` choices
at ``p + 1 .. p + K + 1``, and the last may fall one past the last position the caches write."""


class ChainDrafting(Protocol):
    """A chain's drafter on the device."""

    origin: DraftOrigin

    def begin(self, seq: Sequence[int]) -> None:
        """Host, before a chain queued from the host after ``seq`` (``[L]`` ids): bring the state to it."""
        ...

    def draft(self, fed: torch.Tensor, p: torch.Tensor, k: int, end: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The round's draft after ``fed`` = ``[x_{p-1}, x_p]`` (``p`` 0-d: the pending token's position):
        ``[k]`` ids (``-1``: none proposed there), the logits' finiteness (0-d bool) and a key
        (0-d long, what the acceptance is measured by), all on the device."""
        ...

    def kept(self, p: torch.Tensor, choices: torch.Tensor) -> None:
        """Device: the target's ``[K + 1]`` choices after ``x_p`` (the round's tokens and beyond)."""
        ...

    def wrote(self, seq: Sequence[int], tokens: Sequence[int]) -> None:
        """Host, after a chain after ``seq`` was read: it gave ``tokens``."""
        ...


class ModelChainDraft:
    """A draft model's rounds in a chain (its runner holds all but the last two tokens between rounds)."""

    origin: DraftOrigin = "model"

    def __init__(self, drafter: ModelDrafter) -> None:
        self.drafter = drafter

    def begin(self, seq: Sequence[int]) -> None:
        draft = self.drafter.runner
        kept = draft.sync(seq, leave=2)
        if kept < len(seq) - 2:  # after a lookup's round or a calibration burst the draft lags behind
            draft.prefill(seq[kept : len(seq) - 2])

    def draft(self, fed: torch.Tensor, p: torch.Tensor, k: int, end: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        drafted, ok = self.drafter.runner.draft_at(fed, p - 1, k, end, self.drafter.masked)
        return drafted, ok, torch.zeros_like(p)

    def kept(self, p: torch.Tensor, choices: torch.Tensor) -> None:
        return None

    def wrote(self, seq: Sequence[int], tokens: Sequence[int]) -> None:
        self.drafter.runner.wrote([*seq[-2:], *tokens][: len(tokens)])


class DeviceLookup:
    """:class:`~engine.decode.drafters.NgramDrafter`'s proposals from a copy of the sequence on the device.

    ``ids`` ``[window + SLACK]``: position ``i`` holds the sequence's token ``i`` for every ``i``
    up to the pending token (uploaded by :meth:`begin` where the host's copy differs, written by
    each chained round after that); :attr:`held` is what the host knows it holds."""

    origin: DraftOrigin = "chat"

    def __init__(self, lookup: NgramDrafter, window: int, device: Device) -> None:
        self.max_ngram, self.min_ngram = lookup.max_ngram, lookup.min_ngram
        self.device = device
        on = device.torch_device
        self.ids = torch.zeros(window + SLACK, dtype=torch.long, device=on)
        self.positions = torch.arange(window + SLACK, device=on)
        self.back = torch.arange(max(MATCH_BUCKETS[-1], self.max_ngram), device=on)  # counted back this far
        self.held: list[int] = []

    def begin(self, seq: Sequence[int]) -> None:
        if len(seq) > self.ids.shape[0] - SLACK:
            raise ValueError(f"{len(seq)} tokens do not fit a lookup of {self.ids.shape[0] - SLACK}")
        same = common_prefix_length(self.held, seq)
        if same < len(seq):
            self.ids[same : len(seq)] = self.device.ids_tensor(seq[same:]).reshape(-1)
        self.held = list(seq)

    @torch.inference_mode()
    def draft(self, fed: torch.Tensor, p: torch.Tensor, k: int, end: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ids, pos = self.ids[:end], self.positions[:end]  # every position the chain reads lies below end
        ending = ids.index_select(0, (p - self.back[: self.max_ngram]).clamp(min=0))  # x_p, x_{p-1}, ...
        same = pos < p  # j: the n-gram ending at j has a follower at j + 1 <= p
        latest: list[torch.Tensor] = []
        for t in range(self.max_ngram):  # same[j]: tokens j - t .. j equal tokens p - t .. p
            same = same & (ids.roll(t) == ending[t])  # roll(t)[j] = ids[j - t]; j < t is masked below
            if t + 1 >= self.min_ngram:
                latest.append(torch.where(same & (pos >= t), pos, -1).amax())  # the latest occurrence
        best = latest[-1]
        for shorter in reversed(latest[:-1]):  # the longest n-gram that occurred before wins
            best = torch.where(best < 0, shorter, best)
        src = best + 1 + self.positions[:k]
        drafted = torch.where((best >= 0) & (src <= p), self.ids.index_select(0, src.clamp(max=end - 1)), -1)
        return drafted, torch.ones((), dtype=torch.bool, device=p.device), self._match_length(best, p)

    def _match_length(self, best: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """Tokens ending at ``best`` equal to those ending at ``p``, counted back up to
        ``MATCH_BUCKETS[-1]`` (0 where nothing matched): :meth:`NgramDrafter._match_length`."""
        back = self.back[: MATCH_BUCKETS[-1]]
        mine, theirs = best - back, p - back
        same = (mine >= 0) & (ids_at(self.ids, mine) == ids_at(self.ids, theirs)) & (best >= 0)
        return same.long().cumprod(0).sum()

    def kept(self, p: torch.Tensor, choices: torch.Tensor) -> None:
        self.ids.index_copy_(0, p + 1 + self.positions[: choices.shape[0]], choices)

    def wrote(self, seq: Sequence[int], tokens: Sequence[int]) -> None:
        self.held = [*seq, *tokens]


def ids_at(ids: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """``ids[where]`` with positions below 0 read as position 0 (the caller masks them)."""
    return ids.index_select(0, where.clamp(min=0))
