"""A new int4 cache removes the ones it supersedes (the same model and settings from an older
version of specchat or of the kernel's layout, or from weights since changed) and nothing else."""
from __future__ import annotations

from pathlib import Path

import pytest

import torch

from engine.quant.cache import _drop_superseded, _save
from engine.quant.int4 import quantize_weight

GROUPS = {"layer": quantize_weight(torch.randn(16, 32), 32)}
NEW = "m-cccccccccccccccc-g32-k1.safetensors"


def _write(folder: Path, name: str, source: str | None = None) -> Path:
    path = folder / name
    _save(path, GROUPS, [])  # no source: as an older specchat wrote them, and nothing is removed
    if source is not None:
        from safetensors.torch import load_file, save_file

        save_file(load_file(str(path)), str(path), metadata={"group_size": "32", "source": source})
    return path


def test_only_the_same_models_superseded_caches_go(tmp_path: Path) -> None:
    gone = [
        _write(tmp_path, "m-aaaaaaaaaaaaaaaa-g32.safetensors"),  # an older version's codes
        _write(tmp_path, "m-bbbbbbbbbbbbbbbb-g32-k1.safetensors", source="/models/m"),  # weights since changed
        _write(tmp_path, "m-cccccccccccccccc-g32-k0.safetensors"),  # an older layout of this very cache
    ]
    kept = [
        _write(tmp_path, "m-cccccccccccccccc-g32.safetensors"),  # the same key for torch's kernel (a card)
        _write(tmp_path, "m-dddddddddddddddd-g64.safetensors"),  # other settings
        _write(tmp_path, "m-dddddddddddddddd-g32-nohead.safetensors"),
        _write(tmp_path, "m-eeeeeeeeeeeeeeee-g32.safetensors", source="/elsewhere/m"),  # another directory
        _write(tmp_path, "m-2-ffffffffffffffff-g32.safetensors"),  # another model whose name starts alike
        _write(tmp_path, "mm-ffffffffffffffff-g32.safetensors"),
        _write(tmp_path, "notes.safetensors"),  # not a name the cache gives
    ]
    _save(tmp_path / NEW, GROUPS, [], source="/models/m")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([NEW, *(p.name for p in kept)])
    assert not any(p.exists() for p in gone)


def test_a_model_name_with_glob_characters_is_taken_literally(tmp_path: Path) -> None:
    other = _write(tmp_path, "m[1]-aaaaaaaaaaaaaaaa-g32.safetensors")
    unrelated = _write(tmp_path, "m1-aaaaaaaaaaaaaaaa-g32.safetensors")
    new = tmp_path / "m[1]-cccccccccccccccc-g32-k1.safetensors"
    _save(new, GROUPS, [], source="/models/m[1]")
    assert not other.exists() and unrelated.exists() and new.exists()
    assert _drop_superseded(new, "/models/m[1]") == []


def test_another_variants_layout_stays_only_where_this_cpu_runs_that_variant(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The same key's cache in another kernel variant's layout stays where SPECCHAT_CPU_KERNEL could switch back
    to it; the VNNI order without tiles, which an AVX-512 machine read before its Q4_K rows came in tiles, goes
    where no variant of this CPU reads it."""
    import engine.quant.cache as quant

    avx512, vnni_rows, avx2 = (f"m-cccccccccccccccc-g32-k{tag}.safetensors" for tag in (f"2-vnni-t{quant.cpu_pack.TILE_ROWS}", "2-vnni", "2"))
    monkeypatch.setattr(quant.cpu_pack, "LAYOUT_VERSION", 2)
    monkeypatch.setattr(quant.cpu_isa, "has", lambda name: name in ("avx2", "avx512-vnni"))
    older = [_write(tmp_path, name) for name in (vnni_rows, avx2)]
    _save(tmp_path / avx512, GROUPS, [], source="/models/m")
    assert not older[0].exists() and older[1].exists()
    monkeypatch.setattr(quant.cpu_isa, "has", lambda name: name in ("avx2", "avx-vnni"))  # an AVX-VNNI machine
    again = _write(tmp_path, vnni_rows)
    _save(tmp_path / avx512, GROUPS, [], source="/models/m")
    assert again.exists() and older[1].exists()
