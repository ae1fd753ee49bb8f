"""Passes at positions only the device knows: a chain of rounds' half of :class:`~engine.decode.runner.ModelRunner`.

A chain of rounds (:mod:`engine.decode.chain`) queues several draft-and-verify rounds on a card
without reading back between them, so where each pass writes is a device tensor, not the
runner's length. These passes write the static cache but move neither :attr:`ids` nor the cache's
length; :meth:`DevicePositionPasses.wrote` takes what the chain kept, once it was read back. The
runner stays the one owner of its cache: this is a mixin of it, kept apart to keep each module
readable in one sitting.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from engine.errors import ContextLengthError
from engine.model.capture import PassCapture, attention_span
from engine.model.device import Device
from engine.model.kv import StaticKV

if TYPE_CHECKING:
    from engine.model.lean import LeanForward


class DevicePositionPasses:
    """:meth:`pass_at`, :meth:`draft_at` and :meth:`wrote`, for :class:`~engine.decode.runner.ModelRunner`."""

    cache: object
    capture: PassCapture
    device: Device
    _lean: "LeanForward | None"
    _ids: list[int]

    if TYPE_CHECKING:  # the runner's own
        def __len__(self) -> int: ...
        def resolve_pending(self, known: Sequence[int] | None = None) -> None: ...
        def _note_compile_failure(self) -> None: ...

    @torch.inference_mode()
    def pass_at(self, new_ids: torch.Tensor, start: torch.Tensor, end: int, keep: int) -> torch.Tensor:
        """A pass over the static cache at a position only the device knows (a chain of rounds,
        :mod:`engine.decode.chain`), captured where its shape is.

        Args:
            new_ids: ``[T]`` long ids on the device, written at positions ``start .. start + T - 1``.
            start: 0-d long tensor on the device.
            end: a bound on the chain's positions, plus one: the pass attends over the first
                :func:`~engine.model.capture.attention_span` ``(end)`` keys.
            keep: rows of logits to return.
        Returns:
            ``[keep, V]`` float32 logits of the last ``keep`` rows.

        Neither :attr:`ids` nor the cache's length move: the chain says what it kept afterwards
        (:meth:`wrote`). Keys it wrote past that are never visible (a static cache's mask hides
        every key after a row's own position) and the next pass there overwrites them."""
        lean, cache, span = self._chain_span(end)
        ids = new_ids.reshape(1, -1)
        with self.device.attention_kernels():
            logits = self.capture.run_span(lean.static_pass, cache, ids, start, span, keep)
            if logits is None:
                positions = torch.arange(ids.shape[1], device=ids.device) + start
                logits = lean.static_pass(ids, cache, positions, keep, span)
        self._note_compile_failure()
        return logits[0].float()

    @torch.inference_mode()
    def draft_at(self, fed: torch.Tensor, start: torch.Tensor, k: int, end: int,
                 masked: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """A draft's ``k >= 1`` greedy steps at a position only the device knows (a chain of rounds):
        its pass over ``fed`` ``[2]`` (``[x_{p-1}, x_p]``) at ``start, start + 1`` (``start`` 0-d long),
        then ``k - 1`` one-token passes, each fed the pick before it. ``masked`` cuts a row of logits
        ``[V]`` to the target's vocabulary. Returns the picks ``[k]`` and whether every row of logits
        was finite (0-d bool), on the device; captured as one graph where capture is on, so the
        whole draft is one launch. Lengths and ids move as for :meth:`pass_at` (they do not)."""
        lean, cache, span = self._chain_span(end)

        def steps(ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
            logits = lean.static_pass(ids, cache, positions, 1, span)[0, -1].float()
            picks: list[torch.Tensor] = []
            ok = torch.ones((), dtype=torch.bool, device=ids.device)
            for i in range(k):
                logits = masked(logits)
                ok = ok & torch.isfinite(logits.amax())
                picks.append(torch.argmax(logits).reshape(1))
                if i + 1 < k:
                    logits = lean.static_pass(picks[-1].reshape(1, 1), cache, positions[1:] + (i + 1), 1, span)[0, -1].float()
            return torch.cat([*picks, ok.long().reshape(1)])

        ids = fed.reshape(1, -1)
        with self.device.attention_kernels():
            out = self.capture.run_steps(steps, cache, ids, start, span, k)
            if out is None:
                out = steps(ids, torch.arange(ids.shape[1], device=ids.device) + start)
        self._note_compile_failure()
        return out[:k], out[k].bool()

    def _chain_span(self, end: int) -> tuple["LeanForward", StaticKV, int]:
        """The lean forward, the static cache and the span of keys a pass at device positions below
        ``end`` attends over (:meth:`pass_at`, :meth:`draft_at`); a clear error where there is no
        static cache or ``end`` passes its window."""
        if not isinstance(self.cache, StaticKV) or self._lean is None:
            raise TypeError("a pass at a device position needs the static cache (a card, or SPECCHAT_STATIC_CACHE=1)")
        if end > self.cache.window:
            raise ContextLengthError(f"a chain of rounds reaching position {end} does not fit the "
                                     f"{self.cache.window}-token window of this model's cache")
        return self._lean, self.cache, attention_span(end, self.cache.window)

    def wrote(self, ids: Sequence[int]) -> None:
        """Take ``ids`` (``[n]``) as cached after :attr:`ids`: passes at device positions
        (:meth:`pass_at`) wrote their keys there, and the caller has read back which tokens they were."""
        if not isinstance(self.cache, StaticKV):
            raise TypeError("only passes over a static cache write at device positions")
        self.resolve_pending()
        if len(self) + len(ids) > self.cache.window:
            raise ValueError(f"{len(self)} cached and {len(ids)} written exceed the {self.cache.window}-token window")
        self._ids.extend(int(t) for t in ids)
        self.cache.advance(len(ids))
