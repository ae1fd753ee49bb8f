"""int4 for a card, built one weight at a time (issue 23, item 6): the same layers, bit for bit,
as the plain path (whole model, then quantize), without the host ever holding more than one
full-precision linear weight; codes kept two to a byte for the cache; hub snapshots cached too.
Run on the CPU: the streamed builder takes the device it is given."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM

import engine.quant.cache as quant
import engine.quant.stream as stream
from engine.quant.int4 import Int4Linear, quantize_weight
from tests.tiny import save_tiny

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("stream") / "m", seed=4, tie=request.param)


def plain_int4(path: Path, quantize_head: bool) -> nn.Module:
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    quant.apply_int4(model, location=str(path) + "-plain", gguf=None, quantize_head=quantize_head, device=CPU)
    return model


@pytest.mark.parametrize("quantize_head", [True, False])
def test_streamed_int4_is_the_plain_int4_bit_for_bit(saved: Path, quantize_head: bool,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoConfig

    want_model = plain_int4(saved, quantize_head)
    read: list[str] = []
    events: list[str] = []
    real_read = stream._read

    def counting_read(path: Path, key: str) -> torch.Tensor:
        read.append(key)
        events.append("read " + key)
        return real_read(path, key)

    def watching_quantize(weight: torch.Tensor, group_size: int = 32):  # type: ignore[no-untyped-def]
        events.append("quantize")
        return quantize_weight(weight, group_size)

    monkeypatch.setattr(stream, "_read", counting_read)
    monkeypatch.setattr(stream, "quantize_weight", watching_quantize)
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("the whole model was loaded"))
    config = AutoConfig.from_pretrained(str(saved))
    got_model = quant.load_int4_streamed(str(saved), config, dtype=torch.float32, device=CPU,
                                         quantize_head=quantize_head)
    assert got_model is not None
    ids = torch.tensor([[3, 9, 4, 1, 7, 7, 2]])
    with torch.no_grad():
        want, got = want_model(ids).logits, got_model(ids).logits
    assert torch.equal(got, want)
    linears = [n for n, m in got_model.named_modules() if isinstance(m, Int4Linear)]
    assert linears == [n for n, m in want_model.named_modules() if isinstance(m, Int4Linear)]
    assert len(read) == len(set(read))  # each tensor read once
    linear_phase = [e for e in events if e == "quantize" or e.endswith("_proj.weight")]
    # read, pack, drop: never a second full-precision weight before the first is packed
    assert linear_phase and not any(a.startswith("read") and b.startswith("read")
                                    for a, b in zip(linear_phase, linear_phase[1:]))
    assert not any(p.is_meta for p in got_model.parameters())


def test_the_cache_holds_packed_codes_and_a_warm_start_reads_no_linear_weight(
    saved: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoConfig

    monkeypatch.setattr(quant.cpu_kernel, "matmul", lambda: None)  # as on a card (the CPU's kernel caches its layout)
    config = AutoConfig.from_pretrained(str(saved))
    first = quant.load_int4_streamed(str(saved), config, dtype=torch.float32, device=CPU)
    cache = quant._cache_file(str(saved), 32, True, False)
    assert first is not None and cache is not None and cache.is_file()
    from safetensors import safe_open

    with safe_open(str(cache), framework="pt") as f:
        codes = f.get_tensor("model.layers.0.mlp.down_proj.codes")
    down = first.model.layers[0].mlp.down_proj
    assert codes.dtype == torch.uint8 and tuple(codes.shape) == (down.out_features, down.in_features // 2)
    read: list[str] = []
    real_read = stream._read
    monkeypatch.setattr(stream, "_read", lambda path, key: read.append(key) or real_read(path, key))
    again = quant.load_int4_streamed(str(saved), config, dtype=torch.float32, device=CPU)
    assert again is not None and not any(k.endswith("_proj.weight") for k in read)
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        assert torch.equal(again(ids).logits, first(ids).logits)


def test_a_hub_snapshot_gets_an_int4_cache(saved: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quant, "local_snapshot", lambda location: saved if location == "org/model" else None)
    path = quant._cache_file("org/model", 32, True, False)
    assert path is not None and path.name.startswith(saved.name)
    monkeypatch.setattr(quant, "local_snapshot", lambda location: None)
    assert quant._cache_file("org/not-downloaded", 32, True, False) is None


def test_other_checkpoints_take_the_plain_path(tmp_path: Path, saved: Path) -> None:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(saved))
    assert stream.stream_int4(tmp_path, config, dtype=torch.float32, device=CPU) is None  # no safetensors
    config.model_type = "gpt2"
    assert stream.stream_int4(saved, config, dtype=torch.float32, device=CPU) is None


@pytest.mark.parametrize("wide_planes", [True, False], ids=["planes", "int4"])
def test_a_gguf_sources_blocks_are_carried_over_as_each_weight_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wide_planes: bool
) -> None:
    """A GGUF's converted copy streams to the same layers as the whole-model path (which loads
    it, then carries the blocks over), bit for bit: the same layers carried, the same logits,
    and a warm start from the cache that says which were carried."""
    from tests.engine.quant.test_gguf_blocks import mixed_gguf

    path, model = mixed_gguf(tmp_path)
    converted = tmp_path / "converted"
    model.save_pretrained(converted)
    whole = type(model).from_pretrained(converted, dtype=torch.float32).eval()
    want = quant.apply_int4(whole, location=str(tmp_path / "whole"), gguf=path, quantize_head=False,
                            device=CPU, wide_planes=wide_planes)
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("loaded whole"))
    reports: list[quant.QuantReport] = []
    real_stream = stream.stream_int4

    def keep_report(*a, **k):  # type: ignore[no-untyped-def]
        built = real_stream(*a, **k)
        reports.append(built[1])
        return built

    monkeypatch.setattr(stream, "stream_int4", keep_report)
    ids = torch.tensor([[1, 5, 9, 14, 20, 33, 2, 7]])
    with torch.no_grad():
        expected = whole(ids).logits
    for _ in range(2):  # the first build carries and writes the cache; the second reads it
        got = quant.load_int4_streamed(str(converted), model.config, dtype=torch.float32, device=CPU,
                                       quantize_head=False, gguf=path, wide_planes=wide_planes)
        assert got is not None
        assert sorted(reports[-1].carried_over) == sorted(want.carried_over) and want.carried_over
        with torch.no_grad():
            assert torch.equal(got(ids).logits, expected)
    assert len(want.carried_over) == (14 if wide_planes else 4)


def test_both_int4_paths_count_the_layers_they_build(saved: Path) -> None:
    """A first start packs for minutes: each path says how many layers are done, up to all of them."""
    from transformers import AutoConfig

    streamed: list[tuple[int, int]] = []
    built = quant.load_int4_streamed(str(saved), AutoConfig.from_pretrained(str(saved)), dtype=torch.float32,
                                     device=CPU, on_layer=lambda done, total: streamed.append((done, total)))
    assert built is not None
    layers = sum(isinstance(m, Int4Linear) for m in built.modules())
    plain: list[tuple[int, int]] = []
    model = AutoModelForCausalLM.from_pretrained(str(saved), dtype=torch.float32).eval()
    quant.apply_int4(model, location=str(saved) + "-counted", gguf=None, device=CPU,
                     on_layer=lambda done, total: plain.append((done, total)))
    for calls in (streamed, plain):
        assert [done for done, _ in calls] == list(range(layers + 1))  # one at a time, in order
        assert {total for _, total in calls} == {layers}
