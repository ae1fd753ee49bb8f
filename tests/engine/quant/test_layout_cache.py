"""The int4 cache keeps what specchat's CPU kernel reads: a warm start packs nothing and gives the
same model bit for bit; an older cache of codes and scales is read once, rewritten and removed; a cache laid
out for another version of the kernel's layout is rebuilt, never misread."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from engine.quant import cpu_kernel, cpu_pack
from engine.quant.cache import _cache_file, _save, apply_int4
from tests.engine.quant.test_gguf_blocks import mixed_gguf

IDS = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])


@pytest.fixture(autouse=True)
def _kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if cpu_kernel.matmul6() is None:
        pytest.skip(f"specchat's CPU kernel cannot run here: {cpu_kernel.why_not()}")
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))


def _model(tmp_path: Path) -> tuple[Path, Path, type]:
    path, model = mixed_gguf(tmp_path)
    src = tmp_path / "src"
    model.save_pretrained(src)
    return path, src, type(model)


def _logits(kind: type, src: Path, gguf: Path) -> tuple[torch.Tensor, int]:
    fresh = kind.from_pretrained(src).eval()
    report = apply_int4(fresh, location=str(src), gguf=gguf, wide_planes=True)
    with torch.no_grad():
        return fresh(IDS).logits, len(report.carried_over)


def _no_packing(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a warm start packed weights")

    monkeypatch.setattr(cpu_pack, "pack", refuse)


def test_a_warm_start_takes_the_kernels_layout_as_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gguf, src, kind = _model(tmp_path)
    cold, carried = _logits(kind, src, gguf)
    cache = _cache_file(str(src), 32, True, True, layout=True)
    assert cache is not None and cache.is_file() and carried == 14
    with safe_open(str(cache), framework="pt") as f:
        keys = set(f.keys())
    assert any(k.endswith(".packed") for k in keys) and not any(k.endswith(".codes") for k in keys)
    _no_packing(monkeypatch)
    warm, carried = _logits(kind, src, gguf)
    assert torch.equal(warm, cold) and carried == 14


def test_an_older_cache_of_codes_is_read_once_and_rewritten(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gguf, src, kind = _model(tmp_path)
    real = cpu_kernel.matmul
    monkeypatch.setattr(cpu_kernel, "matmul", lambda: None)  # as before this cache: codes and scales
    apply_int4(kind.from_pretrained(src).eval(), location=str(src), gguf=gguf, wide_planes=True)
    monkeypatch.setattr(cpu_kernel, "matmul", real)
    older = _cache_file(str(src), 32, True, True)
    assert older is not None and older.is_file()
    gguf.unlink()  # whatever comes next comes from a cache
    first, _ = _logits(kind, src, gguf)
    assert _cache_file(str(src), 32, True, True, layout=True).is_file() and not older.is_file()  # type: ignore[union-attr]
    _no_packing(monkeypatch)
    second, carried = _logits(kind, src, gguf)
    assert torch.equal(first, second) and carried == 14


def test_an_older_cache_is_passed_over_where_the_gguf_gives_its_own_scales(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The older cache holds bf16-rounded scales; with the GGUF at hand the blocks are carried again, so the Q4_K
    and Q6_K layers keep their own scales (uint8 tables) and the logits are a cold build's."""
    gguf, src, kind = _model(tmp_path)
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cold"))
    cold, _ = _logits(kind, src, gguf)
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    real = cpu_kernel.matmul
    monkeypatch.setattr(cpu_kernel, "matmul", lambda: None)  # as before this cache: codes and scales
    apply_int4(kind.from_pretrained(src).eval(), location=str(src), gguf=gguf, wide_planes=True)
    monkeypatch.setattr(cpu_kernel, "matmul", real)
    assert _cache_file(str(src), 32, True, True).is_file()  # type: ignore[union-attr]
    warm, carried = _logits(kind, src, gguf)
    assert torch.equal(warm, cold) and carried == 14
    with safe_open(str(_cache_file(str(src), 32, True, True, layout=True)), framework="pt") as f:
        tables = {k.rsplit(".", 2)[-2]: f.get_tensor(k).dtype for k in f.keys() if k.endswith(".table")}
        q_codes = f.get_tensor(next(k for k in f.keys() if k.endswith("q_proj.packed")))
    assert tables["down_proj"] == torch.uint8  # Q6_K (mixed_gguf's TYPES)
    if cpu_pack.tiles():  # Q4_K: its headers in its tiles
        assert "q_proj" not in tables and q_codes.dim() == 4
    else:
        assert tables["q_proj"] == torch.uint8


def test_a_layout_of_another_version_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gguf, src, kind = _model(tmp_path)
    cold, _ = _logits(kind, src, gguf)
    this = _cache_file(str(src), 32, True, True, layout=True)
    monkeypatch.setattr(cpu_pack, "LAYOUT_VERSION", cpu_pack.LAYOUT_VERSION + 1)
    later = _cache_file(str(src), 32, True, True, layout=True)
    assert this is not None and later is not None and later != this
    from engine.quant.cache import _load

    assert _load(this) is None  # read by a later layout: refused, whatever its name
    rebuilt, carried = _logits(kind, src, gguf)
    assert later.is_file() and torch.equal(rebuilt, cold) and carried == 14


def test_a_layout_for_the_kernel_is_refused_where_the_kernel_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.quant.int4 import Int4Linear, quantize_weight
    from engine.errors import QuantizationError

    layout = Int4Linear(quantize_weight(torch.randn(64, 128), 32), None, torch.device("cpu")).layout()
    assert layout is not None
    monkeypatch.setattr(cpu_kernel, "matmul", lambda: None)
    with pytest.raises(QuantizationError, match="clear the int4 cache"):
        Int4Linear(layout, None, torch.device("cpu"))


def test_save_keeps_layouts_and_codes_side_by_side(tmp_path: Path) -> None:
    from engine.quant.cache import _load
    from engine.quant.int4 import Int4Linear, quantize_weight
    from tests.engine.quant.test_six_bit import six_bit

    a = Int4Linear(six_bit(16, 256, seed=3), None, torch.device("cpu"))
    b = quantize_weight(torch.randn(16, 256), 32)
    layout = a.layout()
    assert layout is not None
    _save(tmp_path / "c.safetensors", {"a": layout, "b": b}, ["a"], layouts={"a": layout})
    loaded, carried = _load(tmp_path / "c.safetensors")  # type: ignore[misc]
    got = loaded["a"]
    assert carried == ["a"] and isinstance(got, cpu_pack.KernelLayout)
    assert torch.equal(got.packed, layout.packed) and got.table.shape == (16, 0)
    assert (got.shape, got.group_size, got.planes) == ((16, 256), 16, 2)
    assert torch.equal(loaded["b"].codes, b.codes)  # type: ignore[union-attr]
    x = torch.randn(3, 256)
    assert torch.equal(Int4Linear(got, None, torch.device("cpu"))(x), a(x))


@pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="needs Linux's /proc/self/maps")
def test_a_warm_start_leaves_nothing_on_the_cache_files_mapping(tmp_path: Path) -> None:
    """A tensor left on the file's mapping keeps the whole file resident (1.4 GB more for coder)."""
    import gc

    gguf, src, kind = _model(tmp_path)
    _logits(kind, src, gguf)
    cache = _cache_file(str(src), 32, True, True, layout=True)
    assert cache is not None
    model = kind.from_pretrained(src).eval()
    apply_int4(model, location=str(src), gguf=gguf, wide_planes=True)
    gc.collect()
    assert str(cache) not in Path("/proc/self/maps").read_text()
    assert model(IDS).logits.isfinite().all()


def test_the_cache_an_older_specchat_wrote_is_removed_when_this_one_writes_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import engine.quant.cache as quant

    gguf, src, kind = _model(tmp_path)
    monkeypatch.setattr(quant, "CACHE_VERSION", quant.CACHE_VERSION - 1)
    monkeypatch.setattr(cpu_kernel, "matmul", lambda: None)  # and laid out as it was then: codes and scales
    apply_int4(kind.from_pretrained(src).eval(), location=str(src), gguf=gguf, wide_planes=True)
    older = _cache_file(str(src), 32, True, True)
    monkeypatch.undo()
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    assert older is not None and older.is_file()
    cold, _ = _logits(kind, src, gguf)
    now = _cache_file(str(src), 32, True, True, layout=True)
    assert now is not None and now.is_file() and now != older and not older.is_file()
    assert sorted(p.name for p in now.parent.iterdir()) == [now.name]
