"""The methods the bench runs, in order: plain always first, one per K where a method takes one,
and a note for each left out."""
from __future__ import annotations

import pytest

from app.bench.methods import ALL_METHODS, LLAMA_METHODS, Method, plan_methods


def test_plan_methods() -> None:
    methods, notes = plan_methods(["spec", "hf-prompt-lookup"], [1, 3], has_draft=True, lookup_k=7)
    assert methods == [Method("plain", 0), Method("spec", 1), Method("spec", 3), Method("hf-prompt-lookup", 7)]
    assert notes == []
    methods, notes = plan_methods(list(ALL_METHODS), [2], has_draft=False, lookup_k=7)
    assert {m.name for m in methods} == {"plain", "ngram", "suffix", "hf-plain", "hf-prompt-lookup", *LLAMA_METHODS}
    assert len(notes) == 4
    with pytest.raises(ValueError, match="bogus"):
        plan_methods(["bogus"], [1], True, 4)


def test_labels_name_the_k_only_where_a_method_has_one() -> None:
    assert Method("spec", 3).label == "spec K=3" and Method("ngram").label == "ngram"
    assert Method("suffix").label == "suffix" and Method("plain", 0).label == "plain"
