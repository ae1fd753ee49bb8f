"""The memory plan: will the target, and the draft, fit? Pure arithmetic on the
estimates of :mod:`engine.model.memory`, decided before any weight is read.

Target and draft run one after the other, so a plan counts only the larger of their
transients (activations); weights, KV caches and captured passes are resident.
"""
from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

from engine.errors import MemoryPlanError
from engine.model.memory import ModelEstimate, context_window, estimate_model, fmt_bytes, max_positions, resolve_dtype

if TYPE_CHECKING:
    from engine.config.profiles import ModelProfile

DEFAULT_RESERVE_BYTES = 512 * 2**20
"""Kept back from free memory for the allocator and the runtime."""

Choice = Literal["target+draft", "target+ngram", "target"]


@dataclass(frozen=True)
class Plan:
    """What will be loaded, why, and the byte figures behind the choice."""

    choice: Choice
    reason: str
    free_bytes: int
    budget_bytes: int | None
    reserve_bytes: int
    available_bytes: int
    context_length: int
    target: ModelEstimate
    draft: ModelEstimate | None
    planned_bytes: int
    lookup: str = "n-gram lookup"
    """The lookup drafter of a ``target+ngram`` plan, by the name the HUD gives it (the
    suffix drafter is "suffix lookup")."""

    @property
    def headroom_bytes(self) -> int:
        return self.available_bytes - self.planned_bytes

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data (for ``EngineInfo.plan`` and ``--json``)."""
        d = asdict(self)
        for key, est in (("target", self.target), ("draft", self.draft)):
            if est is not None:
                d[key]["total_bytes"] = est.total_bytes
        d["headroom_bytes"] = self.headroom_bytes
        return d

    def summary(self) -> str:
        """One line for the HUD."""
        parts = [f"target {fmt_bytes(self.target.total_bytes)}"]
        if self.choice == "target+draft" and self.draft is not None:
            parts.append(f"draft {fmt_bytes(self.draft.resident_bytes)}")
        cap = f" (budget {fmt_bytes(self.budget_bytes)})" if self.budget_bytes is not None else ""
        choice = f"target+{self.lookup}" if self.choice == "target+ngram" else self.choice
        return (
            f"{choice}: {' + '.join(parts)} of {fmt_bytes(self.available_bytes)} available{cap}, "
            f"headroom {fmt_bytes(self.headroom_bytes)}"
        )

    def without_draft(self, reason: str) -> "Plan":
        """This plan with the draft model dropped after planning (its tokenizer differs, memory
        measured after the target's warm-up, a failed load): the target and a lookup drafter."""
        return dataclasses.replace(self, choice="target+ngram", reason=reason, planned_bytes=self.target.total_bytes)

    @staticmethod
    def dict_without_drafter(plan: dict[str, Any], reason: str) -> dict[str, Any]:
        """A plan's :meth:`to_dict` after its drafter was dropped while decoding (out of memory):
        the target alone, decoding plainly. An empty plan stays empty."""
        target = plan.get("target")
        if not plan or not isinstance(target, dict) or plan.get("choice") == "target":
            return plan
        planned = int(target.get("total_bytes", plan.get("planned_bytes", 0)))
        available = plan.get("available_bytes")
        return {**plan, "choice": "target", "reason": reason, "planned_bytes": planned,
                "headroom_bytes": available - planned if isinstance(available, int) else plan.get("headroom_bytes")}

    def draft_shortfall(self, free_now: int, used_by_target: int) -> str | None:
        """Re-check the draft against memory measured after the target was loaded and
        ran one pass (lazily loaded kernels, cuBLAS/bitsandbytes workspaces and
        fragmentation are then counted, not guessed). The draft's weights and cache,
        the target's KV cache (still to grow), the larger transient and the reserve
        must fit in ``free_now`` (and in the budget left after ``used_by_target``).
        Returns why the draft is dropped, or None when it fits."""
        if self.draft is None:
            return None
        room = free_now if self.budget_bytes is None else min(free_now, self.budget_bytes - used_by_target)
        need = (self.draft.resident_bytes + self.target.kv_bytes + self.reserve_bytes
                + max(self.target.activation_bytes, self.draft.activation_bytes))
        if need <= room:
            return None
        return (
            f"draft model dropped: with the target loaded, {fmt_bytes(max(room, 0))} is free but the draft, "
            f"the target's KV cache, working memory and the reserve need about {fmt_bytes(need)}; "
            "using the n-gram drafter"
        )


def plan_memory(
    target_cfg: Any,
    draft_cfg: Any | None,
    profile: "ModelProfile",
    free_bytes: int,
    reserve_bytes: int = DEFAULT_RESERVE_BYTES,
    *,
    memory_budget: int | None = None,
    cuda: bool = False,
    bf16: bool = True,
    draft_error: str | None = None,
    graphs: bool = False,
) -> Plan:
    """Choose target+draft, target+ngram or target alone; raise :class:`MemoryPlanError`
    when even the target does not fit.

    ``memory_budget`` (else ``profile.memory_budget``) caps ``free_bytes``;
    ``reserve_bytes`` is kept back for the allocator and the runtime.
    ``draft_error`` says why a configured draft could not be found (then
    ``draft_cfg`` is None). ``cuda`` and ``bf16`` pick the compute dtypes as
    :func:`resolve_dtype` does. ``graphs``: passes are captured (a card's static cache), so each
    model's estimate holds its graph pool.
    """
    budget = memory_budget if memory_budget is not None else profile.memory_budget
    usable = min(free_bytes, budget) if budget is not None else free_bytes
    available = max(0, usable - reserve_bytes)
    # Reserve for the window actually used: the target's own limit may be below context_length. A draft
    # whose limit is below that window is dropped (below): it must never decide where a reply ends.
    ctx = context_window(profile.context_length, target_cfg) or profile.context_length
    rows = (profile.k if profile.k is not None else profile.k_max) + 1
    t_spec = profile.target
    t_dtype = resolve_dtype(t_spec.dtype, t_spec.quantization, cuda=cuda, config=target_cfg, bf16=bf16)
    target = estimate_model(target_cfg, t_spec.quantization, t_dtype, ctx, rows, t_spec.group_size, t_spec.quantize_head,
                            graphs)
    draft: ModelEstimate | None = None
    if profile.drafter == "model" and draft_cfg is not None and profile.draft is not None:
        d_spec = profile.draft
        d_dtype = resolve_dtype(d_spec.dtype, d_spec.quantization, cuda=cuda, config=draft_cfg, bf16=bf16)
        draft = estimate_model(draft_cfg, d_spec.quantization, d_dtype, ctx, rows, d_spec.group_size,
                               d_spec.quantize_head, graphs)

    def make(choice: Choice, reason: str, planned: int) -> Plan:
        lookup = "suffix lookup" if profile.drafter == "suffix" else "n-gram lookup"
        return Plan(choice, reason, free_bytes, budget, reserve_bytes, available, ctx, target, draft, planned, lookup)

    if target.total_bytes > available:
        by_budget = budget is not None and budget < free_bytes
        limit = f"the memory budget of {fmt_bytes(budget)}" if by_budget else "free memory"
        smaller = {"none": "quantization = \"int4\" or \"nf4\"", "int8": "quantization = \"int4\" or \"nf4\""}.get(
            t_spec.quantization, "a smaller model")
        raise MemoryPlanError(
            f"the target {t_spec.label} does not fit: it needs about {fmt_bytes(target.total_bytes)} "
            f"(weights {fmt_bytes(target.weights_bytes)} + KV cache {fmt_bytes(target.kv_bytes)} "
            f"+ activations {fmt_bytes(target.activation_bytes)} for {ctx} tokens) but only "
            f"{fmt_bytes(available)} is available ({fmt_bytes(usable)} of {limit} minus "
            f"{fmt_bytes(reserve_bytes)} reserve). Try {smaller} in profile {profile.name!r}, a shorter "
            f"context_length, a larger --memory-budget if the budget is what limits it, or another profile.",
            room_helps=not by_budget,
        )
    if profile.drafter == "none":
        return make("target", "the profile has no drafter (plain decoding)", target.total_bytes)
    if profile.drafter in ("ngram", "suffix"):  # the suffix drafter's indexes: at most 15 MiB (engine.decode.suffix)
        return make("target+ngram", f"the profile uses the {profile.drafter} drafter", target.total_bytes)
    if draft is None:
        why = draft_error or "the draft model's config could not be read"
        return make("target+ngram", f"draft model dropped: {why}; using the n-gram drafter", target.total_bytes)
    draft_limit = max_positions(draft_cfg)
    if ctx is not None and draft_limit is not None and draft_limit < ctx:
        # It would cut replies (and refuse prompts) the target alone finishes: greedy output is
        # the target's alone, whatever the draft (a tester's pair, 256 and 200 positions).
        return make("target+ngram", f"draft model dropped: it holds {draft_limit} tokens of context, fewer than the "
                    f"target's {ctx}; set context_length = {draft_limit} in profile {profile.name!r} to keep it; "
                    "using the n-gram drafter", target.total_bytes)
    # Target and draft run one after the other, so only the larger transient counts.
    both = target.resident_bytes + draft.resident_bytes + max(target.activation_bytes, draft.activation_bytes)
    if both > available:
        return make(
            "target+ngram",
            f"draft model dropped: target + draft need about {fmt_bytes(both)} but only "
            f"{fmt_bytes(available)} is available; using the n-gram drafter",
            target.total_bytes,
        )
    return make("target+draft", "target and draft model fit", both)
