"""``specchat bench``'s measurement core: the same prompts through every method.

Methods (each greedy, each on the same loaded target, and the model-draft ones
on the same draft):

* ``plain``: specchat's loop with K = 0 (the reference for speed and output);
* ``spec`` (one per fixed K), ``spec-adaptive``, ``ngram``: specchat's decoder;
* ``hf-plain``, ``hf-assisted`` (the draft's own generation config, i.e.
  transformers' default schedule), ``hf-assisted-constant`` (one per K:
  ``num_assistant_tokens=K``, constant schedule, no confidence cut-off) and
  ``hf-prompt-lookup``: ``model.generate``;
* ``llama.cpp-*``: runners handed in through :attr:`BenchModels.external`
  (:mod:`app.bench.llamacpp`), timed by the same clock on streamed tokens.

Timing is the same for every method: a hook on each model times its forward
passes, and the emission of tokens is time-stamped (round events for specchat,
a streamer for transformers). The first emission includes reading the prompt
(prefill), so decode speed counts only the tokens after it, over the time after
it; end-to-end speed counts everything. Prompts are token ids here; turning
chat messages into ids is the caller's business (:mod:`app.bench.cli`).
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel

from app.bench.methods import NEEDS_DRAFT, Method
from app.bench.probes import ForwardLog, ForwardTimer, PeakMemory
from engine.decode.decoder import SpecDecoder
from engine.model.device import Device
from engine.decode.drafters import Drafter, ModelDrafter, NgramDrafter
from engine.decode.suffix import SuffixDrafter
from engine.events import GenerationParams, ReplyStats
from engine.decode.cost_model import CostModel

SPECCHAT_METHODS = ("plain", "spec", "spec-adaptive", "ngram", "suffix")
# Fixed-K and plain runs: no switch-off (fixed K never has one anyway). They keep the
# decoder's rare calibration steps, so that their self-reported speedup is sound.
FIXED_OPTIONS = {"auto_off_window": 0}

ProgressFn = Callable[[int, int, str], None]  # (done, total, what runs next)
ExternalRunner = Callable[[Sequence[int], Callable[[int], None]], "_Reply"]  # (prompt ids, on_emit) -> reply


@dataclass(frozen=True)
class BenchPrompt:
    """One prompt: a name, its class (chat, code, ...) and its token ids ``[L]``."""

    name: str
    prompt_class: str
    ids: tuple[int, ...]


@dataclass
class BenchModels:
    """What every method runs on: the loaded target, maybe a draft, and the reply settings."""

    target: PreTrainedModel
    device: Device
    draft: PreTrainedModel | None = None
    stop_ids: tuple[int, ...] = ()
    k_min: int = 1
    k_max: int = 8
    lookup_k: int = 8
    max_new_tokens: int = 128
    external: dict[str, ExternalRunner] = field(default_factory=dict)  # method name -> runner (llama.cpp)
    make_drafter: Callable[[], Drafter] | None = None
    """The model drafter as the profile makes it (frequent-token head, lookup); None: a plain one."""
    window: int | None = None
    """The profile's context window (a card's static cache is allocated to it; None: the model's own)."""
    tokenizer: Any = None
    """The target's tokenizer, which the draft shares (the loader checked): handed to transformers
    as both ``tokenizer`` and ``assistant_tokenizer`` when the two heads differ in width."""
    _draft_config: Any = None

    def __post_init__(self) -> None:
        if self.draft is not None:
            self._draft_config = copy.deepcopy(self.draft.generation_config)


@dataclass(frozen=True)
class Run:
    """One measured reply of one method to one prompt."""

    method: str
    k: int | None
    prompt: str
    prompt_class: str
    repeat: int
    prompt_tokens: int
    tokens: tuple[int, ...]
    total_s: float
    first_s: float  # time to the first emitted tokens (includes the prefill)
    first_tokens: int
    target: ForwardLog
    draft: ForwardLog
    target_passes: int  # passes that produced tokens (specchat's separate prefill pass is not one)
    proposed: int | None
    accepted: int | None
    per_position: tuple[float, ...] = ()
    peak_memory: int | None = None
    engine_stats: dict[str, Any] | None = None
    extra: dict[str, Any] | None = None  # an external method's own figures (llama-server's timings)

    @property
    def decode_tokens(self) -> int:
        return len(self.tokens) - self.first_tokens

    @property
    def decode_s(self) -> float:
        return self.total_s - self.first_s


@dataclass
class _Reply:
    """What a method's runner hands back: the ids and, for specchat, its stats; an external
    runner (no hooks see its passes) gives its own passes, proposed/accepted counts and peak memory."""

    tokens: list[int] = field(default_factory=list)
    stats: ReplyStats | None = None
    target_passes: int | None = None
    proposed: int | None = None
    accepted: int | None = None
    peak_memory: int | None = None
    extra: dict[str, Any] | None = None


class _Streamer:
    """A transformers streamer that time-stamps each batch of new tokens (the prompt's put is skipped)."""

    def __init__(self, on_emit: Callable[[int], None]) -> None:
        self.on_emit = on_emit
        self.seen_prompt = False

    def put(self, value: torch.Tensor) -> None:
        if not self.seen_prompt:
            self.seen_prompt = True
            return
        self.on_emit(int(value.numel()))

    def end(self) -> None:
        """Nothing to flush."""


def _drafter_for(models: BenchModels, method: Method, earlier: Sequence[Sequence[int]]) -> Drafter | None:
    if method.name in ("spec", "spec-adaptive"):
        assert models.draft is not None
        if models.make_drafter is not None:
            return models.make_drafter()
        return ModelDrafter(models.draft, models.device)
    if method.name == "suffix":
        return SuffixDrafter(earlier)
    return NgramDrafter() if method.name == "ngram" else None


def _run_specchat(models: BenchModels, method: Method, ids: Sequence[int], costs: CostModel,
                  on_emit: Callable[[int], None], drafter: Drafter | None) -> _Reply:
    """One reply through a fresh :class:`SpecDecoder` (fresh caches; ``costs`` persists per method)
    with ``drafter`` (:func:`_drafter_for`, built before the clock starts, as the app builds its
    drafter when a profile loads)."""
    adaptive = method.k is None
    options = {} if adaptive else FIXED_OPTIONS  # adaptive methods run with the app's defaults
    decoder = SpecDecoder(models.target, models.device, drafter, costs=costs, window=models.window, **options)
    params = GenerationParams(
        max_new_tokens=models.max_new_tokens, stop_token_ids=models.stop_ids,
        k=method.k, k_min=models.k_min, k_max=models.k_max,
    )
    reply = _Reply()
    for event in decoder.generate(list(ids), params):
        on_emit(len(event.token_ids))
        reply.tokens.extend(event.token_ids)
        reply.stats = event.stats
    return reply


@contextmanager
def _assistant_settings(models: BenchModels, method: Method) -> Iterator[None]:
    """The draft's generation config for one transformers call, restored afterwards."""
    if models.draft is None:
        yield
        return
    models.draft.generation_config = copy.deepcopy(models._draft_config)
    if method.name == "hf-assisted-constant":
        config = models.draft.generation_config
        config.num_assistant_tokens = method.k
        config.num_assistant_tokens_schedule = "constant"
        config.assistant_confidence_threshold = 0.0  # no early stop: exactly K per round
    try:
        yield
    finally:
        models.draft.generation_config = copy.deepcopy(models._draft_config)


def _hf_kwargs(models: BenchModels, method: Method) -> dict[str, Any]:
    stop = list(models.stop_ids)
    pad = getattr(models.target.generation_config, "pad_token_id", None)
    kwargs: dict[str, Any] = {
        "max_new_tokens": models.max_new_tokens, "do_sample": False,
        "eos_token_id": stop or None, "pad_token_id": pad if pad is not None else (stop[0] if stop else 0),
    }
    if method.name in ("hf-assisted", "hf-assisted-constant"):
        kwargs["assistant_model"] = models.draft
        if models.draft is not None and heads_differ(models.target, models.draft) and models.tokenizer is not None:
            kwargs["tokenizer"] = kwargs["assistant_tokenizer"] = models.tokenizer
    elif method.name == "hf-prompt-lookup":
        kwargs["prompt_lookup_num_tokens"] = method.k
    return kwargs


def heads_differ(target: PreTrainedModel, draft: PreTrainedModel) -> bool:
    """Whether the two models' output layers differ in width (Qwen2.5-7B's 152,064 rows against
    0.5B's 151,936: the same tokenizer, padded differently). transformers then refuses
    assisted generation unless it is given both tokenizers."""
    width = lambda m: int(m.config.get_text_config().vocab_size)  # noqa: E731
    return width(target) != width(draft)


def plan_assisted(models: BenchModels, methods: Sequence[Method]) -> tuple[list[Method], list[str]]:
    """The methods that can run, and notes: where the heads differ, transformers' assisted methods
    run with both tokenizers (its universal assisted decoding, which re-tokenizes text between
    the models: its speed includes that), or are skipped when no tokenizer is at hand."""
    assisted = [m for m in methods if m.name in ("hf-assisted", "hf-assisted-constant")]
    if not assisted or models.draft is None or not heads_differ(models.target, models.draft):
        return list(methods), []
    widths = f"{models.target.config.get_text_config().vocab_size} vs {models.draft.config.get_text_config().vocab_size}"
    if models.tokenizer is None:
        names = ", ".join(dict.fromkeys(m.name for m in assisted))
        return [m for m in methods if m not in assisted], [
            f"{names} skipped: the target's and the draft's output layers differ in width ({widths}) and "
            "transformers then needs both tokenizers, which are not at hand"]
    return list(methods), [
        f"hf-assisted methods get tokenizer and assistant_tokenizer: the output layers differ in width ({widths}), "
        "so transformers re-tokenizes between the models (universal assisted decoding), which its speed includes"]


def _run_hf(models: BenchModels, method: Method, ids: Sequence[int], on_emit: Callable[[int], None]) -> _Reply:
    """One reply through transformers' ``generate``."""
    input_ids = torch.tensor([list(ids)], dtype=torch.long, device=models.device.torch_device)
    with _assistant_settings(models, method):
        out = models.target.generate(
            input_ids, attention_mask=torch.ones_like(input_ids), streamer=_Streamer(on_emit),
            **_hf_kwargs(models, method),
        )
    return _Reply(tokens=[int(t) for t in out[0, input_ids.shape[1]:]])


class Bench:
    """Runs methods over prompts with shared hooks, memory tracking and per-method cost models."""

    def __init__(self, models: BenchModels) -> None:
        self.models = models
        self.memory = PeakMemory(models.device)
        self._costs: dict[Method, CostModel] = {}

    def measure(self, method: Method, prompt: BenchPrompt, repeat: int,
                earlier: Sequence[Sequence[int]] = ()) -> Run:
        """One reply, timed; ``repeat`` is recorded as given (-1 for the warm-up). ``earlier``:
        the exchanges (prompt and reply ids) of the prompts before this one, which the suffix
        drafter drafts from as it would from earlier chats."""
        models = self.models
        target_timer = ForwardTimer(models.target, models.device)
        draft_timer = ForwardTimer(models.draft, models.device) if models.draft is not None else None
        emissions: list[tuple[float, int]] = []
        drafter = _drafter_for(models, method, earlier) if method.name in SPECCHAT_METHODS else None

        def on_emit(n: int) -> None:
            if n:
                emissions.append((models.device.now(), n))

        try:
            self.memory.reset()
            start = models.device.now()
            reply = self._dispatch(method, prompt, on_emit, drafter)
            total = models.device.now() - start
        finally:
            target_timer.remove()
            if draft_timer is not None:
                draft_timer.remove()
        first_t, first_n = emissions[0] if emissions else (start + total, len(reply.tokens))
        return self._record(
            method, prompt, repeat, reply, total, first_t - start, first_n,
            target_timer.take(), draft_timer.take() if draft_timer else ForwardLog(),
        )

    def _dispatch(self, method: Method, prompt: BenchPrompt, on_emit: Callable[[int], None],
                  drafter: Drafter | None) -> _Reply:
        if method.name in self.models.external:
            return self.models.external[method.name](prompt.ids, on_emit)
        with torch.inference_mode():
            if method.name in SPECCHAT_METHODS:
                costs = self._costs.setdefault(method, CostModel())
                return _run_specchat(self.models, method, prompt.ids, costs, on_emit, drafter)
            return _run_hf(self.models, method, prompt.ids, on_emit)

    def _record(
        self, method: Method, prompt: BenchPrompt, repeat: int, reply: _Reply, total: float,
        first_s: float, first_n: int, target: ForwardLog, draft: ForwardLog,
    ) -> Run:
        stats = reply.stats
        if stats is not None:
            passes, proposed, accepted = stats.target_passes, stats.proposed, stats.accepted
        elif reply.target_passes is not None:  # an external runner counted for itself
            passes, proposed, accepted = reply.target_passes, reply.proposed, reply.accepted
        else:  # transformers: every target pass emits; a draft pass proposes one token
            passes = len(target.calls)
            proposed = len(draft.calls) if method.name in NEEDS_DRAFT else None
            accepted = len(reply.tokens) - passes if proposed is not None else None
        return Run(
            method=method.name, k=method.k, prompt=prompt.name, prompt_class=prompt.prompt_class,
            repeat=repeat, prompt_tokens=len(prompt.ids), tokens=tuple(reply.tokens), total_s=total,
            first_s=first_s, first_tokens=first_n, target=target, draft=draft, target_passes=passes,
            proposed=proposed, accepted=accepted,
            per_position=stats.per_position if stats is not None else (),
            peak_memory=reply.peak_memory if reply.peak_memory is not None else self.memory.peak(),
            engine_stats=stats.to_dict() if stats is not None else None, extra=reply.extra,
        )


def schedule(methods: Sequence[Method], prompts: Sequence[BenchPrompt], repeats: int) -> list[tuple[int, BenchPrompt, Method]]:
    """Measured replies in order: per repeat, per prompt, every method in turn.

    The method order rotates with the repeat, so no method always runs first or
    last after a prompt change, and slow drift of the machine hits all alike.
    """
    order: list[tuple[int, BenchPrompt, Method]] = []
    for r in range(repeats):
        shift = r % max(len(methods), 1)
        rotated = [*methods[shift:], *methods[:shift]]
        order.extend((r, p, m) for p in prompts for m in rotated)
    return order


def run_bench(
    models: BenchModels,
    prompts: Sequence[BenchPrompt],
    methods: Sequence[Method],
    repeats: int,
    progress: ProgressFn | None = None,
) -> list[Run]:
    """Warm every method up once (first prompt, not recorded), then measure ``repeats`` rounds."""
    if not prompts or not methods or repeats < 1:
        raise ValueError("need at least one prompt, one method and one repeat")
    bench = Bench(models)
    order = schedule(methods, prompts, repeats)
    total = len(methods) + len(order)
    done = 0
    for method in methods:
        _report(progress, done, total, f"warm-up {method.label}")
        bench.measure(method, prompts[0], -1)
        done += 1
    runs: list[Run] = []
    exchanges: dict[str, list[int]] = {}  # each prompt's ids and its (greedy, so common) reply
    for repeat, prompt, method in order:
        _report(progress, done, total, f"{method.label} · {prompt.prompt_class}/{prompt.name} · repeat {repeat + 1}")
        # The prompts before this one in the set, as earlier chats: never this prompt's own
        # reply from an earlier repeat, which would make a repeat a copy.
        earlier = [exchanges[p.name] for p in prompts[:prompts.index(prompt)] if p.name in exchanges]
        runs.append(bench.measure(method, prompt, repeat, earlier))
        exchanges.setdefault(prompt.name, [*prompt.ids, *runs[-1].tokens])
        done += 1
    _report(progress, done, total, "done")
    return runs


def _report(progress: ProgressFn | None, done: int, total: int, what: str) -> None:
    if progress is not None:
        progress(done, total, what)


def first_difference(expected: Sequence[int], got: Sequence[int]) -> int | None:
    """The first position where two id sequences differ (or where the shorter ends); None if equal."""
    for i, (a, b) in enumerate(zip(expected, got)):
        if a != b:
            return i
    return None if len(expected) == len(got) else min(len(expected), len(got))
