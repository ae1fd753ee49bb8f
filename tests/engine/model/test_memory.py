"""The memory plan: estimates checked against real (tiny) models, every branch under budgets."""
from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch
from accelerate import init_empty_weights
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache, LlamaForCausalLM

from engine.errors import MemoryPlanError
from engine.model.memory import (
    GiB,
    PUBLISHED_CONFIGS,
    count_params,
    estimate_kv_bytes,
    estimate_weights_bytes,
    published_config,
    resolve_dtype,
)
from engine.model.plan import plan_memory
from engine.config.profiles import ModelProfile, ModelSpec
from engine.config.models_file import load_profiles
from tests.tiny import tiny_config

MiB = 2**20
TINY_QWEN = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=80, tie_word_embeddings=False)


def meta_param_count(config: object) -> int:
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config)
    if config.tie_word_embeddings:  # type: ignore[attr-defined]
        model.tie_weights()
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    "config",
    [tiny_config(tie=True), tiny_config(tie=False), AutoConfig.for_model("qwen2", **TINY_QWEN),
     AutoConfig.for_model("llama", **TINY_QWEN, attention_bias=True, mlp_bias=True, head_dim=32)],
    ids=["llama-tied", "llama-untied", "qwen2-qkv-bias", "llama-biases-headdim"],
)
def test_param_count_matches_the_model(config: object) -> None:
    assert count_params(config).total == meta_param_count(config)


def test_published_param_counts() -> None:
    """The table reproduces the published parameter counts (model cards)."""
    totals = {name: count_params(published_config(name)).total for name in PUBLISHED_CONFIGS}
    assert totals["HuggingFaceTB/SmolLM2-135M-Instruct"] == 134_515_008
    assert round(totals["Qwen/Qwen2.5-7B-Instruct"] / 1e9, 2) == 7.62
    assert round(totals["Qwen/Qwen2.5-0.5B-Instruct"] / 1e9, 2) == 0.49
    assert round(totals["Qwen/Qwen2.5-14B-Instruct"] / 1e9, 2) == 14.77
    assert round(totals["meta-llama/Llama-3.1-8B-Instruct"] / 1e9, 2) == 8.03
    assert round(totals["meta-llama/Llama-3.2-1B-Instruct"] / 1e9, 2) == 1.24


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_unquantized_weights_bytes_are_exact(dtype: str) -> None:
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_config(tie=False)).to(getattr(torch, dtype))
    real = sum(p.numel() * p.element_size() for p in model.parameters())
    assert estimate_weights_bytes(model.config, "none", dtype) == real


def test_quantized_estimates_are_smaller_in_order() -> None:
    cfg = published_config("Qwen/Qwen2.5-7B-Instruct")
    none, int8, nf4 = (estimate_weights_bytes(cfg, q, "bfloat16") for q in ("none", "int8", "nf4"))
    assert nf4 < int8 < none
    p = count_params(cfg)
    dense = (p.embedding + p.lm_head + p.other) * 2
    assert 0.5 < (nf4 - dense) / p.linear < 0.52  # 4 bits plus double-quant absmax
    assert 1.0 < (int8 - dense) / p.linear < 1.01


def test_kv_estimate_matches_a_real_cache() -> None:
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_config()).eval()
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(torch.randint(0, 60, (1, 37)), past_key_values=cache, use_cache=True)
    real = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
    assert estimate_kv_bytes(model.config, 37, "float32") == real


def test_resolve_dtype() -> None:
    cfg = tiny_config()
    assert resolve_dtype("auto", "none", cuda=False, config=cfg) == "float32"
    assert resolve_dtype("auto", "nf4", cuda=True, config=cfg) == "bfloat16"
    assert resolve_dtype("float16", "nf4", cuda=False) == "float16"


def profile(drafter: str = "model", budget: int | None = None, **kw: object) -> ModelProfile:
    draft = ModelSpec("Qwen/Qwen2.5-0.5B-Instruct") if drafter == "model" else None
    return ModelProfile(name="t", target=ModelSpec("Qwen/Qwen2.5-7B-Instruct", quantization="nf4"),
                        drafter=drafter, draft=draft, context_length=4096, memory_budget=budget, **kw)  # type: ignore[arg-type]


TARGET, DRAFT = published_config("Qwen/Qwen2.5-7B-Instruct"), published_config("Qwen/Qwen2.5-0.5B-Instruct")


def test_plan_target_and_draft() -> None:
    plan = plan_memory(TARGET, DRAFT, profile(), 12 * GiB, cuda=True)
    assert plan.choice == "target+draft"
    assert plan.draft is not None
    assert plan.planned_bytes == plan.target.resident_bytes + plan.draft.resident_bytes + max(
        plan.target.activation_bytes, plan.draft.activation_bytes)
    assert plan.available_bytes == 12 * GiB - plan.reserve_bytes
    assert plan.headroom_bytes == plan.available_bytes - plan.planned_bytes > 0
    json.dumps(plan.to_dict())
    assert "\n" not in plan.summary() and plan.summary().startswith("target+draft")


def test_plan_drops_draft_when_only_the_target_fits() -> None:
    fits_target = plan_memory(TARGET, DRAFT, profile(), 100 * GiB, cuda=True)
    just_target = fits_target.target.total_bytes + fits_target.reserve_bytes + MiB
    plan = plan_memory(TARGET, DRAFT, profile(), just_target, cuda=True)
    assert plan.choice == "target+ngram"
    assert "draft model dropped" in plan.reason and "n-gram" in plan.reason
    assert plan.planned_bytes == plan.target.total_bytes <= plan.available_bytes


def test_budget_caps_free_memory() -> None:
    plenty = 80 * GiB
    by_profile = plan_memory(TARGET, DRAFT, profile(budget=7 * GiB), plenty, cuda=True)
    assert by_profile.choice == "target+ngram" and by_profile.budget_bytes == 7 * GiB
    assert by_profile.available_bytes == 7 * GiB - by_profile.reserve_bytes
    override = plan_memory(TARGET, DRAFT, profile(budget=7 * GiB), plenty, cuda=True, memory_budget=40 * GiB)
    assert override.choice == "target+draft"
    assert "budget 7.00 GiB" in by_profile.summary()


def test_target_that_does_not_fit_says_what_to_do() -> None:
    with pytest.raises(MemoryPlanError) as err:
        plan_memory(TARGET, DRAFT, profile(), 30 * GiB, cuda=True, memory_budget=3 * GiB)
    msg = str(err.value)
    assert "Qwen2.5-7B-Instruct (nf4) does not fit" in msg
    assert "budget of 3.00 GiB" in msg and "--memory-budget" in msg and "another profile" in msg
    assert re.search(r"needs about \d+\.\d\d GiB", msg)
    assert not err.value.room_helps  # the budget is the limit: closing the models loaded now cannot help
    with pytest.raises(MemoryPlanError) as short:
        plan_memory(TARGET, DRAFT, profile(), 3 * GiB, cuda=True)
    assert short.value.room_helps  # free memory is: closing them might
    unquantized = dataclasses.replace(profile(), target=ModelSpec("Qwen/Qwen2.5-7B-Instruct"))
    with pytest.raises(MemoryPlanError, match='quantization = "int4" or "nf4"'):
        plan_memory(TARGET, None, unquantized, 8 * GiB, cuda=True)


def test_plan_without_model_drafter() -> None:
    assert plan_memory(TARGET, None, profile("none"), 12 * GiB).choice == "target"
    ngram = plan_memory(TARGET, None, profile("ngram"), 12 * GiB)
    assert ngram.choice == "target+ngram" and ngram.draft is None
    missing = plan_memory(TARGET, None, profile(), 12 * GiB, draft_error="the draft is not cached")
    assert missing.choice == "target+ngram" and "the draft is not cached" in missing.reason


def test_reserve_is_kept_back() -> None:
    need = plan_memory(TARGET, None, profile("ngram"), 100 * GiB, reserve_bytes=0).target.total_bytes
    assert plan_memory(TARGET, None, profile("ngram"), need, reserve_bytes=0).choice == "target+ngram"
    with pytest.raises(MemoryPlanError):
        plan_memory(TARGET, None, profile("ngram"), need, reserve_bytes=MiB)


@pytest.mark.parametrize("name", ["qwen2.5-7b", "llama3.1-8b", "qwen2.5-14b"])
def test_shipped_gpu_profile_estimates_are_reproducible(name: str) -> None:
    """The "about N GiB peak" in each GPU profile's description is this plan's figure."""
    prof = load_profiles().get(name)
    assert prof.draft is not None
    plan = plan_memory(published_config(prof.target.source), published_config(prof.draft.source),
                       prof, 24 * GiB, cuda=True)
    assert plan.choice == "target+draft"
    stated = float(re.search(r"about (\d+\.\d) GiB peak", prof.description).group(1))  # type: ignore[union-attr]
    assert stated == round(plan.planned_bytes / GiB, 1)


def test_captured_passes_add_their_pool_to_each_models_resident_bytes() -> None:
    eager = plan_memory(TARGET, DRAFT, profile(), 12 * GiB, cuda=True)
    captured = plan_memory(TARGET, DRAFT, profile(), 12 * GiB, cuda=True, graphs=True)
    assert eager.target.graph_bytes == 0 and eager.draft is not None and eager.draft.graph_bytes == 0
    assert captured.draft is not None
    # Qwen2.5-7B, k_max 8: 9 rows of a block in bf16, fp32 scores over 4096 keys for 28 heads,
    # and 1 + 1 + 2 + ... + 9 rows of fp32 logits over 152,064 tokens that every capture keeps,
    # at each of the two spans of keys held.
    rows = 9
    expected = rows * (4 * 3584 + 3 * 18944) * 2 + 2 * 28 * rows * 4096 * 4 + 2 * (1 + 45) * 152064 * 4
    assert captured.target.graph_bytes == expected
    assert captured.target.resident_bytes == eager.target.resident_bytes + expected
    assert captured.planned_bytes == eager.planned_bytes + expected + captured.draft.graph_bytes
    # A card just big enough for the eager pair drops the draft once the pools are counted.
    tight = eager.planned_bytes + eager.reserve_bytes
    assert plan_memory(TARGET, DRAFT, profile(), tight, cuda=True).choice == "target+draft"
    assert plan_memory(TARGET, DRAFT, profile(), tight, cuda=True, graphs=True).choice == "target+ngram"


def test_a_draft_with_a_shorter_window_than_the_targets_is_dropped_unless_the_profile_fits_it() -> None:
    """A tester's pair (the target 256 positions, the draft 200): the window was the smaller,
    so the draft cut replies and refused prompts the target alone finished. Greedy output must be
    the target's whatever the draft: such a draft is dropped, and the reason says how to keep it."""
    import copy
    import dataclasses

    short = copy.deepcopy(DRAFT)
    short.max_position_embeddings = 2048
    plan = plan_memory(TARGET, short, profile(), 40 * GiB, cuda=True)  # the profile asks for 4096 tokens
    assert plan.choice == "target+ngram" and plan.context_length == 4096
    assert plan.reason == ("draft model dropped: it holds 2048 tokens of context, fewer than the target's 4096; set "
                           "context_length = 2048 in profile 't' to keep it; using the n-gram drafter")
    kept = plan_memory(TARGET, short, dataclasses.replace(profile(), context_length=2048), 40 * GiB, cuda=True)
    assert kept.choice == "target+draft" and kept.context_length == 2048
