"""A disk that fills while the first int4 pack writes its cache: one sentence that says so (where,
how much), not a traceback, and no half-written cache left for the next start to trip on."""
from __future__ import annotations

import errno
from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM

from engine.errors import StorageError
from engine.quant import apply_int4
from tests.tiny import tiny_llama


def test_a_full_disk_during_the_int4_pack_is_one_sentence_and_leaves_no_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import safetensors.torch

    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "src"
    tiny_llama(seed=1).save_pretrained(src)
    real_save = safetensors.torch.save_file

    def half_then_full(tensors: dict, filename: str, metadata: dict | None = None) -> None:
        Path(filename).write_bytes(b"\0" * 1000)  # some bytes made it before the disk filled
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", half_then_full)
    model = LlamaForCausalLM.from_pretrained(src).eval()
    with pytest.raises(StorageError) as err:
        apply_int4(model, location=str(src), gguf=None)
    message = str(err.value)
    assert message.startswith("the disk is full: could not write the int4 cache ")
    assert str(tmp_path / "cache" / "int4") in message and "it needs about" in message
    assert "\n" not in message
    assert list((tmp_path / "cache" / "int4").iterdir()) == []  # nothing half-written, under any name

    monkeypatch.setattr(safetensors.torch, "save_file", real_save)  # space freed: the next start packs and caches
    model = LlamaForCausalLM.from_pretrained(src).eval()
    apply_int4(model, location=str(src), gguf=None)
    assert len(list((tmp_path / "cache" / "int4").glob("*.safetensors"))) == 1
    with torch.no_grad():
        assert torch.isfinite(model(torch.tensor([[1, 2, 3]])).logits).all()


def test_a_safetensors_error_that_wraps_a_full_disk_is_told_the_same_way(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import safetensors.torch

    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "src"
    tiny_llama(seed=1).save_pretrained(src)

    def wrapped(tensors: dict, filename: str, metadata: dict | None = None) -> None:
        raise safetensors.SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, "
                                          "message: \"No space left on device\" })")

    monkeypatch.setattr(safetensors.torch, "save_file", wrapped)
    with pytest.raises(StorageError, match="^the disk is full: could not write the int4 cache"):
        apply_int4(LlamaForCausalLM.from_pretrained(src).eval(), location=str(src), gguf=None)
