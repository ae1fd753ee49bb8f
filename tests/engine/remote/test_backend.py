"""The server backend against recorded answers from a loopback server: figures, calibration, failures."""
from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from engine.errors import EngineError
from engine.events import ChatEvent, ChatMessage, GenerationParams, SamplingParams
from engine.remote.backend import CALIBRATION_TOKENS, ServerBackend
from engine.remote.server_errors import ServerError
from engine.config.server import ServerSpec
from engine.remote.figures import ServerStats
from tests.fake_server import (
    FakeServer, chunk, llama_routes, models_route, reply_stream, send_json, send_text, start_sse, timings,
    write_events,
)

MESSAGES = [ChatMessage("system", "Be brief."), ChatMessage("user", "Say hi")]
PARAMS = GenerationParams(sampling=SamplingParams(temperature=0.0), max_new_tokens=100)
PIECES = ["Hel", "lo", " there", "!"]


def backend(fake: FakeServer, **spec: Any) -> ServerBackend:
    return ServerBackend.connect(ServerSpec(fake.url, **spec), "srv")


def run(b: ServerBackend, cancel: threading.Event | None = None) -> list[ChatEvent]:
    return list(b.chat(MESSAGES, PARAMS, cancel))


def speculative_then_plain(spec_timings: dict[str, Any], plain_timings: dict[str, Any]):  # type: ignore[no-untyped-def]
    """A llama-server that drafts unless the request says speculative.n_max = 0."""
    def chat(req, body):  # type: ignore[no-untyped-def]
        start_sse(req)
        plain = body.get("speculative.n_max") == 0
        write_events(req, reply_stream(PIECES, plain_timings if plain else spec_timings))
    return chat


def test_llama_server_figures_and_calibrated_speedup() -> None:
    chat = speculative_then_plain(timings(4, 50.0, draft_n=4, accepted=2), timings(4, 25.0))
    with FakeServer(llama_routes(chat)) as fake:
        b = backend(fake)
        assert (b.kind, b.build, b.model) == ("llama.cpp", "b1-test", "pocket.gguf")
        events = run(b)
        assert "".join(e.text for e in events) == "Hello there!"
        assert all(p.source == "target" for e in events for p in e.pieces)
        assert [e.finish_reason for e in events] == [None] * 5 + ["eos"]
        # The text is complete before the calibration reply: an event says what the wait is for.
        assert events[4].text == "" and events[4].stats.speedup_reason.startswith("measuring")
        assert events[4].stats.alpha == pytest.approx(0.5)
        final = events[-1].stats
        assert isinstance(final, ServerStats)
        assert (final.proposed, final.accepted, final.alpha) == (4, 2, pytest.approx(0.5))
        assert final.tokens == 4 and final.tau == pytest.approx(2.0)
        assert final.figures_from == "timings" and final.figures_reason is None
        assert final.tokens_per_s == 50.0 and final.plain_tokens_per_s == 25.0
        assert final.speedup == pytest.approx(2.0)
        assert "plain reply from the same server" in (final.speedup_reason or "")
        first, calibration = fake.posts()
        assert first["stream"] is True and first["model"] == "pocket.gguf" and "speculative.n_max" not in first
        assert first["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi"}]
        assert calibration["speculative.n_max"] == 0 and calibration["max_tokens"] == 8
        assert calibration["messages"] == first["messages"]
        # The plain rate is reused: the next reply sends one request only.
        run(b)
        assert len(fake.posts()) == 3 and b.switch_honoured is True


def test_a_server_without_metrics_is_not_asked_for_them_before_each_reply() -> None:
    """A /metrics that never answered held every reply 10 s (the read's timeout), after the probe
    had found none."""
    chat = speculative_then_plain(timings(4, 50.0, draft_n=4, accepted=2), timings(4, 25.0))
    with FakeServer(llama_routes(chat)) as fake:  # no /metrics: 404
        b = backend(fake)
        assert b.metrics_known is False
        run(b)
        b.measure(MESSAGES, PARAMS, speculate=True)
        assert [path for path, _, _ in fake.requests].count("/metrics") == 1  # the probe's


def test_tau_is_tokens_per_target_pass() -> None:
    pieces = [f"t{i} " for i in range(12)]

    def chat(req, body):  # type: ignore[no-untyped-def]
        start_sse(req)
        write_events(req, reply_stream(pieces, timings(12, 40.0, draft_n=10, accepted=8)))

    with FakeServer(llama_routes(chat)) as fake:
        b = backend(fake)
        b.switch_honoured = False  # no calibration in this test
        final = run(b)[-1].stats
        # 12 tokens, 8 of them accepted drafts: 4 target passes.
        assert final.tokens == 12 and final.tau == pytest.approx(3.0) and final.target_passes == 4


def test_server_that_ignores_the_per_request_switch_has_unknown_speedup() -> None:
    chat = speculative_then_plain(timings(4, 50.0, draft_n=10, accepted=3), timings(4, 48.0, draft_n=9, accepted=2))
    with FakeServer(llama_routes(chat)) as fake:
        b = backend(fake)
        final = run(b)[-1].stats
        assert final.speedup is None and final.plain_tokens_per_s is None
        assert "ignores per-request speculative options" in final.speedup_reason
        assert final.alpha == pytest.approx(0.3)
        assert b.switch_honoured is False
        run(b)
        assert len(fake.posts()) == 3  # no second calibration
        with pytest.raises(EngineError, match="ignores per-request"):
            b.set_speculation(False)


def test_plain_request_that_still_drafted_says_so() -> None:
    chat = speculative_then_plain(timings(4, 50.0, draft_n=10, accepted=3), timings(4, 48.0, draft_n=9, accepted=2))
    with FakeServer(llama_routes(chat)) as fake:
        b = backend(fake)
        b.set_speculation(False)
        assert b.info.mode == "plain"
        events = run(b)
        assert fake.posts()[0]["speculative.n_max"] == 0
        assert events[-1].notice and "ignored speculative.n_max = 0" in events[-1].notice
        assert b.speculation_on and b.switch_honoured is False


def test_no_drafts_in_reply_is_a_reason_not_zero() -> None:
    def chat(req, body):  # type: ignore[no-untyped-def]
        start_sse(req)
        write_events(req, reply_stream(PIECES, timings(4, 30.0)))

    with FakeServer(llama_routes(chat)) as fake:
        final = run(backend(fake))[-1].stats
        assert final.alpha is None and final.tau is None and final.proposed == 0
        assert "drafted no tokens" in final.figures_reason
        assert final.speedup is None and "drafted nothing" in final.speedup_reason
        assert len(fake.posts()) == 1  # nothing drafted: no calibration reply either


VLLM_METRICS = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {drafts}
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {draft_tokens}
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {accepted}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="0"}} {p0}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="1"}} {p1}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="2"}} {p2}
vllm:num_requests_running{{engine="0",model_name="m"}} 0.0
"""


def vllm_routes() -> dict[str, Any]:
    counts = {"drafts": 100.0, "draft_tokens": 300.0, "accepted": 150.0, "p0": 70.0, "p1": 50.0, "p2": 30.0}

    def metrics(req, body):  # type: ignore[no-untyped-def]
        send_text(req, 200, VLLM_METRICS.format(**counts))

    def chat(req, body):  # type: ignore[no-untyped-def]
        start_sse(req)
        events = reply_stream(["a"] * 10)
        events[-2]["usage"]["completion_tokens"] = 20  # several tokens per chunk
        write_events(req, events)
        for key, add in {"drafts": 5, "draft_tokens": 15, "accepted": 9, "p0": 4, "p1": 3, "p2": 2}.items():
            counts[key] += add

    return {"/v1/models": models_route("vllm", ["Qwen/Qwen2.5-7B-Instruct"]), "/metrics": metrics,
            "/v1/chat/completions": chat}


def test_vllm_counters_give_per_reply_alpha_tau_and_positions() -> None:
    with FakeServer(vllm_routes()) as fake:
        b = backend(fake)
        assert b.kind == "vLLM" and b.metrics_known and b.model == "Qwen/Qwen2.5-7B-Instruct"
        final = run(b)[-1].stats
        assert (final.proposed, final.accepted, final.tokens) == (15, 9, 20)
        assert final.alpha == pytest.approx(0.6) and final.tau == pytest.approx(20 / 11)
        assert final.per_position == pytest.approx((0.8, 0.75, 2 / 3))
        assert final.mean_accepted_len == pytest.approx(1 + 9 / 5)
        assert final.figures_from == "metrics"
        assert final.speedup is None and "no per-request switch" in final.speedup_reason
        assert len(fake.posts()) == 1  # no calibration attempt
        with pytest.raises(EngineError, match="fixes speculation when it starts"):
            b.set_speculation(False)


def test_vllm_unknown_model_is_refused_at_connect() -> None:
    with FakeServer(vllm_routes()) as fake:
        with pytest.raises(EngineError, match="does not serve model 'other'.*Qwen"):
            backend(fake, model="other")


def test_server_without_figures_says_so() -> None:
    def chat(req, body):  # type: ignore[no-untyped-def]
        start_sse(req)
        write_events(req, reply_stream(PIECES))

    with FakeServer({"/v1/models": models_route("someone"), "/v1/chat/completions": chat}) as fake:
        b = backend(fake)
        assert b.kind == "OpenAI-compatible" and not b.metrics_known
        final = run(b)[-1].stats
        assert final.alpha is None and final.tau is None and final.per_position == ()
        assert "reports no speculative figures" in final.figures_reason
        assert final.speedup is None and "speedup unknown" in final.speedup_reason


# -- failures ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_connection_refused_is_a_clear_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ServerError, match="connection refused. Is the server running") as info:
        ServerBackend.connect(ServerSpec(url), "srv")
    assert info.value.kind == "refused"


def test_refused_mid_session_keeps_backend_usable_afterwards() -> None:
    chat = speculative_then_plain(timings(4, 50.0), timings(4, 25.0))
    fake = FakeServer(llama_routes(chat))
    with fake:
        b = backend(fake)
    with pytest.raises(ServerError) as info:  # the server is gone now
        run(b)
    assert info.value.kind == "refused"


def test_401_names_the_key_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    def deny(req, body):  # type: ignore[no-untyped-def]
        send_json(req, 401, {"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}})

    with FakeServer({"/v1/models": deny}) as fake:
        with pytest.raises(ServerError, match=r"401 unauthorized: the server wants an API key.*Invalid API Key") as info:
            backend(fake)
        assert info.value.kind == "auth" and info.value.status == 401
        monkeypatch.setenv("MY_KEY", "sekrit")
        with pytest.raises(ServerError, match=r"check the key in \$MY_KEY"):
            backend(fake, api_key_env="MY_KEY")
        assert fake.requests[-1][2]["Authorization"] == "Bearer sekrit"


def test_missing_key_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOPE_KEY", raising=False)
    with FakeServer(llama_routes(speculative_then_plain({}, {}))) as fake:
        with pytest.raises(EngineError, match=r"\$NOPE_KEY, which is not set"):
            backend(fake, api_key_env="NOPE_KEY")
        monkeypatch.setenv("NOPE_KEY", "")  # set, but to nothing: it said "not set"
        with pytest.raises(EngineError, match=r"\$NOPE_KEY, which is empty: export NOPE_KEY="):
            backend(fake, api_key_env="NOPE_KEY")


def test_404_says_check_the_url() -> None:
    with FakeServer({}) as fake:
        with pytest.raises(ServerError, match="404 not found: check the url") as info:
            backend(fake)
        assert info.value.kind == "not_found"


def partial_then(tail: list[Any]):  # type: ignore[no-untyped-def]
    def chat(req, body):  # type: ignore[no-untyped-def]
        start_sse(req)
        write_events(req, [chunk("Hel"), chunk("lo"), *tail])
    return chat


def collect_until_error(b: ServerBackend, cancel: threading.Event | None = None) -> tuple[str, ServerError]:
    text = ""
    with pytest.raises(ServerError) as info:
        for event in b.chat(MESSAGES, PARAMS, cancel):
            text += event.text
    return text, info.value


@pytest.mark.parametrize("tail, kind, words", [
    ([], "cut", "closed the stream before the reply ended"),
    (["data: {\"choices\": [{\"delta\": {\"content\": \"x\"}}\n\n"], "malformed", "malformed JSON"),
    ([{"error": {"code": 500, "message": "slot crashed", "type": "server_error"}}], "server", "slot crashed"),
])
def test_stream_failures_keep_the_partial_text(tail: list[Any], kind: str, words: str) -> None:
    with FakeServer(llama_routes(partial_then(tail))) as fake:
        text, error = collect_until_error(backend(fake))
        assert text == "Hello" and error.kind == kind and words in str(error)


def test_chunked_stream_cut_mid_chunk() -> None:
    def chat(req, body):  # type: ignore[no-untyped-def]
        req.send_response(200)
        req.send_header("Content-Type", "text/event-stream")
        req.send_header("Transfer-Encoding", "chunked")
        req.end_headers()
        data = b'data: {"choices": [{"delta": {"content": "Hel"}}]}\n\n'
        req.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        req.wfile.write(b"40\r\ndata: {\"cho")  # promised 64 bytes, sent fewer, then the connection drops
        req.wfile.flush()
        req.close_connection = True

    with FakeServer(llama_routes(chat)) as fake:
        text, error = collect_until_error(backend(fake))
        assert text == "Hel" and error.kind == "cut" and "mid-reply" in str(error)


def test_silence_past_the_timeout() -> None:
    with FakeServer(llama_routes(partial_then([3.0]))) as fake:
        start = time.monotonic()
        text, error = collect_until_error(backend(fake, timeout=0.5))
        assert text == "Hello" and error.kind == "timeout" and "timeout" in str(error)
        assert time.monotonic() - start < 2.5


def test_cancel_stops_a_silent_stream_promptly() -> None:
    with FakeServer(llama_routes(partial_then([30.0]))) as fake:
        b = backend(fake)
        cancel = threading.Event()
        events = []
        start = time.monotonic()
        for event in b.chat(MESSAGES, PARAMS, cancel):
            events.append(event)
            if event.text == "lo":
                threading.Timer(0.2, cancel.set).start()
        assert time.monotonic() - start < 3.0
        assert "".join(e.text for e in events) == "Hello"
        assert events[-1].finish_reason == "cancelled"
        assert "stopped" in events[-1].stats.figures_reason
        assert len(fake.posts()) == 1  # no calibration after a stopped reply


def test_cancel_while_waiting_for_the_first_byte() -> None:
    def slow(req, body):  # type: ignore[no-untyped-def]
        time.sleep(30.0)

    with FakeServer(llama_routes(slow)) as fake:
        b = backend(fake)
        cancel = threading.Event()
        threading.Timer(0.3, cancel.set).start()
        start = time.monotonic()
        events = run(b, cancel)
        assert time.monotonic() - start < 3.0
        assert [e.finish_reason for e in events] == ["cancelled"]


def test_request_carries_the_reply_settings() -> None:
    with FakeServer(llama_routes(speculative_then_plain(timings(4, 5.0), timings(4, 5.0)))) as fake:
        b = backend(fake, model="chosen")
        params = GenerationParams(sampling=SamplingParams(temperature=0.7, top_p=0.9, top_k=40, seed=3),
                                  max_new_tokens=33, stop_strings=("END",))
        events = list(b.chat(MESSAGES, params))
        body = fake.posts()[0]
        assert (body["model"], body["temperature"], body["top_p"], body["top_k"], body["seed"]) == ("chosen", 0.7, 0.9, 40, 3)
        assert body["max_tokens"] == 33 and body["stop"] == ["END"]
        assert events[-1].finish_reason == "stop"
        assert CALIBRATION_TOKENS >= 8


RECORDED = Path(__file__).parent.parent / "data" / "llama_server_0.3.36_draft_stream.sse"


def test_a_recorded_llama_server_stream_replays() -> None:
    """Bytes llama-server (llama-cpp-python 0.3.36's llama.cpp, -md itself --spec-type draft-simple)
    sent for one greedy reply (its local model path cut out of the ``model`` field)."""
    raw = RECORDED.read_bytes()

    def chat(req, body):  # type: ignore[no-untyped-def]
        start_sse(req)
        req.wfile.write(raw)

    with FakeServer(llama_routes(chat)) as fake:
        b = backend(fake)
        b.switch_honoured = False  # the real server ignored speculative.n_max = 0: no calibration
        events = run(b)
    text = "".join(e.text for e in events)
    assert text.startswith("The committee met on Tuesday to review the budget for the new library")
    final = events[-1].stats
    assert (final.tokens, final.proposed, final.accepted) == (38, 30, 27)  # the server's log: 27 / 30, 38 tokens
    assert final.alpha == pytest.approx(0.9) and final.tau == pytest.approx(38 / 11)
    assert final.tokens_per_s == pytest.approx(8.082571550964653) and final.prompt_tokens == 78
    assert events[-1].finish_reason == "eos" and len(events) > 30


@pytest.mark.parametrize("events", [
    [{"choices": []}, {"choices": []}],
    [{"choices": None}],
    [{"choices": [{"delta": {}, "index": 0, "finish_reason": "stop"}]}],
])
def test_a_stream_without_reply_text_says_so(events: list[dict[str, Any]]) -> None:
    """Events without text read as a whole, empty reply: "0 tokens", exit 0, nothing said."""
    def chat(req, body):  # type: ignore[no-untyped-def]
        start_sse(req)
        write_events(req, [*events, "data: [DONE]\n\n"])

    with FakeServer(llama_routes(chat)) as fake:
        final = run(backend(fake))[-1]
    assert final.notice is not None
    assert f"the server sent {len(events)} event(s) but no reply text" in final.notice
    assert ("finish_reason 'stop'" in final.notice) == ("stop" in str(events))
