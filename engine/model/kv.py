"""The lean path's KV caches, owned by :class:`engine.decode.runner.ModelRunner` (which alone crops them).

* :class:`GrowingKV` (the CPU's): per-layer buffers that grow by doubling; attention reads
  exactly the cached keys (a slice whose length changes every step).
* :class:`StaticKV` (a card's): per-layer buffers preallocated to the whole window, as
  gpt-fast's ``KVCache`` does. A pass writes its keys at the positions in a device tensor
  (``index_copy_``) and attention reads the whole window under a mask built from the same
  positions (key ``j`` is visible to a row at position ``p`` iff ``j <= p``), so no tensor
  changes shape from one step to the next and the pass can be captured once and replayed
  (:mod:`engine.model.capture`). Cropping moves the length only: nothing is copied, and the
  keys past it are never visible (the mask hides every key after the row's own position, and
  every key before it was written by an earlier pass).

Both offer what the runner uses of a cache: ``layers`` whose ``keys`` are
``[1, kv_heads, length, head_dim]`` views, ``is_initialized`` and ``crop(-n)`` (drop the last
``n`` tokens; ``crop(n)``, n >= 0, keeps the first ``n``), plus ``get_seq_length``.
"""
from __future__ import annotations

import torch


class _LayerBuffers:
    """One layer's key and value buffers ``[1, kv_heads, capacity, d]`` and how many tokens of
    them are cached: what :class:`GrowingKV` and :class:`StaticKV` layers share."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.length = 0

    @property
    def is_initialized(self) -> bool:
        return self.k is not None

    @property
    def keys(self) -> torch.Tensor | None:
        return self.k[:, :, : self.length] if self.k is not None else None

    def crop(self, n: int) -> None:
        """Move the length: ``n < 0`` drops the last ``-n`` tokens, ``n >= 0`` keeps the first ``n``
        (nothing is copied or cleared)."""
        self.length = max(self.length + n, 0) if n < 0 else min(n, self.length)


class GrowingKV:
    """The lean path's KV cache: per-layer buffers that grow by doubling, up to ``limit``.

    transformers' ``DynamicCache`` concatenates every step, copying the whole
    cache (O(L) a token: ~45 MB a step for SmolLM2 at 1,000 tokens); here a
    step writes only its new keys and values. It offers what the runner uses of
    a cache: ``update``, ``get_seq_length`` and ``layers`` whose ``keys`` are
    ``[1, kv_heads, length, head_dim]`` views and whose ``crop(-n)`` drops the
    last ``n`` tokens (``crop(n)``, n >= 0, keeps the first ``n``).
    """

    class Layer(_LayerBuffers):
        def __init__(self, owner: "GrowingKV | None" = None) -> None:
            super().__init__()
            self.owner = owner

        def reserve(self, t: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            """Room for ``t`` more tokens: the whole key and value buffers ``[1, kv_heads, cap, d]``
            (of ``like``'s head shape, dtype and device), for a writer that then calls :meth:`advance`."""
            end = self.length + t
            if self.k is None or end > self.k.shape[2]:
                capacity = max(256, 2 * end)
                limit = self.owner.limit if self.owner is not None else None
                if limit:  # never past the context window the plan reserved for
                    capacity = max(end, min(capacity, limit))
                grown_k = like.new_empty((*like.shape[:2], capacity, like.shape[3]))
                grown_v = like.new_empty((*like.shape[:2], capacity, like.shape[3]))
                if self.k is not None and self.v is not None:
                    grown_k[:, :, : self.length] = self.k[:, :, : self.length]
                    grown_v[:, :, : self.length] = self.v[:, :, : self.length]
                self.k, self.v = grown_k, grown_v
            assert self.v is not None
            return self.k, self.v

        def advance(self, t: int) -> None:
            """``t`` tokens were written past the end (see :meth:`reserve`)."""
            self.length += t

        def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            keys, values = self.reserve(k.shape[2], k)
            end = self.length + k.shape[2]
            keys[:, :, self.length : end] = k
            values[:, :, self.length : end] = v
            self.length = end
            return keys[:, :, :end], values[:, :, :end]

    def __init__(self, n_layers: int, limit: int | None = None) -> None:
        self.limit = limit
        """The most tokens a buffer is grown to (the context window); None: no cap."""
        self.layers = [GrowingKV.Layer(self) for _ in range(n_layers)]

    def update(self, k: torch.Tensor, v: torch.Tensor, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``[1, kv_heads, T, head_dim]`` keys and values; return the layer's whole cache."""
        return self.layers[layer_idx].append(k, v)

    def get_seq_length(self) -> int:
        return self.layers[0].length if self.layers else 0


class StaticKV:
    """Keys and values of every layer preallocated to ``window`` tokens, written at device positions.

    Allocated at the first write (its dtype and device are the keys'), zero-filled: a masked
    key still meets its value in attention's ``probabilities @ values`` (with weight 0), and
    ``0 · NaN`` would be NaN. :attr:`generation` counts allocations, so that a captured pass
    (which holds the buffers' addresses) knows when to capture again.
    """

    class Layer(_LayerBuffers):
        def advance(self, t: int) -> None:
            self.length += t

    def __init__(self, n_layers: int, window: int) -> None:
        if window < 1:
            raise ValueError(f"a static cache needs a window of at least one token, got {window}")
        self.window = window
        self.layers = [StaticKV.Layer() for _ in range(n_layers)]
        self.generation = 0
        """How many times buffers were allocated (a change makes captured passes stale)."""
        self._keys: torch.Tensor | None = None  # [1, window]: 0 .. window - 1, made once

    def allocate(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Zeroed key and value buffers ``[1, kv_heads, window, d]`` of ``like``'s head shape,
        dtype and device."""
        self.generation += 1
        shape = (*like.shape[:2], self.window, like.shape[3])
        return like.new_zeros(shape), like.new_zeros(shape)

    def allocate_layers(self, like: torch.Tensor) -> None:
        """Give every layer its buffers (:meth:`allocate`, ``like`` ``[1, kv_heads, *, d]``) where it has
        none yet. A pass then writes keys and values at its positions (``index_copy_`` along dim 2,
        :func:`engine.model.layer_parts.static_layer`); the length is the runner's to advance
        (:meth:`advance`), not read from the positions: the pass may be a replay whose positions the
        host never sees."""
        for layer in self.layers:
            if layer.k is None or layer.v is None:
                layer.k, layer.v = self.allocate(like)

    def allocated(self) -> bool:
        return all(layer.k is not None for layer in self.layers)

    def advance(self, t: int) -> None:
        """``t`` tokens were written past the end of every layer."""
        for layer in self.layers:
            layer.advance(t)

    def mask(self, positions: torch.Tensor, length: int | None = None) -> torch.Tensor:
        """``[T, length]`` bool (``length``: the window when None): key ``j`` is visible to the row at
        position ``positions[i]`` iff ``j <= positions[i]`` (its own key included). The same shape at
        every step of a span."""
        if self._keys is None or self._keys.device != positions.device:
            self._keys = torch.arange(self.window, device=positions.device).unsqueeze(0)
        return self._keys[:, : self.window if length is None else length] <= positions.unsqueeze(1)

    def get_seq_length(self) -> int:
        return self.layers[0].length if self.layers else 0

    def resized(self, window: int) -> "StaticKV":
        """A cache of ``window`` tokens holding the first ``min(length, window)`` of this one's
        (copied once; for a window that changes while tokens are cached)."""
        other = StaticKV(len(self.layers), window)
        keep = min(self.get_seq_length(), window)
        for mine, theirs in zip(self.layers, other.layers):
            if mine.k is not None and mine.v is not None and keep > 0:
                theirs.k, theirs.v = other.allocate(mine.k)
                theirs.k[:, :, :keep] = mine.k[:, :, :keep]
                theirs.v[:, :, :keep] = mine.v[:, :, :keep]
            theirs.length = keep
        return other
