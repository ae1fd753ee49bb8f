"""A server that misbehaves at the edges: a key the header cannot carry, answers that never
end or never stop growing, a host that drops the handshake, streams cut mid-event or ended
without ``[DONE]``. Each ends in a clear error (or none where the reply was whole), soon, and
Esc stops any wait at once."""
from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest

import engine.remote.backend as backend_module
from app.cli import main
from engine.config.server import ServerSpec, redact_url
from engine.errors import EngineError
from engine.events import ChatMessage, GenerationParams, SamplingParams
from engine.remote.backend import ServerBackend
from engine.remote.client import ServerClient
from engine.remote.server_errors import ServerError
from tests.fake_server import (
    FakeServer, chunk, llama_routes, models_route, props_route, reply_stream, send_json, send_text, start_sse,
    write_events,
)

CHAT = "/v1/chat/completions"
MESSAGES = [ChatMessage("user", "hi")]
PARAMS = GenerationParams(sampling=SamplingParams(temperature=0.0), max_new_tokens=20)


def drip(req, body) -> None:  # type: ignore[no-untyped-def]
    """An answer that claims a long body and sends a byte every 0.2 s."""
    req.send_response(200)
    req.send_header("Content-Type", "application/json")
    req.send_header("Content-Length", "100000")
    req.end_headers()
    try:
        for _ in range(100):
            req.wfile.write(b" ")
            req.wfile.flush()
            time.sleep(0.2)
    except OSError:
        pass


@pytest.mark.parametrize("key", ["sekrit-123\r\n\r", "sek\nrit", "ключ-sekrit"])
def test_a_key_a_header_cannot_carry_is_named_not_shown(key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_KEY", key)
    spec = ServerSpec("http://127.0.0.1:9", api_key_env="MY_KEY")
    with pytest.raises(EngineError, match=r"the API key in \$MY_KEY holds a line break") as err:
        ServerClient(spec).get("/v1/models")
    assert "sekrit" not in str(err.value) and "rit" not in str(err.value).replace("character", "")


def test_a_key_with_a_trailing_line_end_from_a_crlf_file_is_refused_not_sent_raw(monkeypatch) -> None:
    monkeypatch.setenv("MY_KEY", "k\r")
    with FakeServer({"/props": lambda req, body: send_json(req, 200, {})}) as fake:
        with pytest.raises(EngineError, match="line break"):
            ServerClient(ServerSpec(fake.url, api_key_env="MY_KEY")).get_json("/props")
        assert fake.requests == []


def test_an_answer_of_over_8_mib_is_refused_before_it_fills_memory() -> None:
    def huge(req, body) -> None:  # type: ignore[no-untyped-def]
        send_text(req, 200, '{"data": "' + "x" * (9 * 2**20) + '"}', "application/json")

    with FakeServer({"/v1/models": huge}) as fake:
        with pytest.raises(ServerError, match="over 8 MiB") as err:
            ServerClient(ServerSpec(fake.url)).get_json("/v1/models")
    assert err.value.kind == "malformed"


def test_an_answer_dripped_a_byte_at_a_time_times_out_in_twice_the_timeout() -> None:
    with FakeServer({"/v1/models": drip}) as fake:
        started = time.monotonic()
        with pytest.raises(ServerError, match="did not end within 2 s") as err:
            ServerBackend.connect(ServerSpec(fake.url, timeout=1.0), "srv")
        assert time.monotonic() - started < 6 and err.value.kind == "timeout"


def test_the_start_up_check_waits_as_long_as_the_profile_says(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its error said "raise `timeout` in the profile", and raising it changed nothing."""
    monkeypatch.setattr(backend_module, "PROBE_TIMEOUT_S", 0.3)

    def slow_models(req, body) -> None:  # type: ignore[no-untyped-def]
        time.sleep(0.8)
        models_route()(req, body)

    with FakeServer({"/v1/models": slow_models, "/props": props_route()}) as fake:
        with pytest.raises(ServerError, match="timeout"):
            ServerBackend.connect(ServerSpec(fake.url), "srv")  # the default: said soon
        assert ServerBackend.connect(ServerSpec(fake.url, timeout=5.0), "srv").model is not None


def test_esc_during_the_metrics_read_before_a_reply_stops_it_and_sends_nothing() -> None:
    scrapes: list[float] = []

    def metrics(req, body) -> None:  # type: ignore[no-untyped-def]
        scrapes.append(time.monotonic())
        if len(scrapes) == 1:  # the start-up scrape answers: the server has metrics
            send_text(req, 200, "vllm:spec_decode_num_drafts_total 0\nvllm:spec_decode_num_draft_tokens_total 0\n"
                                "vllm:spec_decode_num_accepted_tokens_total 0\n")
        else:
            drip(req, body)

    routes = llama_routes(lambda req, body: write_events(req, reply_stream(["a"])))
    routes["/metrics"] = metrics
    with FakeServer(routes) as fake:
        backend = ServerBackend.connect(ServerSpec(fake.url), "srv")
        assert backend.metrics_known
        cancel = threading.Event()
        threading.Timer(0.3, cancel.set).start()
        started = time.monotonic()
        events = list(backend.chat(MESSAGES, PARAMS, cancel))
        assert time.monotonic() - started < 1.5
        assert events[-1].finish_reason == "cancelled" and fake.posts() == []


@pytest.fixture
def silent_host() -> Iterator[str]:
    """A listener whose backlog is full: the next handshake is dropped, and connect waits."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    held = []
    for _ in range(8):  # fill the accept queue (its length is backlog + 1 on Linux)
        client = socket.socket()
        client.setblocking(False)
        client.connect_ex(("127.0.0.1", port))
        held.append(client)
    time.sleep(0.2)
    probe = socket.socket()
    probe.settimeout(0.5)
    try:
        probe.connect(("127.0.0.1", port))
        pytest.skip("this kernel accepts handshakes past a full backlog")
    except OSError:
        pass
    finally:
        probe.close()
    yield f"http://127.0.0.1:{port}"
    for s in (*held, server):
        s.close()


def test_a_stream_asked_for_after_esc_sends_nothing() -> None:
    with FakeServer(llama_routes(lambda req, body: write_events(req, reply_stream(["a"])))) as fake:
        cancel = threading.Event()
        cancel.set()
        assert list(ServerClient(ServerSpec(fake.url)).stream(CHAT, {}, cancel)) == []
        assert fake.requests == []  # not even a connection that happened to open at once


def test_esc_while_the_host_drops_the_handshake_stops_at_once(silent_host: str) -> None:
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    started = time.monotonic()
    assert list(ServerClient(ServerSpec(silent_host)).stream(CHAT, {}, cancel)) == []
    assert time.monotonic() - started < 1.5  # the connect timeout is 10 s


def test_a_path_outside_ascii_is_sent_percent_encoded() -> None:
    with FakeServer({"/caf%C3%A9/v1/models": models_route()}) as fake:
        listing = ServerClient(ServerSpec(fake.url + "/café")).get_json("/v1/models")
    assert isinstance(listing, dict) and fake.requests[0][0] == "/caf%C3%A9/v1/models"


@pytest.mark.parametrize("url, shown", [
    ("http://bob:hunter2/x@127.0.0.1:1", "http://bob:***@127.0.0.1:1"),
    ("http://user:pa?ss@h", "http://user:***@h"),
    ("http://tok#en@h:1", "http://***@h:1"),
    ("http://alice:s%40cret@h:8/v1", "http://alice:***@h:8/v1"),
    ("http://h:8/v1", "http://h:8/v1"),
    ("http://10.0.0.2:8080/@team/v1", "http://10.0.0.2:8080/@team/v1"),  # an @ in a path: no user part
    ("http://admin:1234/abcd@host:8080", "http://admin:***@host:8080"),  # a host:port that reads as valid
    ("http://user:/secret@host", "http://user:***@host"),
    ("http://dXNl+cjp/wYXN=@10.0.0.2:8080/v1", "http://***@10.0.0.2:8080/v1"),  # a token holding a /
])
def test_a_password_holding_a_slash_or_query_mark_is_hidden_too(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_a_mime_type_in_capitals_is_still_an_event_stream() -> None:
    def shouting(req, body) -> None:  # type: ignore[no-untyped-def]
        req.send_response(200)
        req.send_header("Content-Type", "Text/Event-Stream; Charset=UTF-8")
        req.end_headers()
        write_events(req, reply_stream(["Hello", " there"]))

    with FakeServer(llama_routes(shouting)) as fake:
        events = list(ServerBackend.connect(ServerSpec(fake.url), "srv").chat(MESSAGES, PARAMS))
    assert "".join(e.text for e in events) == "Hello there" and events[-1].finish_reason == "eos"


def test_a_reply_that_gave_its_finish_reason_is_whole_without_done() -> None:
    def no_done(req, body) -> None:  # type: ignore[no-untyped-def]
        start_sse(req)
        write_events(req, [chunk("Hi"), chunk(None, "stop")])  # then the connection closes

    with FakeServer(llama_routes(no_done)) as fake:
        events = list(ServerBackend.connect(ServerSpec(fake.url), "srv").chat(MESSAGES, PARAMS))
    assert "".join(e.text for e in events) == "Hi" and events[-1].finish_reason == "eos"


def test_a_stream_cut_in_the_middle_of_an_event_is_a_cut_not_malformed_json() -> None:
    def cut(req, body) -> None:  # type: ignore[no-untyped-def]
        start_sse(req)
        write_events(req, [chunk("Hi"), 'data: {"choices": [{"delta": {"content": "cut he'])

    with FakeServer(llama_routes(cut)) as fake:
        with pytest.raises(ServerError, match="stopped in the middle of an event") as err:
            list(ServerBackend.connect(ServerSpec(fake.url), "srv").chat(MESSAGES, PARAMS))
    assert err.value.kind == "cut"


def test_a_reply_spent_on_reasoning_says_so() -> None:
    def thinking(req, body) -> None:  # type: ignore[no-untyped-def]
        start_sse(req)
        thoughts = [{"choices": [{"index": 0, "finish_reason": None, "delta": {"reasoning_content": "hmm " * 5}}]}]
        write_events(req, [*thoughts * 3, chunk(None, "length"), "data: [DONE]\n\n"])

    with FakeServer(llama_routes(thinking)) as fake:
        events = list(ServerBackend.connect(ServerSpec(fake.url), "srv").chat(MESSAGES, PARAMS))
    assert "".join(e.text for e in events) == ""
    assert events[-1].notice is not None and "spent the reply reasoning (60 characters" in events[-1].notice


def test_generate_json_keeps_the_reply_so_far_when_the_stream_fails(capsys: pytest.CaptureFixture[str]) -> None:
    def dies(req, body) -> None:  # type: ignore[no-untyped-def]
        start_sse(req)
        write_events(req, [chunk("Half a"), chunk(" reply")])
        req.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
        req.connection.close()  # a reset, mid-reply

    with FakeServer(llama_routes(dies)) as fake:
        assert main(["--server", fake.url, "generate", "hi", "--json"]) == 2
    out, err = capsys.readouterr()
    got = json.loads(out)
    assert got["text"] == "Half a reply" and got["finish_reason"] == "error"
    assert "the reply so far is kept" in got["error"] and "the reply so far is kept" in err


@pytest.mark.parametrize("end", ["\r", "\r\n", "\n"], ids=["CR", "CRLF", "LF"])
def test_an_event_stream_may_end_its_lines_with_cr_crlf_or_lf(end: str) -> None:
    """A stream of bare-CR lines read as one endless line: "malformed JSON"."""
    def chat(req, body) -> None:  # type: ignore[no-untyped-def]
        start_sse(req)
        for event in reply_stream(["Hello", " there"]):
            text = event if isinstance(event, str) else f"data: {json.dumps(event)}\n\n"
            req.wfile.write(text.replace("\n", end).encode())
            req.wfile.flush()

    with FakeServer(llama_routes(chat)) as fake:
        events = list(ServerBackend.connect(ServerSpec(fake.url), "srv").chat(MESSAGES, PARAMS))
    assert "".join(e.text for e in events) == "Hello there" and events[-1].finish_reason == "eos"


class Pieces:
    """An answer that arrives in the given pieces, one read each."""

    def __init__(self, *pieces: bytes) -> None:
        self.pieces = list(pieces)

    def read1(self, n: int) -> bytes:
        return self.pieces.pop(0) if self.pieces else b""


def test_crlf_split_between_two_reads_is_one_line_end() -> None:
    from engine.remote.sse import Lines

    lines = Lines(Pieces(b"data: a\r", b"\ndata: b\r\n\r", b"\n", b"tail"))  # type: ignore[arg-type]
    got = [lines.readline(100) for _ in range(5)]
    assert got == [b"data: a\n", b"data: b\n", b"\n", b"tail", b""]
    assert Lines(Pieces(b"x" * 50)).readline(10) == b"x" * 50  # type: ignore[arg-type]  # too long: its caller refuses it


def test_a_model_id_is_shown_on_one_line_and_cut_short() -> None:
    """A 5,000-character id filled the HUD with thousands of lines; one with a newline broke its rows."""
    from engine.remote.reply_run import MODEL_NAME_SHOWN, shown_model

    assert shown_model("qwen\n2.5\t7b") == "qwen 2.5 7b"
    long = shown_model("m" * 5000)
    assert len(long) == MODEL_NAME_SHOWN and long.endswith("…") and "\n" not in long
    assert shown_model("bad\x1b]0;title\x07") == "bad␛]0;title␇"


def test_a_server_reply_leaves_the_local_engines_round_fields_null() -> None:
    """`generate --json` showed "k": 0 (read as plain decoding), "rounds": 0, "draft_s": 0.0 for a
    server's reply beside the proposed and accepted counts the server reported."""
    from engine.remote.figures import ServerStats

    d = ServerStats(mode="spec", server="llama.cpp", tokens=9, proposed=6, accepted=3).to_dict()
    assert all(d[k] is None for k in ("k", "rounds", "draft_s", "verify_s", "other_s"))
    assert (d["proposed"], d["accepted"], d["server"]) == (6, 3, "llama.cpp")
