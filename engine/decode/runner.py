"""One model and the one KV cache it owns.

:class:`ModelRunner` is the only code that feeds a model or touches its KV
cache (on the lean path :class:`engine.model.kv.GrowingKV`, or on a card
:class:`engine.model.kv.StaticKV` with its fixed-shape passes captured and replayed by
:class:`engine.model.capture.PassCapture`; transformers' ``DynamicCache`` otherwise), and :meth:`ModelRunner.truncate` is the only place
a cache is cropped. It remembers which token ids the cache holds, so callers never track
cache lengths by hand: :meth:`sync` keeps the longest prefix the cache shares
with a new context (rejected draft tokens, or the previous chat turn) and says
what is left to feed.

A long prefill is fed in chunks of :data:`engine.model.memory.PREFILL_CHUNK`
tokens, so that attention's transient (a ``[1, heads, chunk, cached]`` score
matrix where SDPA falls back to its math kernel) stays what the memory plan
counts. Ids may also come as a device tensor (a draft's own picks), so that a
drafting loop makes no host transfer per token; they are read back once
(:meth:`ModelRunner.resolve_pending`).
"""
from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Sequence

import torch
from transformers import DynamicCache, PreTrainedModel

from engine.errors import ContextLengthError
from engine.decode.device_passes import DevicePositionPasses
from engine.decode.prefix import common_prefix_length
from engine.model.capture import PassCapture, capture_shapes
from engine.model.compiled import CompiledPass, compile_backend
from engine.model.device import Device, ids_tensor, oom_summary
from engine.model.kv import GrowingKV, StaticKV
from engine.model.card_attention import FUSED_ROWS, card_layer, card_varying, why_not_fused
from engine.model.layer_parts import static_layer, varying_sizes
from engine.model.lean import lean_forward
from engine.model.memory import PREFILL_CHUNK, max_positions


PREFILL_PIECE = 32
"""Prompt tokens a CPU reads between two looks at a reply's cancel flag: a prompt the cache cannot
reuse (a conversation past the window drops its first messages) takes seconds to read, and Esc
must stop it within about 0.1 s (pocket reads ~450 tokens/s on 2 cores, as fast in pieces of 32
as of 512). A fixed size, so the same prompt is read the same way every time. A card reads
pieces of its runner's prefill chunk (:data:`~engine.model.memory.PREFILL_CHUNK`)."""
DEFAULT_K_MAX = 8
"""The widest draft the captured shapes cover until the decoder says (``GenerationParams.k_max``)."""
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


class ModelRunner(DevicePositionPasses):
    """Feeds token ids to a causal LM, keeping its KV cache across calls.

    Invariant: ``self.ids`` are exactly the tokens whose keys and values are in
    ``self.cache``, in order. Passes at positions only the device knows (a chain of rounds) are
    :class:`~engine.decode.device_passes.DevicePositionPasses`'s.

    ``window``: the most tokens the cache will hold (the context window); the lean
    path's cache never grows past it (default: the model's ``max_position_embeddings``).
    """

    def __init__(self, model: PreTrainedModel, device: Device, lean: bool = True, window: int | None = None,
                 prefill_chunk: int = PREFILL_CHUNK) -> None:
        self.model = model
        self.device = device
        # A straight-line forward over the same weights where the architecture
        # allows (engine/model/lean.py); transformers' own forward otherwise.
        self._lean = lean_forward(model) if lean else None
        self.window = window or max_positions(model.config)
        self.prefill_chunk = max(1, prefill_chunk)
        self._ids: list[int] = []
        self._pending: list[torch.Tensor] = []  # device ids fed but not yet read back, in order
        self._pending_n = 0
        self.static = self._lean is not None and bool(self.window) and device.uses_static_cache()
        """Whether the cache is a :class:`StaticKV` (the device's choice; the lean path only)."""
        backend, off = device.graph_backend() if self.static else (None, None)
        self.capture = PassCapture(backend, capture_shapes(DEFAULT_K_MAX), off)
        """The captured passes over the static cache (none over a growing one)."""
        compiler = (compile_backend(card=device.is_cuda and self._lean.compilable)  # type: ignore[union-attr]
                    if self._lean is not None and self.static else None)
        fwd = self._lean
        self.why_unfused: str | None = "no static cache"
        """Why a few-token pass does not take the card's fused attention (None: it does;
        :mod:`engine.model.card_attention`)."""
        if fwd is not None and self.static:
            self.why_unfused = why_not_fused(fwd.dims, device.torch_device, fwd.embed.dtype)
            if self.why_unfused is None:  # steps and verify passes fused; a prompt's chunks through SDPA, uncompiled
                fwd.step_fn = (CompiledPass(card_layer, compiler, card_varying) if compiler is not None
                               else card_layer)
                self.capture.spanless_rows = FUSED_ROWS
            elif compiler is not None:  # every static pass's layers compiled (SPECCHAT_COMPILE), captured or eager
                fwd.layer_fn = CompiledPass(static_layer, compiler, varying_sizes)
        self.cache = self._new_cache()
        # Width of the logits (may exceed the tokenizer's vocabulary: padding rows).
        self.vocab_size = int(model.config.get_text_config().vocab_size)

    def _new_cache(self) -> "DynamicCache | GrowingKV | StaticKV":
        if self._lean is None:
            return DynamicCache(config=self.model.config)
        return self._lean.new_cache(self.window, static=self.static)

    def set_window(self, window: int | None) -> None:
        """Cap the cache at ``window`` tokens (the decoder's context window), from the next growth
        on; a static cache is reallocated to it (its passes are then captured again)."""
        if window:
            self.window = window
            if isinstance(self.cache, GrowingKV):
                self.cache.limit = window
            elif isinstance(self.cache, StaticKV) and self.cache.window != window:
                if len(self) > window:
                    self.truncate(window)
                self.cache = self.cache.resized(window)

    def plan_captures(self, k_max: int) -> None:
        """Capture the shapes a schedule drafting up to ``k_max`` tokens a round uses
        (:func:`engine.model.capture.capture_shapes`), each at its first use."""
        self.capture.set_shapes(capture_shapes(k_max))

    @property
    def ids(self) -> list[int]:
        """The cached token ids (reads back any fed as a device tensor first)."""
        self.resolve_pending()
        return self._ids

    def resolve_pending(self, known: Sequence[int] | None = None) -> None:
        """Append the ids fed as device tensors to :attr:`ids`: ``known`` when the caller already
        holds them on the host (it read them back itself), else one transfer."""
        if not self._pending:
            return
        if known is not None and len(known) != self._pending_n:
            raise ValueError(f"{len(known)} ids given for {self._pending_n} pending")
        values = list(known) if known is not None else torch.cat(self._pending).tolist()
        self._ids.extend(int(t) for t in values)
        self._pending.clear()
        self._pending_n = 0

    def restrict_vocab(self, ids: torch.Tensor) -> bool:
        """Compute logits for the token ids ``ids`` only (``-inf`` elsewhere), for a
        draft that proposes from frequent tokens (FR-Spec). False when this model
        runs through transformers' forward, which cannot."""
        if self._lean is None:
            return False
        from engine.model.head import subset_head

        lean = self._lean
        norm = (lean.final_norm, lean.final_eps) if lean.head_folds else None  # folded as the full head folds it
        lean.use_head(*subset_head(self.model, ids.to(self.device.torch_device), norm))
        self.capture.invalidate()  # the captured passes ran the full head
        return True

    def __len__(self) -> int:
        return len(self._ids) + self._pending_n

    @torch.inference_mode()
    def forward(self, new_ids: Sequence[int] | torch.Tensor, logits_to_keep: int = 1) -> torch.Tensor:
        """Append ``new_ids`` to the cache and return the last logits.

        Args:
            new_ids: ``[n]`` token ids following ``self.ids``; ``n >= 1``: host ints, or a
                long tensor on the device (read back later, see :meth:`resolve_pending`).
            logits_to_keep: how many trailing positions to return logits for
                (``0`` returns none, saving the output layer during prefill).

        Returns:
            ``[logits_to_keep, V]`` float32 logits; row ``i`` predicts the token
            after ``new_ids[n - logits_to_keep + i]``.

        More than ``prefill_chunk`` host ids are fed in chunks: all but the last
        piece (at least ``logits_to_keep`` ids) without logits.
        """
        if isinstance(new_ids, torch.Tensor):
            if new_ids.numel() == 0:
                raise ValueError("forward needs at least one new token")
            return self._pass(new_ids.reshape(-1), logits_to_keep)
        if not new_ids:
            raise ValueError("forward needs at least one new token")
        n, chunk = len(new_ids), self.prefill_chunk
        last = max(n - (n - 1) // chunk * chunk, min(logits_to_keep, n))
        for begin in range(0, n - last, chunk):
            self._pass(new_ids[begin : min(begin + chunk, n - last)], 0)
        return self._pass(new_ids[n - last :], logits_to_keep)

    def _pass(self, new_ids: Sequence[int] | torch.Tensor, logits_to_keep: int) -> torch.Tensor:
        """One model pass over ``new_ids`` ``[n]`` (see :meth:`forward`)."""
        on_device = isinstance(new_ids, torch.Tensor)
        if on_device:
            input_ids = new_ids.reshape(1, -1).to(self.device.torch_device)  # type: ignore[union-attr]
        else:
            input_ids = ids_tensor(new_ids, self.device.torch_device)  # type: ignore[arg-type]
        keep = max(logits_to_keep, 1)
        try:
            with self.device.attention_kernels():
                if self._lean is not None:
                    watchers = _PASS_WATCHERS.get(self.model)
                    start = self.device.now() if watchers else 0.0
                    logits = self._lean_pass(input_ids, keep, row_exact=logits_to_keep > 0 or self._lean.prompt_row_exact)
                    for watch in watchers or ():
                        watch(len(new_ids), self.device.now() - start)
                else:
                    logits = self.model(
                        input_ids=input_ids, past_key_values=self.cache, use_cache=True, logits_to_keep=keep
                    ).logits
        except BaseException:
            # A failed pass (an OOM, say) may have extended some layers and not
            # others: put every layer back to the last consistent length.
            self.truncate(len(self))
            raise
        if on_device:
            self._pending.append(input_ids.reshape(-1))
            self._pending_n += input_ids.shape[1]
        else:
            self._ids.extend(int(t) for t in new_ids)  # type: ignore[union-attr]
        if logits_to_keep == 0:
            return logits.new_empty((0, logits.shape[-1]))
        return logits[0, -logits_to_keep:].float()

    def _lean_pass(self, input_ids: torch.Tensor, keep: int, row_exact: bool) -> torch.Tensor:
        """Logits ``[1, keep, V]`` of ``input_ids`` ``[1, T]`` on the lean path: the captured pass
        where there is one for this shape (the cache advanced here), else the eager one, row by
        row where ``row_exact`` (a pass whose logits are read; a prompt's pieces where that makes
        the cache independent of where a piece began: :attr:`~engine.model.lean.LeanForward.prompt_row_exact`)."""
        if isinstance(self.cache, StaticKV):
            assert self._lean is not None
            if len(self) + int(input_ids.shape[1]) > self.cache.window:  # a card would fail inside a kernel
                raise ContextLengthError(
                    f"{len(self)} cached tokens and {int(input_ids.shape[1])} new ones do not fit the "
                    f"{self.cache.window}-token window this model's cache was allocated for; start a new chat "
                    "or raise the profile's context_length")
            logits = self.capture.run(self._lean.static_pass, self.cache, input_ids, len(self), keep)
            if logits is not None:
                self.cache.advance(int(input_ids.shape[1]))
            else:
                logits = self._lean(input_ids, self.cache, len(self), keep)
            self._note_compile_failure()
            return logits
        return self._lean(input_ids, self.cache, len(self), keep, row_exact=row_exact)  # type: ignore[misc]

    @property
    def _compiled(self) -> CompiledPass | None:
        """The layer function this runner compiles (the fused one where a few-token pass takes it)."""
        if self._lean is None:
            return None
        fn = self._lean.step_fn if self._lean.step_fn is not None else self._lean.layer_fn
        return fn if isinstance(fn, CompiledPass) else None

    def _note_compile_failure(self) -> None:
        """A compile that failed in the last pass is told once, with the capture's news."""
        compiled = self._compiled
        if compiled is not None and compiled.failure:
            self.capture.note(compiled.failure)
            compiled.failure = None

    @property
    def passes_compiled(self) -> bool:
        """Whether this runner's static passes run compiled (``SPECCHAT_COMPILE``, no failure yet)."""
        return self._compiled is not None and self._compiled.compiled

    @torch.inference_mode()
    def compile_now(self) -> float:
        """Compile this runner's static passes now rather than at a reply's first tokens: a two-token
        pass and a one-token one over an empty cache (every width from two up shares the first's
        compile: only the width and the span vary), then the cache cropped back to empty. Returns
        the seconds spent (0 where passes are not compiled, or the cache holds tokens already). A
        compile that fails leaves uncompiled passes, said with the next reply's notices; so does
        running out of memory while compiling (the model stays loaded and decodes uncompiled)."""
        if not self.passes_compiled or len(self):
            return 0.0
        began = time.perf_counter()
        try:
            self.forward([0, 0])  # the first pass allocates the cache, so it runs eagerly
            self.forward([0])  # where capture is on, captured
        except torch.OutOfMemoryError as exc:
            assert self._compiled is not None
            self._compiled.disable(f"out of memory while compiling: {oom_summary(exc)}")
            self._note_compile_failure()
            self.device.release_memory()
        finally:
            self.truncate(0)
        self.device.synchronize()
        return time.perf_counter() - began

    def prefill(self, ids: Sequence[int]) -> None:
        """Feed ``ids`` without computing any logits (``[n]`` ids; nothing returned)."""
        if ids:
            self.forward(ids, logits_to_keep=0)

    def catch_up(self, context: Sequence[int], cancel: threading.Event | None = None) -> None:
        """Feed ``context`` (``[L]`` ids) past what the cache shares with it, all but its
        last token: the caller's next pass feeds that one and reads its logits. In pieces of
        :data:`PREFILL_PIECE` tokens (a card's: the prefill chunk), stopping between two once
        ``cancel`` is set; the cache keeps what was read.

        The pieces are the same with or without ``cancel``: a prompt read whole took other
        kernels (SDPA's causal one for a first read) than one read in pieces, so the app (which
        can stop a reading) and ``specchat generate`` (which cannot) wrote different greedy
        replies to one prompt: pocket's parted at token 99 of 512. Reading in pieces cost a
        600-token prompt 1.22 s against 1.10 on pocket here (2-core Zen 4, AVX-512 VNNI)."""
        done = self.sync(context, leave=1)
        piece = self.prefill_chunk if self.device.is_cuda else min(PREFILL_PIECE, self.prefill_chunk)
        while done < len(context) - 1 and (cancel is None or not cancel.is_set()):
            end = min(done + piece, len(context) - 1)
            self.prefill(context[done:end])
            done = end

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
        del self.ids[n:]  # reads back pending ids first

    def cached_length(self) -> int:
        """Tokens held by the cache itself (for tests of the invariant)."""
        lengths = {_layer_length(layer) for layer in getattr(self.cache, "layers", ())}
        if len(lengths) > 1:
            raise AssertionError(f"cache layers disagree on length: {sorted(lengths)}")
        return lengths.pop() if lengths else 0

    def release(self) -> None:
        """Drop the cache and the model reference so their memory can be freed."""
        self.capture.release()
        self.cache = self._new_cache()
        self._ids, self._pending, self._pending_n = [], [], 0
        self.model = None  # type: ignore[assignment]
        self._lean = None


def _layer_length(layer: object) -> int:
    keys = getattr(layer, "keys", None)
    if not getattr(layer, "is_initialized", False) or keys is None or keys.numel() == 0:
        return 0
    return int(keys.shape[-2])
