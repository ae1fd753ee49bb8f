"""What a profile can run on a 4, 6, 8 or 12 GB CUDA card: the memory plan, asked per card.

No new arithmetic: each card size is given to :func:`engine.model.plan.plan_memory` as the
free memory a card of that size leaves (its size less the CUDA context, which ``mem_get_info``
never reports as free), with the compute dtype a card of compute capability 8.0 or newer runs
(bfloat16: the int4 kernels need 8.0 anyway). The plan keeps its own reserve on top. The window
is the profile's ``context_length`` where the target fits in it, else the widest half of it,
down to :data:`MIN_CARD_CONTEXT`; where the plan drops the draft at that window, the widest
window at which the pair would fit is said too. A card on which even the shortest window does
not hold the target is refused with the plan's own reason (the numbers).

Configs come from the model's own files where they are here, else from
:data:`engine.model.published.PUBLISHED_CONFIGS` (:func:`known_config`): nothing is downloaded.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.errors import MemoryPlanError
from engine.model.memory import GiB, fmt_bytes
from engine.model.plan import Plan, plan_memory
from engine.model.published import PUBLISHED_CONFIGS, published_config

if TYPE_CHECKING:
    from engine.config.profiles import ModelProfile, ModelSpec

CARD_SIZES_GB: tuple[int, ...] = (4, 6, 8, 12)
"""The consumer cards a CUDA-capable profile states its plan for (GiB: an "8 GB" card has 8192 MiB)."""
CUDA_CONTEXT_BYTES = 512 * 2**20
"""What the CUDA context itself takes on a card (about 0.5 GiB, docs/gpu.md), outside what
``torch.cuda.mem_get_info`` reports as free once it exists."""
MIN_CARD_CONTEXT = 1024
"""The shortest window a card plan offers: a chat of fewer tokens is hardly a chat."""

CHOICE_WORDS = {"target+draft": "pair", "target+ngram": "target + n-gram drafts", "target": "target only (plain)"}


def card_free_bytes(card_gb: int) -> int:
    """The free memory a ``card_gb`` GiB card leaves to specchat: its size less the CUDA context."""
    return card_gb * GiB - CUDA_CONTEXT_BYTES


def windows(context_length: int, minimum: int = MIN_CARD_CONTEXT) -> list[int]:
    """The windows a card plan tries, widest first: ``context_length``, then halves of it down to
    ``minimum`` (``context_length`` alone when it is below ``minimum``)."""
    out = [context_length]
    while out[-1] // 2 >= minimum:
        out.append(out[-1] // 2)
    return out


@dataclass(frozen=True)
class CardFit:
    """What one card size holds of a profile.

    ``plan``: the memory plan at the widest window that holds the target (None: refused, and
    ``refused`` says why); ``pair_context``: where that plan dropped the draft, the widest window
    at which the pair would fit (None: at none, or the pair fits at ``plan``'s window already).
    """

    card_gb: int
    plan: Plan | None
    refused: str | None = None
    pair_context: int | None = None
    short_refusal: str | None = None
    """The refusal's figures in a few words, for the profile list."""

    def line(self) -> str:
        """``6 GB: pair, context 4096, peak 3.21 GiB of 5.00 GiB``, or ``4 GB: refused: ...``."""
        if self.plan is None:
            return f"{self.card_gb} GB: does not fit: {self.short_refusal or self.refused}"
        p = self.plan
        text = (f"{self.card_gb} GB: {CHOICE_WORDS[p.choice]}, context {p.context_length}, "
                f"peak {fmt_bytes(p.planned_bytes)} of {fmt_bytes(p.available_bytes)}")
        if self.pair_context is not None:
            text += f" (the pair fits at context {self.pair_context})"
        return text

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data (``specchat profiles --json``)."""
        p = self.plan
        return {
            "card_gb": self.card_gb, "fits": p is not None, "refused": self.refused,
            "choice": p.choice if p else None, "context_length": p.context_length if p else None,
            "planned_bytes": p.planned_bytes if p else None, "available_bytes": p.available_bytes if p else None,
            "pair_context": self.pair_context, "line": self.line(),
        }


def plan_card(target_cfg: Any, draft_cfg: Any | None, profile: "ModelProfile", card_gb: int,
              minimum: int = MIN_CARD_CONTEXT) -> CardFit:
    """The plan for ``profile`` on a ``card_gb`` GiB card of compute capability 8.0+ (see the
    module docstring). The profile's ``memory_budget`` is left out: the card is the limit."""
    free = card_free_bytes(card_gb)

    def plan_at(window: int, room: int = free) -> Plan:
        sized = dataclasses.replace(profile, context_length=window, memory_budget=None)
        return plan_memory(target_cfg, draft_cfg, sized, room, cuda=True, bf16=True)

    refused: str | None = None
    chosen: Plan | None = None
    tried = windows(profile.context_length, minimum)
    for window in tried:
        try:
            chosen = plan_at(window)
            break
        except MemoryPlanError as exc:
            refused = str(exc)
    if chosen is None:  # the same plan with room to spare says what the target needs
        unbounded = plan_at(tried[-1], 2**62)
        short = (f"the target needs about {fmt_bytes(unbounded.target.total_bytes)} at context "
                 f"{unbounded.context_length}, {fmt_bytes(max(0, free - unbounded.reserve_bytes))} is available")
        return CardFit(card_gb, None, refused, short_refusal=short)
    pair_context = None
    if chosen.choice != "target+draft" and profile.drafter == "model" and draft_cfg is not None:
        for window in tried:
            if window < chosen.context_length and plan_at(window).choice == "target+draft":
                pair_context = window
                break
    return CardFit(card_gb, chosen, None, pair_context)


def plan_cards(target_cfg: Any, draft_cfg: Any | None, profile: "ModelProfile",
               sizes: tuple[int, ...] = CARD_SIZES_GB) -> list[CardFit]:
    """:func:`plan_card` for each card size."""
    return [plan_card(target_cfg, draft_cfg, profile, gb) for gb in sizes]


def known_config(spec: "ModelSpec") -> Any | None:
    """A model's config without downloading anything: ``config.json`` of a local directory, else
    the published config whose repository name the source names
    (``Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf`` -> ``Qwen/Qwen2.5-Coder-1.5B-Instruct``, the
    sizes its GGUF header carries); None when neither is known."""
    directory = Path(spec.source)
    if (directory / "config.json").is_file():
        try:
            fields = json.loads((directory / "config.json").read_text())
            from transformers import AutoConfig

            return AutoConfig.for_model(fields.pop("model_type"), **fields)
        except (OSError, ValueError, KeyError, TypeError):
            return None
    repo = published_repo(spec.source)
    return published_config(repo) if repo else None


def published_repo(source: str) -> str | None:
    """The published config a source stands for: the hub id itself, or the repository whose name
    a GGUF file name starts with (longest first, so ``-1.5B`` is not read as ``-1``)."""
    if source in PUBLISHED_CONFIGS:
        return source
    name = source.rstrip("/").rsplit("/", 1)[-1].lower()
    if not name.endswith(".gguf"):
        return None
    for repo in sorted(PUBLISHED_CONFIGS, key=len, reverse=True):
        base = repo.rsplit("/", 1)[-1].lower()
        if name.startswith(base) and name[len(base):len(base) + 1] in ("-", ".", "_"):
            return repo
    return None


def profile_card_plans(profile: "ModelProfile", sizes: tuple[int, ...] = CARD_SIZES_GB) -> list[CardFit] | None:
    """:func:`plan_cards` for a profile that can run on a card (a local one whose ``device`` is
    not ``"cpu"``), from :func:`known_config`; None for the rest, and where the target's config
    is not known without a download (a draft's unknown config plans as a dropped draft)."""
    if profile.backend != "local" or profile.device == "cpu":
        return None
    target = known_config(profile.target)
    if target is None:
        return None
    draft = known_config(profile.draft) if profile.draft is not None and profile.drafter == "model" else None
    return plan_cards(target, draft, profile, sizes)
