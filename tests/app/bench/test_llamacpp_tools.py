"""app.bench.llamacpp_tools: finding llama.cpp's binaries, and the llama-server process's life (with a fake)."""
from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from engine.errors import LlamaCppError
from app.bench.llamacpp_tools import (ENV_VAR, LlamaServer, completion_payload, default_bin_dir, find_llama_cpp,
                             how_to_get, stream_completion)
from tests.fake_llama import FakeLlamaServer, synthetic

FAKE = Path(__file__).resolve().parents[2] / "fake_llama.py"


def fake_bin(folder: Path) -> Path:
    """A folder with an executable ``llama-server`` that runs tests/fake_llama.py."""
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / "llama-server"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE} \"$@\"\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return folder


@pytest.fixture()
def no_llama(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No llama.cpp anywhere: an empty cache dir, no env var, a PATH without llama-server."""
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    return tmp_path


def test_find_order_explicit_env_cache_path(no_llama: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert find_llama_cpp() is None
    assert "scripts/build-llama-cpp.sh" in how_to_get() and str(default_bin_dir()) in how_to_get()
    on_path = fake_bin(no_llama / "on-path")
    monkeypatch.setenv("PATH", str(on_path))
    assert find_llama_cpp().where == "PATH"  # type: ignore[union-attr]
    cached = fake_bin(default_bin_dir())
    found = find_llama_cpp()
    assert found is not None and found.where == "cache" and found.server == cached / "llama-server"
    assert found.bench is None  # no llama-bench beside it
    monkeypatch.setenv(ENV_VAR, str(fake_bin(no_llama / "env")))
    assert find_llama_cpp().where == ENV_VAR  # type: ignore[union-attr]
    explicit = fake_bin(no_llama / "explicit")
    found = find_llama_cpp(explicit / "llama-server")  # the binary's own path is accepted too
    assert found is not None and found.where == "--llama-cpp" and found.bin_dir == explicit
    assert found.version() == "version: 0 (fake)"


def test_a_named_folder_without_llama_server_is_an_error(no_llama: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_bin(default_bin_dir())  # present, but the user named another folder
    with pytest.raises(LlamaCppError, match="no executable llama-server"):
        find_llama_cpp(no_llama / "nowhere")
    monkeypatch.setenv(ENV_VAR, str(no_llama))
    with pytest.raises(LlamaCppError, match=ENV_VAR):
        find_llama_cpp()


def test_server_starts_answers_and_is_always_stopped(no_llama: Path) -> None:
    llama = find_llama_cpp(fake_bin(no_llama / "bin"))
    assert llama is not None
    model = no_llama / "m.gguf"
    model.write_bytes(b"GGUF")
    with pytest.raises(RuntimeError, match="boom"):
        with LlamaServer(llama, model, ["-c", "256"], threads=3) as server:
            proc = server.proc
            assert proc is not None and proc.poll() is None
            assert server.get("/health") == {"status": "ok"}
            reply = server.complete([1, 2, 3], n_predict=4)
            assert len(reply["tokens"]) == 4 and reply["timings"]["prompt_n"] == 3
            assert server.tokenize("ab c") == [2, 1]
            assert "-t 3 -tb 3 -c 256" in " ".join(server.command())
            raise RuntimeError("boom")
    assert proc.poll() is not None and server.proc is None  # killed on the way out of the with block


def test_a_server_that_dies_while_starting_is_a_clear_error(no_llama: Path) -> None:
    llama = find_llama_cpp(fake_bin(no_llama / "bin"))
    assert llama is not None
    model = no_llama / "bad.gguf"
    model.write_bytes(b"CRASH")
    with pytest.raises(LlamaCppError, match=r"exited with code 1 while starting(.|\n)*failed to load model"):
        LlamaServer(llama, model).start()
    with pytest.raises(LlamaCppError, match="does not exist"):
        LlamaServer(llama, no_llama / "missing.gguf").start()


def test_stream_completion_yields_chunks_up_to_the_final_one() -> None:
    fake = FakeLlamaServer(synthetic([7, 8, 9, 10]))
    try:
        chunks = list(stream_completion(fake.url, completion_payload([5, 6, 7], 3)))
        assert chunks[-1]["stop"] is True and chunks[-1]["timings"]["prompt_n"] == 3
        assert sum(len(c.get("tokens") or ()) for c in chunks) == 3
        path, body = fake.requests[-1]
        assert path == "/completion" and body["stream"] is True and body["prompt"] == [5, 6, 7]
        assert body["temperature"] == 0.0 and body["top_k"] == 1 and body["cache_prompt"] is False
        fake.fail_with = "context full"
        with pytest.raises(LlamaCppError, match="HTTP 500.*context full"):
            list(stream_completion(fake.url, completion_payload([1], 2)))
    finally:
        fake.close()
    with pytest.raises(LlamaCppError, match="did not answer"):
        list(stream_completion(fake.url, completion_payload([1], 2), timeout_s=2))
