"""Cache bookkeeping: leftovers of dead writers, the pip child's command line, and recorded hashes."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from engine.fetch import cachefiles
from engine.fetch.cachefiles import (
    UNOWNED_AFTER_S, clean_leftovers, die_with_parent_argv, forget, forget_unless_intact, is_leftover,
    matches_record, record_path, sha256_file, write_record,
)


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_planted_leftovers_of_dead_processes_are_removed(cache: Path) -> None:
    live = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(0.05)
        files = cache / "files" / "pkg-1.0" / "pkg"
        files.mkdir(parents=True)
        (cache / "wheels").mkdir()
        (cache / "converted").mkdir()
        dead = {
            cache / "wheels" / f".download-{dead_pid()}-abc": "dir",
            files / f".model.gguf.tmp-{dead_pid()}-0a0b": "file",
            cache / "converted" / f".pkg-1.0-model.tmp-{dead_pid()}-1234": "dir",
            cache / "wheels" / f".download-{live.pid}-old": "dir",  # a PID reused by a younger process
            cache / "wheels" / ".download-noid": "dir",  # no PID (older release), hours old
        }
        kept = {
            cache / "wheels" / f".download-{live.pid}-now": "dir",  # its writer is alive
            files / f".model.gguf.tmp-{os.getpid()}-ffff": "file",  # ours
            cache / "wheels" / ".download-fresh": "dir",
            files / "model.gguf": "file",
        }
        for path, kind in {**dead, **kept}.items():
            path.mkdir() if kind == "dir" else path.write_bytes(b"x" * 100)
        old = time.time() - 7200
        for path in (cache / "wheels" / f".download-{live.pid}-old", cache / "wheels" / ".download-noid"):
            os.utime(path, (old, old))
        assert sorted(clean_leftovers(cache)) == sorted(dead)
        assert all(p.exists() for p in kept) and not any(p.exists() for p in dead)
    finally:
        live.kill()
        live.wait()


def test_an_int4_cache_left_half_written_is_removed(cache: Path) -> None:
    """Killed as it wrote an int4 cache, a process left safetensors' own .tmpXXXXXX (84 MB for pocket,
    0.9 GB for coder) that no later run removed and `specchat models` did not count (a hostile test's)."""
    int4 = cache / "int4"
    int4.mkdir(parents=True)
    old = time.time() - 7200
    dead = [int4 / ".tmpgcXxC1", int4 / f".pocket-g32.safetensors.tmp-{dead_pid()}"]
    kept = [int4 / ".tmpFresh1", int4 / "pocket-g32.safetensors"]  # another process may be writing the fresh one
    for path in (*dead, *kept):
        path.write_bytes(b"x" * 100)
    os.utime(dead[0], (old, old))
    assert sorted(clean_leftovers(cache)) == sorted(dead)
    assert all(p.exists() for p in kept)


def test_only_temporary_names_can_be_leftovers(tmp_path: Path) -> None:
    plain = tmp_path / "model.gguf"
    plain.write_bytes(b"x")
    assert not is_leftover(plain)
    assert not is_leftover(tmp_path / f".model.gguf.tmp-{dead_pid()}-ab")  # already gone
    ours = tmp_path / f".model.gguf.tmp-{os.getpid()}-ab"
    ours.write_bytes(b"x")
    assert not is_leftover(ours)
    theirs = tmp_path / f".model.gguf.tmp-{dead_pid()}-ab"
    theirs.write_bytes(b"x")
    assert is_leftover(theirs)


def test_a_name_without_a_pid_is_a_leftover_once_an_hour_old(tmp_path: Path) -> None:
    path = tmp_path / ".download-noid"
    path.mkdir()
    mtime = path.stat().st_mtime
    assert not is_leftover(path, now=mtime + UNOWNED_AFTER_S - 1)
    assert is_leftover(path, now=mtime + UNOWNED_AFTER_S + 1)


def test_nothing_to_clean_in_a_missing_or_empty_cache(cache: Path) -> None:
    assert clean_leftovers(cache) == []
    cache.mkdir()
    assert clean_leftovers(cache) == []


def test_the_pip_child_runs_the_module_with_its_arguments(tmp_path: Path) -> None:
    data = tmp_path / "in.json"
    data.write_text('{"b": 1, "a": [2]}')
    argv = die_with_parent_argv("json.tool", "--sort-keys", "--compact", str(data))
    assert argv[0] == sys.executable and argv[-4:] == ["json.tool", "--sort-keys", "--compact", str(data)]
    if sys.platform.startswith("linux"):
        assert argv[1] == "-c" and argv[3] == str(os.getpid())  # the child checks its parent is this process
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == '{"a":[2],"b":1}'


def test_off_linux_the_child_is_plain_python_m(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cachefiles, "sys", types.SimpleNamespace(platform="darwin", executable="/py"))
    assert die_with_parent_argv("pip", "download", "x") == ["/py", "-m", "pip", "download", "x"]


def test_a_record_sits_beside_its_file_and_matches_until_the_file_changes(tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + bytes(range(200)))
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert sha256_file(path) == digest
    assert matches_record(path) is None  # nothing recorded yet
    write_record(path, digest, "RECORD of pkg-1.0")
    assert record_path(path) == tmp_path / ".model.gguf.record.json"
    recorded = json.loads(record_path(path).read_text())
    assert {k: recorded[k] for k in ("sha256", "size", "origin")} == {"sha256": digest, "size": 204,
                                                                       "origin": "RECORD of pkg-1.0"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [".model.gguf.record.json", "model.gguf"]  # no temp left
    assert matches_record(path) is True
    path.write_bytes(b"GGUF" + bytes(200))  # same size, other bytes
    assert matches_record(path) is False
    path.write_bytes(b"GGUF")  # truncated
    assert matches_record(path) is False
    path.unlink()
    assert matches_record(path) is False  # recorded, then lost


@pytest.mark.parametrize("record", ["not json", "[1, 2]", '{"size": 4}'])
def test_an_unreadable_record_counts_as_none(tmp_path: Path, record: str) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"data")
    record_path(path).write_text(record)
    assert matches_record(path) is None


def test_forget_unless_intact(tmp_path: Path) -> None:
    intact, damaged, unrecorded = (tmp_path / n for n in ("intact.bin", "damaged.bin", "unrecorded.bin"))
    for path in (intact, damaged, unrecorded):
        path.write_bytes(b"payload")
    write_record(intact, sha256_file(intact), "test")
    write_record(damaged, "0" * 64, "test")
    assert forget_unless_intact(intact) is False and intact.exists() and record_path(intact).exists()
    assert forget_unless_intact(damaged) is True
    assert not damaged.exists() and not record_path(damaged).exists()
    assert forget_unless_intact(unrecorded) is True and not unrecorded.exists()
    assert forget_unless_intact(tmp_path / "never.bin") is True
    gone = tmp_path / "gone.bin"  # deleted by hand, its record left behind
    gone.write_bytes(b"payload")
    write_record(gone, sha256_file(gone), "test")
    gone.unlink()
    assert forget_unless_intact(gone) is True and not record_path(gone).exists()


def test_forget_a_directory_and_its_record(tmp_path: Path) -> None:
    converted = tmp_path / "pkg-1.0-model"
    (converted / "sub").mkdir(parents=True)
    (converted / "sub" / "model.safetensors").write_bytes(b"w")
    record_path(converted).write_text("{}")
    forget(converted)
    assert list(tmp_path.iterdir()) == []
    forget(converted)  # twice is fine


def test_content_sha256_records_only_what_it_was_asked_to_verify(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.fetch.cachefiles import content_sha256

    monkeypatch.setattr(cachefiles, "RACY_NS", 0)
    path = tmp_path / "f.bin"
    path.write_bytes(b"payload")
    digest = hashlib.sha256(b"payload").hexdigest()
    assert content_sha256(path, expect="0" * 64) == digest
    assert not record_path(path).exists()  # not the pin: nothing recorded as verified
    assert content_sha256(path, expect=digest) == digest and record_path(path).exists()
    st = path.stat()
    new = tmp_path / "g.bin"
    new.write_bytes(b"PAYLOAD")
    os.replace(new, path)  # same size; the mtime put back below; another inode
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert content_sha256(path) == hashlib.sha256(b"PAYLOAD").hexdigest()
