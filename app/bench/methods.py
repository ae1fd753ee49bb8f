"""The methods ``specchat bench`` compares, by name (no torch here: the CLI's parser imports this).

specchat's decoder: ``plain`` (K = 0, the reference), ``spec`` (one per fixed
K), ``spec-adaptive``, ``ngram`` and ``suffix`` (drafting also from the prompts
before it in the set, as from earlier chats); transformers' ``generate``: ``hf-plain``,
``hf-assisted`` (transformers' default schedule), ``hf-assisted-constant`` (one
per K) and ``hf-prompt-lookup``; llama.cpp's ``llama-server`` on the same GGUF
(:mod:`app.bench.llamacpp`): ``llama.cpp-plain``, ``llama.cpp-spec`` (the same
draft GGUF) and ``llama.cpp-lookup`` (its n-gram drafter).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

LLAMA_METHODS = ("llama.cpp-plain", "llama.cpp-spec", "llama.cpp-lookup")
ALL_METHODS = ("plain", "spec", "spec-adaptive", "ngram", "suffix", "hf-plain", "hf-assisted", "hf-assisted-constant",
               "hf-prompt-lookup", *LLAMA_METHODS)
NEEDS_DRAFT = frozenset({"spec", "spec-adaptive", "hf-assisted", "hf-assisted-constant"})
PER_K = frozenset({"spec", "hf-assisted-constant"})


@dataclass(frozen=True)
class Method:
    """A decoding method and its K (None where there is no single K)."""

    name: str
    k: int | None = None

    @property
    def label(self) -> str:
        return self.name if self.k is None or self.name not in PER_K else f"{self.name} K={self.k}"


def plan_methods(
    names: Sequence[str], k_values: Sequence[int], has_draft: bool, lookup_k: int
) -> tuple[list[Method], list[str]]:
    """The methods to run, in order, and notes about any left out.

    ``plain`` is always included: it is the reference for speed and output.
    """
    notes: list[str] = []
    wanted = list(dict.fromkeys(["plain", *names]))
    unknown = [n for n in wanted if n not in ALL_METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(ALL_METHODS)}")
    methods: list[Method] = []
    for name in ALL_METHODS:
        if name not in wanted:
            continue
        if name in NEEDS_DRAFT and not has_draft:
            notes.append(f"{name} skipped: no model draft is loaded (use a profile with a draft, or --target SRC --draft SRC)")
        elif name in PER_K:
            methods.extend(Method(name, k) for k in k_values)
        elif name == "hf-prompt-lookup":
            methods.append(Method(name, lookup_k))
        else:
            methods.append(Method(name, 0 if name == "plain" else None))
    return methods, notes
