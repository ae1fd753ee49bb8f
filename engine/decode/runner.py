"""One model and the one KV cache it owns.

:class:`ModelRunner` is the only code that feeds a model or touches its KV
cache (:class:`engine.model.lean.GrowingKV` on the lean path, transformers'
``DynamicCache`` otherwise), and :meth:`ModelRunner.truncate` is the only place
a cache is cropped. It remembers which token ids the cache holds, so callers never track
cache lengths by hand: :meth:`sync` keeps the longest prefix the cache shares
with a new context (rejected draft tokens, or the previous chat turn) and says
what is left to feed.
"""
from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence

import torch
from transformers import DynamicCache, PreTrainedModel

from engine.model.device import Device
from engine.model.lean import GrowingKV, lean_forward


PassWatcher = Callable[[int, float], None]
_PASS_WATCHERS: "weakref.WeakKeyDictionary[torch.nn.Module, list[PassWatcher]]" = weakref.WeakKeyDictionary()


def watch_passes(model: torch.nn.Module, watcher: PassWatcher) -> Callable[[], None]:
    """Call ``watcher(tokens_fed, seconds)`` after every lean-path pass of ``model``
    (transformers' forward has module hooks for that; the lean path skips them).
    Returns the function that stops watching. For the bench's timers."""
    _PASS_WATCHERS.setdefault(model, []).append(watcher)

    def stop() -> None:
        watchers = _PASS_WATCHERS.get(model, [])
        if watcher in watchers:
            watchers.remove(watcher)

    return stop


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id sequences."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class ModelRunner:
    """Feeds token ids to a causal LM, keeping its KV cache across calls.

    Invariant: ``self.ids`` are exactly the tokens whose keys and values are in
    ``self.cache``, in order.
    """

    def __init__(self, model: PreTrainedModel, device: Device, lean: bool = True) -> None:
        self.model = model
        self.device = device
        # A straight-line forward over the same weights where the architecture
        # allows (engine/model/lean.py); transformers' own forward otherwise.
        self._lean = lean_forward(model) if lean else None
        self.ids: list[int] = []
        self.cache = self._new_cache()
        # Width of the logits (may exceed the tokenizer's vocabulary: padding rows).
        self.vocab_size = int(model.config.get_text_config().vocab_size)

    def _new_cache(self) -> "DynamicCache | GrowingKV":
        return self._lean.new_cache() if self._lean is not None else DynamicCache(config=self.model.config)

    def restrict_vocab(self, ids: torch.Tensor) -> bool:
        """Compute logits for the token ids ``ids`` only (``-inf`` elsewhere), for a
        draft that proposes from frequent tokens (FR-Spec). False when this model
        runs through transformers' forward, which cannot."""
        if self._lean is None:
            return False
        from engine.model.lean import subset_head

        self._lean.head = subset_head(self.model, ids.to(self.device.torch_device))
        return True

    def __len__(self) -> int:
        return len(self.ids)

    @torch.inference_mode()
    def forward(self, new_ids: Sequence[int], logits_to_keep: int = 1) -> torch.Tensor:
        """Append ``new_ids`` to the cache and return the last logits.

        Args:
            new_ids: ``[n]`` token ids following ``self.ids``; ``n >= 1``.
            logits_to_keep: how many trailing positions to return logits for
                (``0`` returns none, saving the output layer during prefill).

        Returns:
            ``[logits_to_keep, V]`` float32 logits; row ``i`` predicts the token
            after ``new_ids[n - logits_to_keep + i]``.
        """
        if not new_ids:
            raise ValueError("forward needs at least one new token")
        input_ids = torch.tensor([list(new_ids)], dtype=torch.long, device=self.device.torch_device)
        keep = max(logits_to_keep, 1)
        try:
            if self._lean is not None:
                watchers = _PASS_WATCHERS.get(self.model)
                start = self.device.now() if watchers else 0.0
                logits = self._lean(input_ids, self.cache, len(self.ids), keep, row_exact=logits_to_keep > 0)
                for watch in watchers or ():
                    watch(len(new_ids), self.device.now() - start)
            else:
                logits = self.model(
                    input_ids=input_ids, past_key_values=self.cache, use_cache=True, logits_to_keep=keep
                ).logits
        except BaseException:
            # A failed pass (an OOM, say) may have extended some layers and not
            # others: put every layer back to the last consistent length.
            self.truncate(len(self.ids))
            raise
        self.ids.extend(int(t) for t in new_ids)
        if logits_to_keep == 0:
            return logits.new_empty((0, logits.shape[-1]))
        return logits[0, -logits_to_keep:].float()

    def prefill(self, ids: Sequence[int]) -> None:
        """Feed ``ids`` without computing any logits (``[n]`` ids; nothing returned)."""
        if ids:
            self.forward(ids, logits_to_keep=0)

    def catch_up(self, context: Sequence[int]) -> None:
        """Feed ``context`` (``[L]`` ids) past what the cache shares with it, all but its
        last token: the caller's next pass feeds that one and reads its logits."""
        self.prefill(context[self.sync(context, leave=1) : -1])

    def sync(self, context: Sequence[int], leave: int = 0) -> int:
        """Crop the cache to its longest common prefix with ``context``.

        At most ``len(context) - leave`` tokens are kept, so that at least
        ``leave`` tokens of the context remain for the caller to feed (the last
        one gives the logits the caller wants).

        Returns:
            How many tokens of ``context`` the cache now holds.
        """
        keep = min(common_prefix_length(self.ids, context), max(len(context) - leave, 0))
        self.truncate(keep)
        return keep

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` cached tokens; the only place a cache is cropped.

        Each layer is cropped by its own length (``DynamicLayer.crop`` takes a
        negative count of tokens to drop in transformers 5), so a pass that
        failed half-way through the layers is repaired too.
        """
        if n < 0:
            raise ValueError(f"cannot keep {n} tokens")
        for layer in getattr(self.cache, "layers", ()):
            length = _layer_length(layer)
            if length > n:
                layer.crop(n - length)
        del self.ids[n:]

    def cached_length(self) -> int:
        """Tokens held by the cache itself (for tests of the invariant)."""
        lengths = {_layer_length(layer) for layer in getattr(self.cache, "layers", ())}
        if len(lengths) > 1:
            raise AssertionError(f"cache layers disagree on length: {sorted(lengths)}")
        return lengths.pop() if lengths else 0

    def release(self) -> None:
        """Drop the cache and the model reference so their memory can be freed."""
        self.cache = self._new_cache()
        self.ids = []
        self.model = None  # type: ignore[assignment]
        self._lean = None


def _layer_length(layer: object) -> int:
    keys = getattr(layer, "keys", None)
    if not getattr(layer, "is_initialized", False) or keys is None or keys.numel() == 0:
        return 0
    return int(keys.shape[-2])
