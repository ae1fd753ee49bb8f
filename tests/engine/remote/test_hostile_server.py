"""A hostile server: escape sequences in its errors and metadata, credentials in its URL,
a reply that never ends. Nothing it says may reach a terminal raw; no secret is shown."""
from __future__ import annotations

import base64
import json
import math
import threading
import time

import pytest

from engine.config.server import ServerSpec
from engine.errors import ProfileError
from engine.events import ChatMessage, GenerationParams, SamplingParams
from engine.remote.backend import ServerBackend
from engine.remote.reply_run import MAX_TOKEN_CHARS
from engine.remote.client import ServerClient
from engine.remote.server_errors import ServerError
from tests.fake_server import (
    FakeServer, chunk, llama_routes, models_route, props_route, reply_stream, send_json, send_text, start_sse,
    write_events,
)
from tests.hostile import ALL, HOSTILE, raw_in

CHAT = "/v1/chat/completions"
MESSAGES = [ChatMessage("user", "hi")]


def params(n: int) -> GenerationParams:
    return GenerationParams(sampling=SamplingParams(temperature=0.0), max_new_tokens=n)


@pytest.mark.parametrize("name", sorted(HOSTILE))
@pytest.mark.parametrize("where", ["json-error", "text-error", "mid-stream-error"])
def test_a_servers_error_text_comes_out_inert(name: str, where: str) -> None:
    said = f"bad{HOSTILE[name]}thing"

    def fail(req, body):  # type: ignore[no-untyped-def]
        if where == "json-error":
            send_json(req, 500, {"error": {"message": said}})
        elif where == "text-error":
            send_text(req, 502, said)
        else:
            start_sse(req)
            write_events(req, [chunk("a"), {"error": {"message": said}}])

    with FakeServer({CHAT: fail}) as fake:
        with pytest.raises(ServerError) as err:
            list(ServerClient(ServerSpec(fake.url)).stream(CHAT, {}))
    assert raw_in(str(err.value)) == [] and "bad" in str(err.value) and "thing" in str(err.value)


def test_the_servers_build_and_model_names_are_shown_inert() -> None:
    routes = llama_routes(lambda req, body: None)
    routes["/props"] = props_route(build="b1" + ALL)
    routes["/v1/models"] = models_route(ids=("m" + HOSTILE["osc52-clipboard"],))
    with FakeServer(routes) as fake:
        b = ServerBackend.connect(ServerSpec(fake.url), "srv")
        info = b.info
        assert raw_in(repr(info.plan)) == [] and raw_in(info.target) == []
        assert info.plan["build"].startswith("b1<osc0-title>␛]0;pwned␇")
        assert b.model == "m" + HOSTILE["osc52-clipboard"]  # sent back to the server as it named it


def test_credentials_in_the_url_are_sent_as_basic_auth_and_shown_nowhere() -> None:
    with FakeServer({"/props": lambda req, body: send_json(req, 200, {})}) as fake:
        url = fake.url.replace("http://", "http://alice:s%40cret@")
        spec = ServerSpec(url + "/v1")
        ServerClient(spec).get_json("/props")
        auth = fake.requests[0][2]["Authorization"]
        assert auth == "Basic " + base64.b64encode(b"alice:s@cret").decode()
        assert spec.root == fake.url.replace("http://", "http://alice:***@")
        assert "cret" not in repr(spec) and "cret" not in spec.root
    with pytest.raises(ServerError) as err:  # the server is gone: the error names it, redacted
        ServerClient(spec).get_json("/props")
    assert "alice:***@" in str(err.value) and "cret" not in str(err.value)


@pytest.mark.parametrize("url", ["http://bob:hunter2@:99999", "ftp://bob:hunter2@h"])
def test_a_bad_url_with_credentials_is_refused_without_them(url: str) -> None:
    with pytest.raises(ProfileError) as err:
        ServerSpec(url)
    assert "hunter2" not in str(err.value) and "bob:***@" in str(err.value)


def test_a_token_as_user_name_is_hidden_whole() -> None:
    assert ServerSpec("http://sk-token@h:8").root == "http://***@h:8"


def test_credentials_and_a_key_variable_together_are_refused() -> None:
    with pytest.raises(ProfileError, match="one of them") as err:
        ServerSpec("http://u:pw@h", api_key_env="KEY")
    assert "pw" not in str(err.value).replace("password", "")


def never_ending(req, body):  # type: ignore[no-untyped-def]
    """A server that ignores max_tokens: text chunks until the client goes (bounded for the test)."""
    start_sse(req)
    write_events(req, [chunk(f"w{i} ") for i in range(5000)])
    write_events(req, ["data: [DONE]\n\n"])


def test_a_server_that_streams_forever_is_cut_at_max_new_tokens() -> None:
    with FakeServer(llama_routes(never_ending)) as fake:
        b = ServerBackend.connect(ServerSpec(fake.url), "srv")
        events = list(b.chat(MESSAGES, params(7)))
    assert "".join(e.text for e in events) == "".join(f"w{i} " for i in range(7))
    assert events[-1].finish_reason == "length"
    assert events[-1].notice is not None and "7-token limit" in events[-1].notice
    assert events[-1].stats.tokens == 7


def test_a_server_that_sends_events_without_text_forever_is_cut_too() -> None:
    def empty(req, body):  # type: ignore[no-untyped-def]
        start_sse(req)
        write_events(req, [chunk(None) for _ in range(5000)] + ["data: [DONE]\n\n"])

    with FakeServer(llama_routes(empty)) as fake:
        events = list(ServerBackend.connect(ServerSpec(fake.url), "srv").chat(MESSAGES, params(5)))
    assert events[-1].finish_reason == "length"


def test_a_server_that_sends_huge_chunks_is_cut_at_what_the_budget_could_hold() -> None:
    """Each chunk counted as a token let 5 chunks of 100 KB through for --max-new-tokens 5 (500 KB
    printed): no token is that long, so the text is cut where the budget's tokens would end."""
    def huge(req, body):  # type: ignore[no-untyped-def]
        start_sse(req)
        write_events(req, [chunk("word " * 20_000) for _ in range(50)] + ["data: [DONE]\n\n"])

    with FakeServer(llama_routes(huge)) as fake:
        events = list(ServerBackend.connect(ServerSpec(fake.url), "srv").chat(MESSAGES, params(5)))
    text = "".join(e.text for e in events)
    assert text == ("word " * 20_000)[:5 * MAX_TOKEN_CHARS]
    assert events[-1].finish_reason == "length"
    assert events[-1].notice is not None and "5-token limit" in events[-1].notice


@pytest.mark.parametrize("odd", [
    {"choices": [{"delta": {"content": 123}, "index": 0, "finish_reason": None}]},
    {"choices": [{"delta": {"content": ["x" + HOSTILE["osc52-clipboard"]]}, "index": 0, "finish_reason": None}]},
    {"choices": [], "timings": HOSTILE["osc52-clipboard"], "usage": [1]},
    {"choices": [{"delta": {"content": "!"}, "finish_reason": ["stop"]}]},
], ids=["int-content", "list-content", "str-timings-list-usage", "list-finish"])
def test_a_chunk_of_the_wrong_shape_is_left_out_not_a_traceback(odd: dict) -> None:  # type: ignore[type-arg]
    """A number or list where the text goes, a string where timings go: these raised TypeError or
    AttributeError out of ``generate`` (a traceback); the chunk's parts of the wrong type are ignored."""
    def odd_stream(req, body):  # type: ignore[no-untyped-def]
        start_sse(req)
        write_events(req, [chunk("a"), odd, chunk("b"), chunk(None, "stop"), "data: [DONE]\n\n"])

    with FakeServer(llama_routes(odd_stream)) as fake:
        events = list(ServerBackend.connect(ServerSpec(fake.url), "srv").chat(MESSAGES, params(50)))
    text = "".join(e.text for e in events)
    assert text in ("ab", "a!b") and raw_in(text) == []
    assert events[-1].finish_reason == "eos"


@pytest.mark.parametrize("bad", [
    {"draft_n": "abc"}, {"draft_n": float("nan")}, {"draft_n": [1]}, {"draft_n": float("inf")},
    {"draft_n": 5, "draft_n_accepted": "x"}, {"draft_n": 5, "draft_n_accepted": 50}, {"draft_n": -4, "draft_n_accepted": -2},
    {"predicted_per_second": float("inf")}, {"predicted_per_second": float("nan")}, {"predicted_per_second": -3.0},
], ids=["str", "nan", "list", "inf", "str-accepted", "accepted-over-drafted", "negative", "inf-rate", "nan-rate",
        "negative-rate"])
def test_timings_that_are_not_counts_give_no_figures_not_a_traceback(bad: dict) -> None:  # type: ignore[type-arg]
    """draft_n "abc" / NaN / [1] / Infinity raised ValueError, TypeError or OverflowError out of the
    reply; 50 accepted of 5 drafted showed α 10.0; an infinite rate showed inf tok/s."""
    def chat(req, body):  # type: ignore[no-untyped-def]
        start_sse(req)
        events = reply_stream(["a", "b"])
        events[-2]["timings"] = {"predicted_n": 2, "predicted_ms": 1.0, **bad}
        req.wfile.write("".join(e if isinstance(e, str) else "data: " + json.dumps(e) + "\n\n"
                                for e in events).encode())

    with FakeServer(llama_routes(chat)) as fake:
        events = list(ServerBackend.connect(ServerSpec(fake.url), "srv").chat(MESSAGES, params(20)))
    stats = events[-1].stats
    assert "".join(e.text for e in events) == "ab"
    assert stats.alpha is None or 0.0 <= stats.alpha <= 1.0
    assert stats.tokens_per_s is None or math.isfinite(stats.tokens_per_s)


@pytest.mark.parametrize("bad", [
    {"predicted_per_second": 1e308, "draft_n": 10**18, "draft_n_accepted": 10**18 - 1},
    {"predicted_per_second": 5e-324}, {"predicted_n": 2, "draft_n": 9, "draft_n_accepted": 7},
], ids=["huge-rate-and-counts", "tiny-rate", "more-accepted-than-tokens"])
def test_timings_no_server_could_measure_give_no_figures(bad: dict) -> None:  # type: ignore[type-arg]
    """A rate of 1e308 showed a 309-digit tok/s and a billion-billion accepted drafts gave -1e18
    target passes; 5e-324 tok/s made a speedup of inf; 7 accepted drafts in a 2-token reply, α 0.78."""
    def chat(req, body):  # type: ignore[no-untyped-def]
        start_sse(req)
        events = reply_stream(["a", "b"])
        events[-2]["timings"] = {"predicted_n": 2, "predicted_ms": 1.0, **bad}
        write_events(req, events)

    with FakeServer(llama_routes(chat)) as fake:
        events = list(ServerBackend.connect(ServerSpec(fake.url), "srv").chat(MESSAGES, params(20)))
    stats = events[-1].stats
    assert stats.alpha is None and stats.proposed == 0 and stats.target_passes == 2
    assert stats.tokens_per_s is None or stats.tokens_per_s < 1e7


@pytest.mark.parametrize("usage", [
    {"completion_tokens": 10**400, "prompt_tokens": [1, 2]}, {"completion_tokens": -5, "prompt_tokens": "␛x"},
    {"completion_tokens": 2.5, "total_tokens": 1e308}, {"completion_tokens": 999999},
], ids=["400-digits", "negative", "fractional", "past-the-budget"])
def test_usage_counts_no_server_could_make_are_left_out(usage: dict) -> None:  # type: ignore[type-arg]
    """A 400-digit completion_tokens raised OverflowError out of the reply; -5 was shown as '-5 tokens'."""
    def chat(req, body):  # type: ignore[no-untyped-def]
        start_sse(req)
        events = reply_stream(["a", "b", "c"])
        events[-2]["usage"] = usage
        req.wfile.write("".join(e if isinstance(e, str) else "data: " + json.dumps(e) + "\n\n"
                                for e in events).encode())

    with FakeServer(llama_routes(chat)) as fake:
        events = list(ServerBackend.connect(ServerSpec(fake.url), "srv").chat(MESSAGES, params(20)))
    assert "".join(e.text for e in events) == "abc" and events[-1].stats.tokens == 3  # counted here instead
    assert events[-1].stats.prompt_tokens is None


def test_a_lone_surrogate_in_a_reply_becomes_a_replacement_character() -> None:
    """JSON's "\\ud800" alone decoded to a character UTF-8 cannot write: generate died printing it,
    and the app's history could not save the reply."""
    def chat(req, body):  # type: ignore[no-untyped-def]
        start_sse(req)
        write_events(req, ['data: {"choices":[{"delta":{"content":"ok \\ud800 end \\ud83d\\ude00"}}]}\n\n',
                           chunk(None, "stop"), "data: [DONE]\n\n"])

    with FakeServer(llama_routes(chat)) as fake:
        events = list(ServerBackend.connect(ServerSpec(fake.url), "srv").chat(MESSAGES, params(20)))
    text = "".join(e.text for e in events)
    assert text == "ok \ufffd end \U0001f600" and text.encode("utf-8")  # a real pair stays one character


def test_a_line_that_never_ends_is_refused_before_it_fills_memory() -> None:
    """'data: ' then 64 KB after 64 KB with no newline: 3 GB in 12 s before."""
    def endless(req, body):  # type: ignore[no-untyped-def]
        start_sse(req)
        req.wfile.write(b"data: ")
        try:
            for _ in range(400):  # 25 MiB at most, then the test's server stops
                req.wfile.write(b"x" * 65536)
        except OSError:
            pass

    with FakeServer(llama_routes(endless)) as fake:
        with pytest.raises(ServerError, match="over 8 MiB"):
            list(ServerBackend.connect(ServerSpec(fake.url), "srv").chat(MESSAGES, params(20)))


def test_a_server_that_drips_a_byte_a_second_times_out() -> None:
    """A byte a second kept the socket's own timeout from firing, and no line ever ended: no end."""
    def drip(req, body):  # type: ignore[no-untyped-def]
        start_sse(req)
        write_events(req, [chunk("a")])
        try:
            for _ in range(30):
                req.wfile.write(b":")
                req.wfile.flush()
                time.sleep(0.2)
        except OSError:
            pass

    with FakeServer(llama_routes(drip)) as fake:
        started = time.monotonic()
        with pytest.raises(ServerError, match="no line of the stream ended in 2 s"):
            list(ServerBackend.connect(ServerSpec(fake.url, timeout=1.0), "srv").chat(MESSAGES, params(20)))
        assert time.monotonic() - started < 5


def test_esc_in_the_middle_of_an_event_stops_the_reply_it_does_not_fail_it() -> None:
    def drip(req, body):  # type: ignore[no-untyped-def]
        start_sse(req)
        write_events(req, [chunk("a")])
        try:
            req.wfile.write(b'data: {"choices":[{"delta":{"content":"b')
            req.wfile.flush()
            time.sleep(3)
        except OSError:
            pass

    cancel = threading.Event()
    with FakeServer(llama_routes(drip)) as fake:
        reply = ServerBackend.connect(ServerSpec(fake.url), "srv").chat(MESSAGES, params(20), cancel)
        first = next(reply)
        threading.Timer(0.3, cancel.set).start()
        rest = list(reply)
    assert first.text == "a" and rest[-1].finish_reason == "cancelled"


def test_a_redirect_is_named_not_read_as_malformed_json() -> None:
    def moved(req, body):  # type: ignore[no-untyped-def]
        req.send_response(307)
        req.send_header("Location", "http://elsewhere.example/v1/chat/completions" + HOSTILE["osc0-title"])
        req.send_header("Content-Length", "0")
        req.end_headers()

    with FakeServer({CHAT: moved}) as fake:
        with pytest.raises(ServerError) as err:
            list(ServerClient(ServerSpec(fake.url)).stream(CHAT, {}))
    assert "redirects (307) to http://elsewhere.example" in str(err.value) and raw_in(str(err.value)) == []


def test_a_reply_that_ends_at_the_budget_keeps_its_figures() -> None:
    def exact(req, body):  # type: ignore[no-untyped-def]
        start_sse(req)
        write_events(req, reply_stream(["a", "b", "c"], finish="length"))

    with FakeServer(llama_routes(exact)) as fake:
        events = list(ServerBackend.connect(ServerSpec(fake.url), "srv").chat(MESSAGES, params(3)))
    assert "".join(e.text for e in events) == "abc" and events[-1].finish_reason == "length"
    assert events[-1].notice is None and events[-1].stats.prompt_tokens == 20  # the usage after the text was read


def test_a_servers_error_of_200k_characters_is_cut() -> None:
    def fail(req, body):  # type: ignore[no-untyped-def]
        start_sse(req)
        write_events(req, [chunk("a"), {"error": {"message": "x" * 200_000}}])

    with FakeServer({CHAT: fail}) as fake:
        with pytest.raises(ServerError) as err:
            list(ServerClient(ServerSpec(fake.url)).stream(CHAT, {}))
    assert len(str(err.value)) < 1100 and str(err.value).endswith("characters more)")


@pytest.mark.parametrize("listing", [{"data": 5}, {"data": True}, {"data": {"id": "m"}}, [1, 2], "text"])
def test_a_models_list_of_another_shape_is_read_as_naming_nothing(listing: object) -> None:
    """``{"data": 5}`` ended the connect in a TypeError (a traceback from ``specchat generate``);
    now it is a list that names no model, and the error says what to set."""
    from engine.errors import EngineError

    routes = llama_routes(lambda req, body: None)
    routes["/v1/models"] = lambda req, body: send_json(req, 200, listing)
    with FakeServer(routes) as fake:
        with pytest.raises(EngineError, match='lists no models at /v1/models: name one with --server-model NAME, or model = "..."'):
            ServerBackend.connect(ServerSpec(fake.url), "srv")


def test_a_draft_position_of_five_thousand_digits_is_left_out() -> None:
    """A ``/metrics`` label ``position="<5000 digits>"`` ended the connect in a ValueError
    (Python's limit on converting long digit strings)."""
    from engine.remote.figures import parse_spec_counters

    text = ('vllm:spec_decode_num_drafts_total 10\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 7\n'
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="{"9" * 5000}"}} 3\n')
    counters = parse_spec_counters(text)
    assert counters is not None and counters.per_position == {0: 7.0}


def test_json_nested_beyond_the_parsers_depth_is_malformed_not_a_crash() -> None:
    """A stream event of 100,000 ``[`` ended ``generate`` in a RecursionError."""
    from engine.remote.sse import parse_json

    with pytest.raises(ServerError, match="malformed JSON"):
        parse_json("[" * 100_000 + "]" * 100_000, "http://h/v1/chat/completions")
