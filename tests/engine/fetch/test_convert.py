"""GGUF conversion's bookkeeping: progress while it runs, a finished copy trusted only while its
files still have the hashes its marker recorded."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from engine.fetch.cachefiles import sha256_file
from engine.fetch.convert import DONE_MARKER, _dir_bytes, convert_gguf, converted_copy_intact
from engine.progress import ticking


def test_ticking_reports_bytes_and_fraction(tmp_path: Path) -> None:
    calls: list[tuple[str, float | None]] = []
    out = tmp_path / "out"
    with ticking(lambda s, f: calls.append((s, f)), "writing", 0.6, lambda: _dir_bytes(out), 2_000_000, 0.8,
                  every_s=0.02):
        out.mkdir()
        (out / "a").write_bytes(b"x" * 1_000_000)
        time.sleep(0.2)
    assert calls[0] == ("writing", 0.6)
    assert ("writing: 1.0 of 2.0 MB", pytest.approx(0.7)) in calls
    with ticking(lambda s, f: calls.append((s, f)), "reading", 0.0, every_s=0.02):
        time.sleep(0.1)
    assert any(s.startswith("reading: ") and s.endswith(" s") and f == 0.0 for s, f in calls)


def finished_copy(path: Path) -> Path:
    path.mkdir()
    (path / "model.safetensors").write_bytes(b"weights")
    (path / DONE_MARKER).write_text(json.dumps({"sha256": {"model.safetensors": sha256_file(path / "model.safetensors")}}))
    return path


def test_a_copy_is_intact_while_its_files_keep_their_recorded_hashes(tmp_path: Path) -> None:
    copy = finished_copy(tmp_path / "copy")
    assert converted_copy_intact(copy)
    (copy / "model.safetensors").write_bytes(b"weightz")
    assert not converted_copy_intact(copy)


def test_a_copy_without_a_usable_marker_is_not_intact(tmp_path: Path) -> None:
    copy = finished_copy(tmp_path / "copy")
    (copy / DONE_MARKER).write_text(json.dumps({"sha256": {}}))
    assert not converted_copy_intact(copy)
    (copy / DONE_MARKER).write_text("not json")
    assert not converted_copy_intact(copy)
    (copy / DONE_MARKER).unlink()
    assert not converted_copy_intact(copy)


def test_a_finished_conversion_is_not_done_again(tmp_path: Path) -> None:
    copy = finished_copy(tmp_path / "copy")
    assert convert_gguf(tmp_path / "gone.gguf", copy) == copy  # the GGUF is not even read
