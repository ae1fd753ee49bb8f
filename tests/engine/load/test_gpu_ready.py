"""What a first CUDA run would hit, proven on the CPU with stand-ins (issue 13).

* a draft that runs out of memory while loading falls back to n-gram, and what
  it held is freed before anything else runs;
* the draft is decided from memory measured after the target's warm-up pass;
* the compute dtype follows the card's compute capability (bf16 only from 8.0);
* flash_attention_2 is asked for only where it can run;
* bitsandbytes' per-call int8 warning is shown once.
"""
from __future__ import annotations

import gc
import logging
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

import engine.load.loader as loading
import engine.load.weights as weights
from engine.model.device import Device
from engine.decode.drafters import NgramDrafter
from engine.events import ChatMessage, GenerationParams
from engine.model.memory import resolve_dtype
from engine.config.profiles import ModelProfile, ModelSpec
from engine.fetch.sources import ResolvedSource
from tests.tiny import save_tiny, tiny_config

GiB = 2**30


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {"target": save_tiny(root / "target", seed=1), "draft": save_tiny(root / "draft", seed=2)}


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))


def pair(models: dict[str, Path], **kw: Any) -> ModelProfile:
    return ModelProfile(name="tiny", target=ModelSpec(str(models["target"])), drafter="model",
                        draft=ModelSpec(str(models["draft"])), context_length=64, **kw)


@dataclass(frozen=True)
class ScriptedDevice(Device):
    """The CPU, reporting scripted free memory, and checking at each release that
    what a failed load held is gone (the stand-in for ``empty_cache``)."""

    free: list[int] = field(default_factory=list)
    held: list[weakref.ref] = field(default_factory=list)
    leaks: list[int] = field(default_factory=list)
    releases: list[int] = field(default_factory=lambda: [0])

    def memory_free_total(self) -> tuple[int, int]:
        value = self.free.pop(0) if len(self.free) > 1 else self.free[0]
        return value, 64 * GiB

    def release_memory(self) -> None:
        gc.collect()
        self.releases[0] += 1
        self.leaks.extend(1 for ref in self.held if ref() is not None)


def reply(engine: Any) -> None:
    """The engine answers (a random tiny model's reply may be empty text)."""
    events = list(engine.chat([ChatMessage("user", "w1 w2 w3 w1 w2")], GenerationParams(max_new_tokens=6)))
    assert events[-1].finish_reason is not None


def test_a_draft_that_runs_out_of_memory_while_loading_falls_back_to_ngram(
    models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    device = ScriptedDevice(torch.device("cpu"), free=[32 * GiB])
    real = loading.load_weights

    def load_weights(resolved: ResolvedSource, spec: ModelSpec, dev: Device, config: Any = None,
                     on_layer: Any = None) -> Any:
        if resolved.location != str(models["draft"]):
            return real(resolved, spec, dev, config, on_layer)
        half_loaded = torch.ones(4 * 2**20)  # 16 MiB held by the failing frame
        device.held.append(weakref.ref(half_loaded))
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB (injected)")

    monkeypatch.setattr(loading, "load_weights", load_weights)
    stages: list[str] = []
    engine = loading.load_engine(pair(models), device=device, progress=lambda s, f: stages.append(s))
    info = engine.info
    assert info.mode == "ngram" and info.drafter == NgramDrafter().name and info.draft_bytes is None
    assert info.fallback_reason == (
        "draft model dropped: out of memory while loading it (CUDA out of memory: asked for 20.00 MiB); "
        "using the n-gram drafter"
    )
    assert any(s.startswith("loading draft") for s in stages)  # it was tried
    assert device.held and device.leaks == []  # freed before the release, not after
    reply(engine)
    engine.close()


def test_errors_other_than_oom_while_loading_the_draft_still_raise(
    models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = loading.load_weights

    def load_weights(resolved: ResolvedSource, spec: ModelSpec, dev: Device, config: Any = None,
                     on_layer: Any = None) -> Any:
        if resolved.location == str(models["draft"]):
            raise ValueError("a bug, not memory")
        return real(resolved, spec, dev, config, on_layer)

    monkeypatch.setattr(loading, "load_weights", load_weights)
    with pytest.raises(ValueError, match="a bug"):
        loading.load_engine(pair(models), device=Device(torch.device("cpu")))


def test_the_draft_is_decided_from_memory_measured_after_the_targets_warm_up(models: dict[str, Path]) -> None:
    # Planned with 32 GiB free; after the target and its warm-up pass only 100 MiB is left.
    device = ScriptedDevice(torch.device("cpu"), free=[32 * GiB, 100 * 2**20])
    stages: list[str] = []
    engine = loading.load_engine(pair(models), device=device, progress=lambda s, f: stages.append(s))
    assert engine.info.mode == "ngram"
    reason = engine.info.fallback_reason or ""
    assert engine.info.plan["choice"] == "target+ngram" and engine.info.plan["reason"] == reason  # what loaded
    assert reason.startswith("draft model dropped: with the target loaded, 100 MiB is free") and "n-gram" in reason
    assert not any(s.startswith("loading draft") for s in stages)  # never read
    assert device.releases[0] >= 1  # the warm-up's memory was released before measuring


def test_the_budget_left_after_the_target_counts_too(models: dict[str, Path]) -> None:
    # Plenty free, but the target (and the runtime it woke) took 3 GiB of a 3.2 GiB budget.
    device = ScriptedDevice(torch.device("cpu"), free=[32 * GiB, 29 * GiB])
    engine = loading.load_engine(pair(models), device=device, memory_budget=int(3.2 * GiB))
    assert engine.info.mode == "ngram" and "with the target loaded" in (engine.info.fallback_reason or "")
    roomy = ScriptedDevice(torch.device("cpu"), free=[32 * GiB, 31 * GiB])
    assert loading.load_engine(pair(models), device=roomy, memory_budget=int(3.2 * GiB)).info.mode == "spec"


def fake_cuda(monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int]) -> Device:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    return Device(torch.device("cuda:0"))


@pytest.mark.parametrize(("capability", "fast"), [((7, 5), False), ((7, 0), False), ((8, 0), True), ((8, 6), True), ((9, 0), True)])
def test_bf16_only_from_compute_capability_8(monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int], fast: bool) -> None:
    device = fake_cuda(monkeypatch, capability)
    assert device.compute_capability() == capability and device.fast_bf16 is fast
    cfg = tiny_config()
    assert resolve_dtype("auto", "nf4", cuda=True, config=cfg, bf16=device.fast_bf16) == ("bfloat16" if fast else "float16")
    assert resolve_dtype("auto", "none", cuda=True, config=cfg, bf16=device.fast_bf16) == ("bfloat16" if fast else "float16")
    assert resolve_dtype("bfloat16", "none", cuda=True, bf16=device.fast_bf16) == "bfloat16"  # asked for by name


def test_cpu_dtype_and_int8_compute() -> None:
    assert not Device(torch.device("cpu")).fast_bf16 and Device(torch.device("cpu")).compute_capability() is None
    assert resolve_dtype("auto", "none", cuda=False, bf16=False) == "float32"
    # bitsandbytes' int8 matmul casts its input to float16 anyway (and logs it on every call).
    assert resolve_dtype("auto", "int8", cuda=True, bf16=True) == "float16"


class FakeModel:
    def to(self, device: torch.device) -> "FakeModel":
        return self

    def eval(self) -> "FakeModel":
        return self


@pytest.mark.parametrize(
    ("capability", "flash", "dtype", "attention"),
    [((8, 6), True, torch.bfloat16, "flash_attention_2"), ((8, 6), False, torch.bfloat16, None),
     ((7, 5), True, torch.float16, None)],
)
def test_load_weights_on_a_faked_card_picks_dtype_and_attention(
    models: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
    capability: tuple[int, int], flash: bool, dtype: torch.dtype, attention: str | None,
) -> None:
    import transformers
    import transformers.utils

    device = fake_cuda(monkeypatch, capability)
    monkeypatch.setattr(transformers.utils, "is_flash_attn_2_available", lambda: flash)
    seen: dict[str, Any] = {}

    def from_pretrained(location: str, **kwargs: Any) -> FakeModel:
        seen.update(kwargs)
        return FakeModel()

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    resolved = ResolvedSource(str(models["target"]), "dir", str(models["target"]))
    loading.load_weights(resolved, ModelSpec(str(models["target"])), device, tiny_config())
    assert seen["dtype"] == dtype and seen["device_map"] == {"": 0}
    assert seen.get("attn_implementation") == attention


def test_the_int8_cast_warning_is_shown_once(monkeypatch: pytest.MonkeyPatch) -> None:
    logger = logging.getLogger("bitsandbytes.autograd._functions")
    monkeypatch.setattr(logger, "filters", [])  # an int8 load in an earlier test installed the loader's
    once = weights._Once()
    once.install()
    once.install()  # idempotent
    try:
        records: list[logging.LogRecord] = []
        handler = logging.Handler()
        handler.emit = records.append  # type: ignore[method-assign]
        logger.addHandler(handler)
        for _ in range(224):  # one forward of an 8B model: every linear layer
            logger.warning("MatMul8bitLt: inputs will be cast from %s to float16 during quantization", torch.bfloat16)
        logger.warning("something else")
        assert [r.getMessage() for r in records] == [
            "MatMul8bitLt: inputs will be cast from torch.bfloat16 to float16 during quantization", "something else"]
    finally:
        logger.removeHandler(handler)
        logger.removeFilter(once)


def test_compiled_passes_compile_while_loading_behind_a_stage_of_their_own(
    models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where passes compile (a card by default; here the static cache and a stand-in compiler), the
    loader compiles them under its own stage, so the first reply starts decoding at once; elsewhere
    there is no such stage."""
    import torch._dynamo

    from engine.model.capture import RecordingBackend

    torch._dynamo.reset()
    monkeypatch.setenv("SPECCHAT_COMPILE", "aot_eager")
    device = Device(torch.device("cpu"), static_cache=True, graphs=RecordingBackend())
    stages: list[str] = []
    engine = loading.load_engine(pair(models), device=device, progress=lambda s, f: stages.append(s))
    compiling = [s for s in stages if s.startswith(loading.COMPILE_STAGE)]
    assert compiling and stages.index(compiling[0]) < stages.index("ready")
    graphs = int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    assert graphs >= 2 and len(engine.decoder.target) == 0
    reply(engine)
    assert int(torch._dynamo.utils.counters["stats"]["unique_graphs"]) == graphs  # the reply compiled nothing
    engine.close()
    monkeypatch.setenv("SPECCHAT_COMPILE", "0")
    stages.clear()
    loading.load_engine(pair(models), device=device, progress=lambda s, f: stages.append(s)).close()
    assert not any(s.startswith(loading.COMPILE_STAGE) for s in stages)
