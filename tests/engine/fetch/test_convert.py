"""GGUF conversion's bookkeeping: progress while it runs, a finished copy trusted only while its
files still have the hashes its marker recorded."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from engine.fetch.cachefiles import sha256_file
from engine.fetch.convert import DONE_MARKER, _dir_bytes, convert_gguf, converted_copy_intact
import engine.progress as progress_module
from engine.progress import Steps, ticking


def test_ticking_reports_bytes_and_fraction(tmp_path: Path) -> None:
    calls: list[tuple[str, float | None]] = []
    out = tmp_path / "out"
    with ticking(lambda s, f: calls.append((s, f)), "writing", 0.6, lambda: _dir_bytes(out), 2_000_000, 0.8,
                  every_s=0.02):
        out.mkdir()
        (out / "a").write_bytes(b"x" * 1_000_000)
        time.sleep(0.2)
    assert calls[0] == ("writing", 0.6)
    assert any(s.startswith("writing: 1.0 of 2.0 MB, ") and s.endswith(" s") and f == pytest.approx(0.7)
               for s, f in calls)  # bytes, and the time it has taken
    with ticking(lambda s, f: calls.append((s, f)), "reading", 0.0, every_s=0.02):
        time.sleep(0.1)
    # Nothing to count: the seconds so far, and no fraction (a moving bar, not one frozen at 0%).
    assert any(s.startswith("reading: ") and s.endswith(" s") and f is None for s, f in calls)


def test_ticking_counts_steps_with_the_time_left(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, float | None]] = []
    layers = Steps("layers")
    monkeypatch.setattr(progress_module, "ETA_AFTER_S", 0.05)
    with ticking(lambda s, f: calls.append((s, f)), "loading target", 0.1, end=0.5, every_s=0.02, steps=layers):
        time.sleep(0.1)  # reading before the first layer: not counted in the time left
        layers(0, 40)
        time.sleep(0.1)
        layers(10, 40)
        time.sleep(0.1)
    counted = [(s, f) for s, f in calls if "of 40 layers" in s]
    assert counted[0][0].startswith("loading target: 0 of 40 layers, ") and counted[0][1] == pytest.approx(0.1)
    last, fraction = counted[-1]
    assert re.fullmatch(r"loading target: 10 of 40 layers, \d+ s, about \d+ s left", last), last
    assert fraction == pytest.approx(0.2)
    assert not any("left" in s for s, _ in counted if s.startswith("loading target: 0 of"))


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


def test_a_conversion_says_it_happens_once_and_how_long_earlier_ones_took(tmp_path: Path) -> None:
    from engine.fetch.convert import conversion_stage

    gguf = tmp_path / "Tiny-1.5B-Instruct-Q4_K_M.gguf"
    gguf.write_bytes(b"\0" * 3000)
    converted = tmp_path / "converted"
    assert conversion_stage(gguf, converted, lean=True) == "converting Tiny-1.5B-Instruct Q4_K_M once"  # no guess
    for name, seconds, size, lean in (("a", 40.0, 1000, True), ("b", 80.0, 1000, True), ("c", 900.0, 10, False)):
        (converted / name).mkdir(parents=True)
        (converted / name / DONE_MARKER).write_text(json.dumps({"seconds": seconds, "gguf_bytes": size, "lean": lean}))
    (converted / "d").mkdir()
    (converted / "d" / DONE_MARKER).write_text("not json")
    # 120 s for 2000 bytes of lean conversions: 3000 bytes take about 3 min (the full one is not counted).
    assert conversion_stage(gguf, converted, lean=True) == "converting Tiny-1.5B-Instruct Q4_K_M once (about 3 min)"


def test_a_real_conversion_reports_its_stages_under_one_name(tmp_path: Path) -> None:
    from tests.gguf_tiny import write_tiny_gguf

    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    stages: list[str] = []
    convert_gguf(gguf, tmp_path / "converted" / "full", lambda s, f: stages.append(s))
    steps = [s for s in stages if s.startswith("converting tiny once, ")]
    assert [s.split(", ")[1].split(":")[0] for s in steps][0] == "reading the GGUF"
    assert "converting tiny once, checking the copy" in stages
    assert all(s.startswith("converting tiny once") for s in stages)


def test_a_finished_copy_records_every_file_and_replaces_one_left_without_a_marker(tmp_path: Path) -> None:
    """A copy whose config.json was damaged read as intact (only its weights were hashed), and one whose
    marker was gone could not be converted again: the rename onto it failed, "Directory not empty"."""
    from engine.fetch.convert import _finish

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    dest = tmp_path / "copy"
    dest.mkdir()
    (dest / "config.json").write_text("left by an interrupted copy")
    tmp = tmp_path / ".copy.tmp"
    tmp.mkdir()
    (tmp / "model.safetensors").write_bytes(b"weights")
    (tmp / "config.json").write_text('{"model_type": "llama"}')
    _finish(tmp, dest, gguf, time.perf_counter(), verified=True, lean=True)
    recorded = json.loads((dest / DONE_MARKER).read_text())["sha256"]
    assert sorted(recorded) == ["config.json", "model.safetensors"] and converted_copy_intact(dest)
    (dest / "config.json").write_text("{broken")
    assert not converted_copy_intact(dest)
