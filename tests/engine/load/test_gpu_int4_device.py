"""int4 on a card that cannot run torch's int4 kernels is refused before anything loads, and a
profile can say ``device = "cpu"`` (issue 23, item 1). Cards are faked on the CPU: a patched
compute capability and CUDA version."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

import engine.load.loader as loading
from engine.config.models_file import read_profiles_file, shipped_models_file
from engine.config.profiles import ModelProfile, ModelSpec
from engine.errors import ProfileError, QuantizationError
from engine.fetch.sources import ResolvedSource
from engine.model.device import Device
from engine.quant.int4 import Int4Linear, cuda_int4_problem, quantize_weight
from tests.tiny import save_tiny


def fake_card(monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int], cuda: str = "12.4") -> Device:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.version, "cuda", cuda)
    return Device(torch.device("cuda:0"))


@pytest.mark.parametrize(("capability", "cuda", "words"), [
    ((7, 5), "12.4", "compute capability 8.0 or newer (Ampere), and this one is 7.5"),
    ((7, 0), "12.1", "this one is 7.0"),
    ((8, 6), "11.8", "built for CUDA 11.8"),
    ((8, 0), "12.1", None),
    ((9, 0), "12.8", None),
])
def test_int4_kernels_need_compute_capability_8_and_cuda_12(
    monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int], cuda: str, words: str | None
) -> None:
    card = fake_card(monkeypatch, capability, cuda)
    problem = cuda_int4_problem(card.torch_device)
    assert problem is None if words is None else words in (problem or "")
    assert cuda_int4_problem(torch.device("cpu")) is None


def test_an_int4_layer_is_refused_on_a_turing_card_before_anything_is_packed(monkeypatch: pytest.MonkeyPatch) -> None:
    card = fake_card(monkeypatch, (7, 5))
    weights = quantize_weight(torch.randn(32, 64), 32)
    with pytest.raises(QuantizationError, match=r'device = "cpu".*nf4'):
        Int4Linear(weights, None, card.torch_device)  # a CPU build would fail at .to("cuda") were it reached


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("int4-device") / "m", seed=3)


def test_an_int4_profile_on_a_turing_card_is_refused_before_any_download(
    tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    card = fake_card(monkeypatch, (7, 5))
    located: list[Any] = []
    monkeypatch.setattr(loading, "locate", lambda *a, **k: located.append(a) or pytest.fail("located"))
    profile = ModelProfile(name="p", target=ModelSpec(str(tiny), quantization="int4"), drafter="ngram")
    with pytest.raises(QuantizationError) as err:
        loading.load_engine(profile, device=card)
    msg = str(err.value)
    assert "profile 'p'" in msg and "7.5" in msg and 'device = "cpu"' in msg and "nf4" in msg
    assert located == []
    nf4 = ModelProfile(name="p", target=ModelSpec(str(tiny), quantization="nf4"), drafter="ngram")
    loading.check_int4_device(nf4, card)  # other quantizations are not the kernels' business


def test_load_weights_refuses_int4_on_such_a_card_without_reading_weights(
    tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import transformers

    card = fake_card(monkeypatch, (7, 5))
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **k: pytest.fail("weights were read"))
    resolved = ResolvedSource(str(tiny), "dir", str(tiny))
    with pytest.raises(QuantizationError, match="compute capability 8.0"):
        loading.load_weights(resolved, ModelSpec(str(tiny), quantization="int4"), card)


def test_a_cpu_profile_runs_on_the_cpu_even_where_a_card_is_present(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    fake_card(monkeypatch, (8, 6))  # an "any" int4 profile asks whether the card runs int4
    monkeypatch.delenv("SPECCHAT_DEVICE", raising=False)
    spec = ModelSpec("org/name", quantization="int4")
    assert loading.profile_device(ModelProfile(name="c", target=spec, drafter="none", device="cpu")).torch_device.type == "cpu"
    assert loading.profile_device(ModelProfile(name="a", target=spec, drafter="none")).is_cuda
    with pytest.raises(ProfileError, match='"any", "cuda" or "cpu"'):
        ModelProfile(name="g", target=spec, drafter="none", device="gpu")


def test_the_shipped_cpu_profiles_say_device_cpu() -> None:
    profiles, _default = read_profiles_file(shipped_models_file())
    for name in ("pocket", "pocket-selfdraft"):
        assert profiles[name].device == "cpu", name
    # every shipped int4 profile is pinned to the CPU or may fall back to it ("any": a card below
    # int4's needs runs it on the CPU, test below): none is refused on a card by default
    for name, p in profiles.items():
        if any(s is not None and s.quantization == "int4" for s in (p.target, p.draft)):
            assert p.device in ("cpu", "any"), name
    assert profiles["coder"].device == "any"  # the real pair takes a card when one is there (issue 35 item 7)


def test_int4_for_a_card_is_built_one_weight_at_a_time_not_loaded_whole(
    tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import transformers

    import engine.quant as quant
    from tests.tiny import tiny_config

    card = fake_card(monkeypatch, (8, 6))
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **k: pytest.fail("the whole model was loaded on the host"))
    seen: dict[str, Any] = {}

    def streamed(location: str, config: Any, **kw: Any) -> str:
        seen.update(kw, location=location)
        return "the streamed model"

    monkeypatch.setattr(quant, "load_int4_streamed", streamed)
    resolved = ResolvedSource(str(tiny), "dir", str(tiny))
    spec = ModelSpec(str(tiny), quantization="int4", group_size=64)
    assert loading.load_weights(resolved, spec, card, tiny_config()) == "the streamed model"
    assert seen["device"] == torch.device("cuda:0") and seen["dtype"] == torch.bfloat16 and seen["group_size"] == 64
    assert seen["location"] == str(tiny) and seen["gguf"] is None
    # A GGUF source streams too, its blocks carried over as each weight is read.
    gguf = tiny / "model.gguf"
    gguf.write_bytes(b"GGUF")
    resolved = ResolvedSource(str(gguf), "gguf", str(tiny), gguf_file=gguf)
    spec = ModelSpec(str(gguf), quantization="int4", wide_blocks="planes")
    assert loading.load_weights(resolved, spec, card, tiny_config()) == "the streamed model"
    assert seen["gguf"] == gguf and seen["wide_planes"] is True


@pytest.mark.parametrize(("k", "tiles"), [(4096, 8), (1536, 8), (576, 4), (1536 + 32, 2), (48, None)])
def test_the_cuda_pack_takes_the_widest_tile_the_inputs_fill(k: int, tiles: int | None) -> None:
    """SmolLM2's 576 inputs are not a multiple of 8 tiles of 16 (128): they pack with 4 tiles
    instead of staying in full precision (any group size the kernel takes fills 2 tiles)."""
    from engine.quant.int4 import check_shape, cuda_inner_k_tiles

    assert cuda_inner_k_tiles(k) == tiles
    if tiles is not None:
        check_shape(64, k, 32, torch.device("cuda:0"))


def test_an_any_profile_with_int4_goes_to_a_capable_card_and_falls_back_to_the_cpu_with_the_reason(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 35 item 7: coder (device = "any") takes a card of compute capability 8.0+ and keeps
    the CPU as its fallback: no card, or a card whose int4 kernels do not run, says why."""
    monkeypatch.delenv("SPECCHAT_DEVICE", raising=False)
    coder = read_profiles_file(shipped_models_file())[0]["coder"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    device, reason = loading.profile_device_choice(coder)
    assert device.torch_device.type == "cpu" and reason == "no CUDA device found"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    fake_card(monkeypatch, (8, 6))
    device, reason = loading.profile_device_choice(coder)
    assert device.is_cuda and reason is None
    fake_card(monkeypatch, (7, 5))
    device, reason = loading.profile_device_choice(coder)
    assert device.torch_device.type == "cpu" and reason is not None and "this one is 7.5" in reason
    assert "run on the CPU instead" in reason
    loading.check_int4_device(coder, device)  # the CPU: nothing refused
    # an nf4 target needs the card whatever its int4 draft does: refused with the way out, not moved
    mixed = dataclasses.replace(coder, target=dataclasses.replace(coder.target, quantization="nf4"))
    device, reason = loading.profile_device_choice(mixed)
    assert device.is_cuda and reason is None
    with pytest.raises(QuantizationError, match="7.5"):
        loading.check_int4_device(mixed, device)


def test_a_profile_that_fell_back_to_the_cpu_says_so_in_its_engine_info(
    tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SPECCHAT_DEVICE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    profile = ModelProfile(name="p", target=ModelSpec(str(tiny)), drafter="none")
    engine = loading.load_engine(profile)
    try:
        assert engine.info.device.endswith("; not a card: no CUDA device found")
        assert engine.info.device.startswith("cpu (")
    finally:
        engine.close()
    pinned = loading.load_engine(dataclasses.replace(profile, device="cpu"))
    try:
        assert "not a card" not in pinned.info.device  # it asked for the CPU: nothing given up
    finally:
        pinned.close()
