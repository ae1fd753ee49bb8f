"""Captured passes: a runner's fixed-shape passes recorded once and replayed (CUDA graphs).

At batch size one a small model's step on a card is bound by the host: some 250 kernel
launches a token at ~7 µs each, and the card idle 80% of the time (docs/gpu.md). Over a
:class:`~engine.model.kv.StaticKV` every pass of ``T`` new tokens keeping ``keep`` rows of
logits has fixed shapes, so it can be captured once and replayed with one launch, as
vLLM's CUDA-graph runner and gpt-fast do. :class:`PassCapture` is the bookkeeping, owned by
the :class:`~engine.decode.runner.ModelRunner` whose cache the passes write:

* **which shapes** (``(T, keep)``, :func:`capture_shapes`): the one-token step ``(1, 1)``;
  each verify pass ``(K + 1, K + 1)`` for ``K = 1 .. k_max`` of the schedule; a draft's
  catch-up over the target's token and its own last one ``(2, 1)``; in a chain of rounds
  (:mod:`engine.decode.chain`), a draft's ``(2, 1)`` pass together with its ``K`` greedy steps, one
  capture per ``K`` (:meth:`PassCapture.run_steps`). Anything else (prefill chunks, a draft
  lagging behind a lookup's round) runs eagerly.
* **over which keys** (:func:`attention_span`): a pass attends over the first ``span`` keys of
  the window, the tokens cached so far rounded up to a step of a quarter of their power of two
  (at least :data:`SPAN_STEP`), so a graph is captured per shape and span. Attention over the
  whole window at every step cost an H200 1.8 ms a token on a 4,096-token window, three times
  the rest of the pass (docs/gpu.md); a span reads fewer than 256 keys past the cached ones up
  to 1,024, and less than a third of its keys beyond. Captures of the :data:`SPANS_HELD` spans
  used last are kept, older ones dropped (a new chat starts over at the smallest span; a
  capture costs 0.01-0.1 s). A card's fused attention (:mod:`engine.model.card_attention`) reads
  the keys' reach from the positions: its passes (:attr:`PassCapture.spanless_rows`) are
  captured once for every span.
* **when**: lazily, at a shape's first use (a pass that was never needed costs nothing),
  after the cache exists (the first prefill allocates it eagerly).
* **with what**: per shape, static input buffers, ids ``[1, T]`` and positions ``[T]``, which
  a replay's caller fills (one copy and one add on the card, no host sync); the output is
  copied out, so a later replay never overwrites logits a caller still holds.
* **again**: when the cache was reallocated (a new window; :attr:`StaticKV.generation`) or
  the runner changed what the pass computes (:meth:`PassCapture.invalidate`: a restricted head).
* **not at all**: with ``SPECCHAT_CUDA_GRAPHS=0``, on the CPU, or after a capture failed (an op
  that cannot be captured, out of memory while capturing, a driver without graphs): eager
  passes from then on for that runner, the reason given once (:meth:`PassCapture.take_notice`,
  and ``engine.log`` through :mod:`logging`). The pass that failed is run eagerly; the reply
  is intact.

The backend does the recording: :class:`CudaGraphs` (``torch.cuda.CUDAGraph``, one memory pool
per runner), or a stand-in with the same interface that records captures and calls the
function on the static buffers (the CPU tests' :class:`RecordingBackend`).

Captured or not, a static pass may go through ``torch.compile`` first
(:class:`engine.model.compiled.CompiledPass`); a graph then replays the fused kernels.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from engine.model.compiled import switched_off

log = logging.getLogger(__name__)

ENV = "SPECCHAT_CUDA_GRAPHS"
"""``0`` turns captured passes off (eager passes over the same static cache)."""
WARMUP_RUNS = 2
"""Eager runs on a side stream before a capture: lazily created kernels, cuBLAS workspaces and
autotuning happen there, not inside the graph (PyTorch's recipe)."""

SPAN_STEP = 256
"""The smallest span of keys a captured pass attends over (:func:`attention_span`)."""
SPANS_HELD = 2
"""Spans whose captures are kept (the current one and the last before it)."""

Shape = tuple[int, int]
"""``(T, keep)``: new tokens fed and rows of logits kept."""
StaticPass = Callable[[torch.Tensor, Any, torch.Tensor, int, int], torch.Tensor]
"""``f(ids [1, T], cache, positions [T], keep, span) -> logits [1, keep, V]`` (``LeanForward.static_pass``:
attention over the first ``span`` keys of the cache)."""
StepsPass = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``f(ids [1, T], positions [T]) -> out``: what a capture records, on its static id and position
buffers (a pass; or a draft's pass and its greedy steps, :meth:`PassCapture.run_steps`)."""


def capture_shapes(k_max: int) -> frozenset[Shape]:
    """The shapes worth capturing for a schedule drafting at most ``k_max`` tokens a round:
    ``(1, 1)``, ``(2, 1)`` and ``(K + 1, K + 1)`` for ``K = 1 .. k_max``."""
    return frozenset({(1, 1), (2, 1), *((k + 1, k + 1) for k in range(1, k_max + 1))})


def attention_span(end: int, window: int) -> int:
    """How many keys a captured pass whose last token sits at position ``end - 1`` attends over:
    ``end`` rounded up to a multiple of ``max(SPAN_STEP, 2**(bit_length(end - 1) - 2))`` (at most
    four spans an octave: fewer than 256 keys past ``end`` up to 1,024, under a third of the span
    beyond), never past ``window``."""
    if end < 1:
        raise ValueError(f"a pass ends at a position of at least 1, got {end}")
    step = max(SPAN_STEP, 1 << max(0, (end - 1).bit_length() - 2))
    return min(window, -(-end // step) * step)


def _copy_out(out: torch.Tensor) -> torch.Tensor:
    """A replay's output copied out of the graph's buffer (the next replay overwrites it): logits
    as float32, which is what the runner hands on (the cast and the copy one kernel, not two),
    anything else (a draft's picks) as it is."""
    return out.to(torch.float32, copy=True) if out.is_floating_point() else out.clone()


def graphs_disabled() -> bool:
    """Whether ``SPECCHAT_CUDA_GRAPHS=0`` (or ``false``/``off``/``no``) is set."""
    return switched_off(ENV)


class GraphBackend(Protocol):
    """Records a function of static tensors once and returns its replay."""

    name: str

    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[Callable[[], torch.Tensor], torch.Tensor]:
        """Capture ``fn`` (which reads and writes only tensors that outlive it) and run it once:
        returns its replay (reruns it on the same tensors, returns its output) and this first
        run's output."""
        ...

    def release(self) -> None:
        """Forget everything captured (its memory may be freed once the replays are dropped)."""
        ...


class CudaGraphs:
    """``torch.cuda.CUDAGraph`` captures sharing one memory pool (the runner's passes never run
    concurrently, and their outputs are copied out after each replay)."""

    name = "cuda graphs"

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._pool: Any = None

    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[Callable[[], torch.Tensor], torch.Tensor]:
        if not torch.cuda.is_available():
            raise RuntimeError("this torch has no CUDA support")
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                fn()
        current.wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = fn()
        graph.replay()  # the capture ran nothing; this computes the pass the caller asked for

        def replay() -> torch.Tensor:
            graph.replay()
            return out

        return replay, out  # the replay holds the graph: dropping it frees the graph

    def release(self) -> None:
        self._pool = None


@dataclass
class _Captured:
    ids: torch.Tensor  # [1, T] long: the replay's input ids
    positions: torch.Tensor  # [T] long: the replay's positions
    offsets: torch.Tensor  # [T] long: 0 .. T - 1 (positions = offsets + start)
    replay: Callable[[], torch.Tensor]


class PassCapture:
    """Which of a runner's passes are captured, when to capture them (again), and the fallback."""

    def __init__(self, backend: GraphBackend | None, shapes: Iterable[Shape] = capture_shapes(8),
                 off_reason: str | None = None) -> None:
        """``backend`` None: every pass eager (``off_reason`` says why, if anyone should know)."""
        self.backend = backend
        self.shapes = frozenset(shapes)
        self.reason = off_reason
        """Why passes run eagerly (None while capture is on); see :meth:`take_notice`."""
        self._untold = off_reason is not None
        self._notes: list[str] = []
        self._captured: dict[tuple[int, int, int, int], _Captured] = {}  # (T, keep, span, draft steps or 0)
        self._spans: list[int] = []  # spans captured, the last used last
        self._cache: Any = None
        self._generation = -1
        self.captures = 0
        """Captures made (recaptures included)."""
        self.capture_s = 0.0
        """Seconds spent capturing (warm-up runs included): the lazy capture's cost."""
        self.replays = 0
        self.spanless_rows = 0
        """Passes of at most this many tokens read no span (a card's fused attention reads the keys'
        reach from the positions, :mod:`engine.model.card_attention`): one capture serves every
        position, where others are captured per span."""

    @property
    def active(self) -> bool:
        return self.backend is not None and self.reason is None

    def captured_shapes(self) -> frozenset[Shape]:
        """The ``(T, keep)`` shapes captured for some span."""
        return frozenset((t, keep) for t, keep, _, _ in self._captured)

    def captured_spans(self) -> list[int]:
        """The spans whose captures are held, the last used last."""
        return list(self._spans)

    def set_shapes(self, shapes: Iterable[Shape]) -> None:
        """Capture ``shapes`` from now on; drops captures of shapes no longer wanted."""
        self.shapes = frozenset(shapes)
        for key in [k for k in self._captured if k[:2] not in self.shapes]:
            del self._captured[key]

    def invalidate(self) -> None:
        """What the passes compute changed (a restricted head): capture each shape again at its next use."""
        self._captured.clear()
        self._spans.clear()
        if self.backend is not None:
            self.backend.release()

    def _use_span(self, span: int) -> None:
        """``span`` is the one in use: keep the captures of the :data:`SPANS_HELD` spans used last."""
        if self._spans and self._spans[-1] == span:
            return
        if span in self._spans:
            self._spans.remove(span)
        self._spans.append(span)
        for old in self._spans[:-SPANS_HELD]:
            for key in [k for k in self._captured if k[2] == old]:
                del self._captured[key]
        del self._spans[:-SPANS_HELD]

    def take_notice(self) -> str | None:
        """Why captured passes are off, the first time it is asked after that was decided, and any
        :meth:`note` not yet told."""
        told = [self.reason] if self._untold and self.reason else []
        self._untold = False
        told, self._notes = told + self._notes, []
        return "; ".join(told) or None

    def note(self, message: str) -> None:
        """Something about this runner's passes the user should hear once (a compile that failed)."""
        self._notes.append(message)

    def run(self, static_pass: StaticPass, cache: Any, input_ids: torch.Tensor, start: int,
            keep: int) -> torch.Tensor | None:
        """Logits ``[1, keep, V]`` of ``input_ids`` ``[1, T]`` at positions ``start .. start + T - 1``
        from the captured pass of this shape (captured now if it was not yet); None when the
        pass is to run eagerly (not a captured shape, capture off, the cache not allocated yet,
        or the capture just failed). The cache's length is the caller's to advance."""
        return self.run_span(static_pass, cache, input_ids, start, attention_span(start + int(input_ids.shape[1]),
                                                                                 cache.window), keep)

    def run_span(self, static_pass: StaticPass, cache: Any, input_ids: torch.Tensor, start: int | torch.Tensor,
                 span: int, keep: int) -> torch.Tensor | None:
        """:meth:`run` over a given ``span`` (at least the pass's end), with ``start`` a host int or a
        0-d long device tensor: a pass whose position only the card knows (a chain of rounds,
        :mod:`engine.decode.chain`) is replayed without the host reading it."""
        return self._run((int(input_ids.shape[1]), keep), 0, cache, input_ids, start, span,
                         lambda ids, positions: static_pass(ids, cache, positions, keep, span))

    def run_steps(self, steps: StepsPass, cache: Any, input_ids: torch.Tensor, start: torch.Tensor, span: int,
                  k: int) -> torch.Tensor | None:
        """A draft's ``k`` greedy steps after its pass over ``input_ids`` ``[1, 2]`` at ``start,
        start + 1`` as **one** capture (``steps(ids, positions)``: every pass of the ``k`` and the
        picks between them; the runner's :meth:`~engine.decode.device_passes.DevicePositionPasses.draft_at`), so a
        chained round launches its draft once. Captured with the ``(2, 1)`` shape, per ``k`` and
        span; None where it runs eagerly (as :meth:`run`)."""
        return self._run((int(input_ids.shape[1]), 1), k, cache, input_ids, start, span, steps)

    def _run(self, shape: Shape, steps: int, cache: Any, input_ids: torch.Tensor, start: int | torch.Tensor,
             span: int, body: StepsPass) -> torch.Tensor | None:
        if not self.active or shape not in self.shapes or not cache.allocated():
            return None
        if cache is not self._cache or cache.generation != self._generation:  # new buffers: old graphs are stale
            self.invalidate()
            self._cache, self._generation = cache, cache.generation
        if shape[0] <= self.spanless_rows:
            span = 0  # what the pass reads does not depend on it
        self._use_span(span)
        entry = self._captured.get((*shape, span, steps))
        if entry is None:
            return self._capture(shape, span, steps, body, input_ids, start)
        self._fill(entry, input_ids, start)
        self.replays += 1
        return _copy_out(entry.replay())

    @staticmethod
    def _fill(entry: _Captured, input_ids: torch.Tensor, start: int | torch.Tensor) -> None:
        entry.ids.copy_(input_ids, non_blocking=True)
        torch.add(entry.offsets, start, out=entry.positions)

    def _capture(self, shape: Shape, span: int, steps: int, body: StepsPass, input_ids: torch.Tensor,
                 start: int | torch.Tensor) -> torch.Tensor | None:
        assert self.backend is not None
        t, keep = shape
        offsets = torch.arange(t, device=input_ids.device)
        entry = _Captured(torch.empty_like(input_ids), torch.empty_like(offsets), offsets, lambda: torch.empty(0))
        self._fill(entry, input_ids, start)
        began = time.perf_counter()
        try:
            entry.replay, out = self.backend.capture(lambda: body(entry.ids, entry.positions))
        except Exception as exc:  # noqa: BLE001 - any failure to capture means eager passes, said once
            self.disable(f"captured passes off, eager from now on (capturing a {t}-token pass failed: "
                         f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no message'})")
            return None
        self._captured[(t, keep, span, steps)] = entry
        self.captures += 1
        seconds = time.perf_counter() - began
        self.capture_s += seconds
        log.info("captured the %d-token pass (%s, %s) with %s in %.2f s", t,
                 f"then {steps} draft steps" if steps else f"{keep} rows of logits",
                 f"{span} keys" if span else "keys up to its positions", self.backend.name, seconds)
        return _copy_out(out)

    def disable(self, reason: str) -> None:
        """Eager passes from now on, for ``reason`` (told once, and logged)."""
        self.invalidate()
        self.reason, self._untold = reason, True
        log.warning("%s", reason)

    def release(self) -> None:
        """Drop every capture and the cache reference (the runner's memory is being freed)."""
        self.invalidate()
        self._cache, self._generation = None, -1


class RecordingBackend:
    """A stand-in for :class:`CudaGraphs` (the CPU tests, and a check of the bookkeeping anywhere):
    a capture runs the function once on the static buffers and records it; a replay calls it
    again on whatever the buffers hold, so outputs come through the same static-buffer path a
    graph's do. ``fail_with``: raise it at capture time (a capture that cannot be made)."""

    name = "recording stand-in"

    def __init__(self, fail_with: BaseException | None = None) -> None:
        self.fail_with = fail_with
        self.captured: list[Callable[[], torch.Tensor]] = []
        self.replayed = 0
        self.releases = 0

    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[Callable[[], torch.Tensor], torch.Tensor]:
        if self.fail_with is not None:
            raise self.fail_with
        out = fn()
        self.captured.append(fn)

        def replay() -> torch.Tensor:
            self.replayed += 1
            out.copy_(fn())  # the graph's output tensor, refreshed in place
            return out

        return replay, out

    def release(self) -> None:
        self.releases += 1
