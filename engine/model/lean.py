"""A lean forward pass for Llama-family decoders (Llama, Qwen2, Mistral, SmolLM).

At batch size one on a CPU, a small model's step is mostly Python: transformers
dispatches some 25 modules, hooks and wrappers per layer, which for SmolLM2
(30 layers) costs more than its int4 matmuls. :class:`LeanForward` runs the
same maths over the same modules' weights with a straight loop, the way
gpt-fast's ``Transformer.forward`` does, with q/k/v and gate/up each joined
into one matmul (the layers become views into the joint weights, so no
memory is duplicated):

    x = embed(ids)
    for each layer:
        h = rms_norm(x) ; q, k, v = h Wq, h Wk, h Wv ; rope(q, k)
        k, v = cache.update(k, v)                      # the runner's cache (GrowingKV)
        x = x + attention(q, k, v, causal from position ``start``) Wo
        h = rms_norm(x) ; x = x + (silu(h Wg) * h Wu) Wd
    logits = rms_norm(x[-keep:]) W_head

It reuses the model's own weights (int4 or not) and rotary embedding (with
its scaling), so transformers' forward, ``generate`` included, keeps working on
the same model.
Any model it does not recognise runs through transformers unchanged
(:func:`lean_forward` returns None).

The numbers are those of transformers' SDPA path up to the order of floating
point operations, so a reply may differ from transformers' own ``generate`` at
a near-tie; speculative and plain decoding in specchat both run this pass, so
they stay token-identical to each other.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.model import cpu_attention, cpu_layer
from engine.model.capture import attention_span
from engine.model.card_attention import FUSED_ROWS
from engine.model.kv import GrowingKV, StaticKV
from engine.model.layer_parts import (Dims, LayerParts, Proj, Projection, layer_parts, project, qkv_rope, rms_norm,
                                      finish_layer, single, static_layer)
from engine.quant.int4 import Int4Linear

SUPPORTED = ("llama", "qwen2", "mistral")


def rows_pay(tensors: Iterable[Any]) -> bool:
    """Whether per-row attention in a verify pass buys exactness for a model holding ``tensors``:
    on the CPU, where the int4 matmuls around it are batch-invariant. On CUDA a verify pass's
    bf16/fp16 matmuls differ from a one-token step's anyway, so K+1 attention calls a layer
    would be kernel launches for nothing."""
    return not any(getattr(t, "is_cuda", False) for t in tensors)


def _signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """``sin`` with its first half negated, so that rope's ``rotate_half(x) * sin`` (that is,
    ``cat(-x2, x1) * sin``) becomes ``roll(x, half) * signed``: the same numbers bit for bit
    (``(-a) b == a (-b)`` in IEEE arithmetic), one op a layer instead of four."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


class LeanForward:
    """Callable like the model (``input_ids``, ``past_key_values``, ``logits_to_keep``) for the runner."""

    def _attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, start: int, row_exact: bool
    ) -> torch.Tensor:
        """Attention of ``q`` ``[1, heads, T, d]`` over the cache ``k``, ``v`` ``[1, kv_heads, start + T, d]``.

        A verify pass must give each row the very numbers a one-token step at
        that position would (greedy speculation is token-identical to plain
        decoding only if it does). One masked SDPA call over T rows takes
        another kernel path and differs in the last bits (~2e-7 here), enough
        to flip a near-tie; so with ``row_exact`` row ``i`` attends through its
        own one-row call over exactly ``start + i + 1`` keys. The int4 matmuls
        are batch-invariant already (tests/engine/model/test_lean.py checks both).
        A prefill, whose logits nobody compares, takes one call: with an empty
        cache (``start == 0``) a causal one without a mask (``is_causal``: SDPA's
        flash and memory-efficient kernels take it, none builds a ``[T, S]``
        score matrix), else the masked one.
        """
        gqa = self.n_kv != self.n_heads
        t = q.shape[2]
        if t > 1 and start == 0 and not row_exact:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale, enable_gqa=gqa)
        if t == 1 or not row_exact:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale, enable_gqa=gqa)
        rows = [F.scaled_dot_product_attention(q[:, :, i : i + 1], k[:, :, : start + i + 1], v[:, :, : start + i + 1],
                                               scale=self.scale, enable_gqa=gqa) for i in range(t)]
        return torch.cat(rows, dim=2)

    def _native(self, x: torch.Tensor, cache: "GrowingKV", start: int, cos: torch.Tensor, sin: torch.Tensor,
                logits_to_keep: int) -> torch.Tensor:
        """The forward of :meth:`__call__` with each layer's attention in one call of specchat's CPU
        attention step (row-exact by construction) and every projection on its int4 kernel."""
        if self.native_layers is not None:  # the same calls from C, one a layer
            return self._logits(cpu_layer.run(self.native_layers, cache.layers, self._kv_like, x, start, cos, sin),
                                logits_to_keep)
        t = x.shape[1]
        for layer, kv in zip(self.layers, cache.layers):
            qkv = layer.qkv(x)
            keys, values = kv.reserve(t, self._kv_like)
            a = cpu_attention.attention_step(qkv, keys, values, start, cos, sin, self.n_heads, self.n_kv, self.scale)
            kv.advance(t)
            x = layer.o(a, residual=x)
            x = layer.down(layer.gate_up(x), residual=x)
        return self._logits(x, logits_to_keep)

    def _logits(self, x: torch.Tensor, keep: int) -> torch.Tensor:
        """Logits ``[1, keep, V]`` of the last ``keep`` rows of the residual stream ``x``."""
        x = x[:, -keep:]
        return self.head(x) if self.head_folds else project(self.head, rms_norm(x, self.final_norm, self.final_eps))

    def use_head(self, head: Callable[[torch.Tensor], torch.Tensor], folds: bool = False) -> None:
        """Replace the output layer by ``head`` (``f(h [..., H]) -> [..., V]``, e.g.
        :func:`engine.model.head.subset_head`) over normalised hidden states, or with ``folds`` over
        the stream itself, the final norm folded in as the full head folds it."""
        self.head, self.head_folds = head, folds  # type: ignore[assignment]

    def new_cache(self, limit: int | None = None, static: bool = False) -> GrowingKV | StaticKV:
        """An empty cache for this model (the runner owns it) of at most ``limit`` tokens' capacity:
        a :class:`StaticKV` of ``limit`` tokens when ``static`` (and ``limit`` is known)."""
        if static and limit:
            return StaticKV(len(self.layers), limit)
        return GrowingKV(len(self.layers), limit)

    def __init__(self, model: nn.Module) -> None:
        cfg = model.config.get_text_config()
        inner = model.model
        self.config = model.config
        self.embed = inner.embed_tokens.weight
        self.rotary = inner.rotary_emb
        self.final_norm, self.final_eps = inner.norm.weight, inner.norm.variance_epsilon
        self.head_folds = Int4Linear.folds([model.lm_head]) and self.embed.dtype == torch.float32
        self.head: Projection = (Int4Linear.fuse([model.lm_head], norm=(self.final_norm, self.final_eps))
                                 if self.head_folds else single(model.lm_head))
        self.layers: list[LayerParts] = [layer_parts(layer, self.embed.dtype) for layer in inner.layers]
        self.n_heads = int(cfg.num_attention_heads)
        self.n_kv = int(getattr(cfg, "num_key_value_heads", None) or self.n_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads)
        self.scale = self.head_dim**-0.5
        self.qk_width = (self.n_heads + self.n_kv) * self.head_dim
        self.dims = Dims(self.n_heads, self.n_kv, self.head_dim, self.scale, self.qk_width)
        self.compilable = all(isinstance(proj, Proj) for layer in self.layers
                              for proj in (layer.qkv, layer.o, layer.gate_up, layer.down))
        """Every projection is tensors (dense, or torch's int4 kernel): what ``torch.compile`` traces
        whole; bitsandbytes' layers and specchat's CPU kernel are calls it would break at."""
        self.rows_pay = rows_pay(itertools.chain(model.parameters(), model.buffers()))
        self.prompt_row_exact = self.rows_pay and not any(isinstance(m, nn.Linear) for m in inner.layers.modules())
        """A prompt's pieces are read row by row too: on the CPU with every layer's products on an int4
        kernel (batch-invariant), so a position's keys and values never depend on where its piece began.
        The app's engine reads a new chat's prompt past the template tokens it shares with the chat
        before, in other pieces than a cold read (``specchat generate``): pocket's greedy replies parted
        on 4 of 11 prompts when a cold read's first piece took SDPA's causal kernel. Free on specchat's
        kernels (its attention step is row-exact anyway); dense fp32 products differ by row count, so
        there it would buy nothing."""
        self.native_attention = (self.rows_pay and self.embed.dtype == torch.float32
                                 and all(layer.folded for layer in self.layers)
                                 and cpu_attention.available(self.n_heads, self.n_kv, self.head_dim))
        """Every layer on specchat's CPU kernels: rope, the cache write and attention in one call
        (:func:`engine.model.cpu_attention.attention_step`) wherever the cache is a :class:`GrowingKV`,
        but in a first prefill (no cache yet, many rows: SDPA's blocked causal kernel)."""
        self._kv_like = torch.empty(1, self.n_kv, 0, self.head_dim,
                                    dtype=cpu_attention.KV_DTYPE if self.native_attention else torch.float32)
        """The cache's empty ``[1, KV, 0, d]``: fp16 where the native step reads it (csrc/attention_avx2.c)."""
        built = ([cpu_layer.build(layer, self.n_heads, self.n_kv, self.head_dim, self.scale) for layer in self.layers]
                 if self.native_attention and cpu_layer.entry() is not None else [])
        self.native_layers: list[cpu_layer.Layer] | None = (built if built and all(b is not None for b in built)
                                                             else None)  # type: ignore[assignment]
        """With :attr:`native_attention`, each layer's five or six kernel calls made from C in one
        (:mod:`engine.model.cpu_layer`; the same calls, the same bits); None where a layer's parts are
        not all specchat's kernels. Set it to None to run the calls from Python."""
        self._rope_tables: dict[tuple[int, torch.device, torch.dtype], torch.Tensor] = {}
        self._mask_constants: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}
        self.layer_fn: Callable[..., tuple[torch.Tensor, torch.Tensor]] = static_layer
        """Each layer of :meth:`static_pass`: :func:`engine.model.layer_parts.static_layer`, or the same
        compiled once for every layer (:class:`engine.model.compiled.CompiledPass`, set by the runner)."""
        self.step_fn: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None
        """Where the runner chose a card's fused attention: each layer of a :meth:`static_pass` of at
        most :data:`~engine.model.card_attention.FUSED_ROWS` tokens
        (:func:`engine.model.card_attention.card_layer`, compiled or not); longer passes keep
        :attr:`layer_fn`."""

    @torch.inference_mode()
    def __call__(
        self, input_ids: torch.Tensor, past_key_values: Any, start: int, logits_to_keep: int = 1,
        row_exact: bool = True,
    ) -> torch.Tensor:
        """Run ``input_ids`` ``[1, T]`` at positions ``start .. start + T - 1``.

        Appends their keys and values to ``past_key_values`` (which holds
        ``start`` tokens) and returns logits ``[1, logits_to_keep, V]``.
        With ``row_exact`` each row's attention is computed exactly as a
        one-token pass at its position would compute it (see :meth:`_attention`),
        where that pays (:attr:`rows_pay`: not on CUDA). Over a :class:`StaticKV` the pass is
        :meth:`static_pass` over the span a captured pass would read
        (:func:`~engine.model.capture.attention_span`: the same keys and the same compiled layer as
        a captured pass, under a mask; ``row_exact`` does not apply).
        """
        t = input_ids.shape[1]
        if isinstance(past_key_values, StaticKV):
            positions = torch.arange(start, start + t, device=input_ids.device)
            logits = self.static_pass(input_ids, past_key_values, positions, logits_to_keep,
                                      attention_span(start + t, past_key_values.window))
            past_key_values.advance(t)
            return logits
        row_exact = row_exact and self.rows_pay
        x = F.embedding(input_ids, self.embed)
        positions = torch.arange(start, start + t, device=input_ids.device).unsqueeze(0)
        cos, sin = self.rotary(x, positions)
        if (self.native_attention and isinstance(past_key_values, GrowingKV)
                and (t == 1 or start > 0 or row_exact)):
            return self._native(x, past_key_values, start, cos, sin, logits_to_keep)
        cos, sin = cos.unsqueeze(1), _signed_sin(sin.unsqueeze(1))
        mask = None
        if t > 1 and start > 0 and not row_exact:  # causal over the new tokens; every cached token is visible
            mask = torch.ones(t, start + t, dtype=torch.bool, device=x.device).tril(diagonal=start)
        for i, layer in enumerate(self.layers):
            h = x if layer.folded else rms_norm(x, layer.norm1, layer.eps1)
            q, k, v = qkv_rope(layer, self.dims, x, h, cos, sin)
            if self._kv_like.dtype != x.dtype and isinstance(past_key_values, GrowingKV):  # the buffers in the
                past_key_values.layers[i].reserve(t, self._kv_like)  # dtype the native steps read (a first prefill)
            k, v = past_key_values.update(k, v, i)
            if k.dtype != q.dtype:  # attend over the cache's own numbers, as the native step then does
                k, v = k.to(q.dtype), v.to(q.dtype)
            a = self._attention(q, k, v, mask, start, row_exact)
            x = finish_layer(layer, x, a.transpose(1, 2).reshape(1, t, -1))
        return self._logits(x, logits_to_keep)

    def static_pass(self, input_ids: torch.Tensor, cache: StaticKV, positions: torch.Tensor, keep: int,
                    length: int | None = None) -> torch.Tensor:
        """The pass of :meth:`__call__` over a :class:`StaticKV`, every shape fixed by ``T`` and
        ``keep`` alone (so it can be captured once and replayed, :mod:`engine.model.capture`).

        Args:
            input_ids: ``[1, T]`` long ids on the model's device.
            cache: holds every position below ``positions[0]``; the new keys are written at
                ``positions`` (its length is the caller's to advance).
            positions: ``[T]`` long positions on the model's device.
            length: attention reads the first ``length`` keys only, at least ``positions[-1] + 1``:
                an eager pass's exact end (a prefill chunk need not score the empty rest of the
                window), a captured pass's span (:func:`engine.model.capture.attention_span`, one
                graph serving every position up to it). None: the whole window.
        Returns:
            ``[1, keep, V]`` logits of the last ``keep`` rows.

        Attention reads the first ``length`` keys under the mask of :meth:`StaticKV.mask`; each
        layer is one call of :attr:`layer_fn`, which also applies the next layer's first norm (the
        last layer's: the final norm), so the head takes the stream normalised already. A pass of
        at most :data:`~engine.model.card_attention.FUSED_ROWS` tokens where the runner chose a
        card's fused attention calls :attr:`step_fn` instead: no mask, and ``length`` does not apply.
        """
        x = F.embedding(input_ids, self.embed)
        if not cache.allocated():
            cache.allocate_layers(x.new_empty(1, self.n_kv, 0, self.head_dim))
        first = self.layers[0]
        h = x if first.folded else rms_norm(x, first.norm1, first.eps1)
        norms = [(layer.norm1, layer.eps1) for layer in self.layers[1:]] + [(self.final_norm, self.final_eps)]
        if self.step_fn is not None and input_ids.shape[1] <= FUSED_ROWS:  # rope and mask from the positions, in the kernel
            table = self._rope_table(cache.window, x)
            for layer, kv, (norm, eps) in zip(self.layers, cache.layers, norms):
                x, h = self.step_fn(x, h, layer, self.dims, kv.k, kv.v, positions, table, norm, eps)
            return self._head(x, h, keep)
        rope = self._rope_table(cache.window, x)[positions]  # [T, 2, d]: one gather for cos and sin
        cos, sin = rope[:, 0].unsqueeze(0).unsqueeze(1), rope[:, 1].unsqueeze(0).unsqueeze(1)
        group = self.n_heads // self.n_kv
        rows = positions.repeat(group) if group > 1 else positions  # row g·T + i is row i's
        zero, hidden = self._mask_values(x)
        mask = torch.where(cache.mask(rows, length), zero, hidden)  # what SDPA would make of the bool mask
        for layer, kv, (norm, eps) in zip(self.layers, cache.layers, norms):
            x, h = self.layer_fn(x, h, layer, self.dims, kv.k, kv.v, positions, cos, sin, mask, norm, eps)
        return self._head(x, h, keep)

    def _head(self, x: torch.Tensor, h: torch.Tensor, keep: int) -> torch.Tensor:
        """Logits ``[1, keep, V]`` of the last ``keep`` rows of the stream ``x`` (``h``: it normalised)."""
        if self.head_folds:
            return self.head(x[:, -keep:])  # type: ignore[operator]
        return project(self.head, h[:, -keep:])

    def _rope_table(self, window: int, like: torch.Tensor) -> torch.Tensor:
        """``cos`` and signed ``sin`` ``[window, 2, d]`` for every position of the window (the model's
        own rotary embedding, scaling included), computed once per window, device and dtype."""
        key = (window, like.device, like.dtype)
        table = self._rope_tables.get(key)
        if table is None:
            positions = torch.arange(window, device=like.device).unsqueeze(0)
            cos, sin = self.rotary(like, positions)
            table = self._rope_tables[key] = torch.stack((cos[0], _signed_sin(sin[0])), dim=1)
        return table

    def _mask_values(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """0 and ``-inf`` as 0-d tensors of ``like``'s dtype and device (made once each): an additive
        mask in one ``where``."""
        key = (like.device, like.dtype)
        values = self._mask_constants.get(key)
        if values is None:
            values = self._mask_constants[key] = (torch.zeros((), dtype=like.dtype, device=like.device),
                                                  torch.full((), float("-inf"), dtype=like.dtype, device=like.device))
        return values


def batch_invariant(model: nn.Module) -> bool:
    """Whether a K+1-token pass of ``model`` gives each row exactly a one-token step's
    numbers: the lean path with every linear layer on the CPU int4 kernel (whose
    rows do not depend on how many there are; attention is made row-exact).
    BLAS float matmuls choose kernels by row count, so an fp32/bf16 model is not."""
    if lean_forward(model) is None:
        return False
    linears = [m for m in model.modules() if isinstance(m, (nn.Linear, Int4Linear))]
    return bool(linears) and all(isinstance(m, Int4Linear) and not m.is_cuda for m in linears)


def lean_forward(model: nn.Module) -> LeanForward | None:
    """A :class:`LeanForward` over ``model``, or None when the model is not a plain
    Llama-family decoder (other architectures, sliding windows, accelerate hooks)."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in SUPPORTED:
        return None
    text = cfg.get_text_config()
    if getattr(text, "hidden_act", "silu") != "silu" or getattr(text, "use_sliding_window", False):
        return None
    if text.model_type == "mistral" and getattr(text, "sliding_window", None):
        return None
    if any(hasattr(m, "_hf_hook") for m in model.modules()):  # accelerate offloading: keep its hooks
        return None
    try:
        return LeanForward(model)
    except AttributeError:
        return None
