"""ServerClient against a loopback server: requests as sent, server-sent events as read, every failure a ServerError."""
from __future__ import annotations

import socket
import threading
from typing import Any

import pytest

from engine.config.server import ServerSpec
from engine.remote.client import ServerClient
from engine.remote.server_errors import ServerError, error_message, http_error
from engine.remote.sse import parse_json
from tests.fake_server import FakeServer, send_json, start_sse, write_events

CHAT = "/v1/chat/completions"


def client(fake: FakeServer, path: str = "", **spec: Any) -> ServerClient:
    return ServerClient(ServerSpec(fake.url + path, **spec))


def sse(raw: str):  # type: ignore[no-untyped-def]
    """A chat route that answers with ``raw`` as an event stream."""
    def chat(req, body):  # type: ignore[no-untyped-def]
        start_sse(req)
        req.wfile.write(raw.encode())
    return chat


def test_get_sends_who_it_is_and_returns_the_text_and_its_type() -> None:
    with FakeServer({"/props": lambda req, body: send_json(req, 200, {"build_info": "b1"})}) as fake:
        text, ctype = client(fake).get("/props")
        assert text == '{"build_info": "b1"}' and ctype == "application/json"
        assert client(fake).get_json("/props") == {"build_info": "b1"}
        path, body, headers = fake.requests[0]
        assert path == "/props" and body is None
        assert headers["User-Agent"] == "specchat" and headers["Accept"] == "application/json, text/event-stream"
        assert "Authorization" not in headers and "Content-Type" not in headers


def test_a_key_is_sent_as_a_bearer_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SRV_KEY", "sekrit")
    with FakeServer({"/props": lambda req, body: send_json(req, 200, {})}) as fake:
        client(fake, api_key_env="SRV_KEY").get_json("/props")
        assert fake.requests[0][2]["Authorization"] == "Bearer sekrit"


def echo_authorization(status: int):  # type: ignore[no-untyped-def]
    """A route that answers ``status`` quoting the request's Authorization header, as some servers do."""
    def route(req, body):  # type: ignore[no-untyped-def]
        said = f"Incorrect API key provided: {req.headers.get('Authorization')}"
        send_json(req, status, {"error": {"message": said}})
    return route


@pytest.mark.parametrize("status", [401, 500])
def test_a_key_the_server_echoes_in_its_error_is_not_repeated(monkeypatch: pytest.MonkeyPatch, status: int) -> None:
    """generate printed "... Incorrect API key provided: Bearer sk-SECRETKEY123456", --json kept it,
    the app's toast showed it."""
    monkeypatch.setenv("SRV_KEY", "sk-SECRETKEY123456")
    with FakeServer({"/props": echo_authorization(status)}) as fake:
        with pytest.raises(ServerError) as err:
            client(fake, api_key_env="SRV_KEY").get_json("/props")
    assert "SECRETKEY" not in str(err.value) and "Incorrect API key provided: Bearer ***" in str(err.value)


def test_a_password_the_server_echoes_is_not_repeated_in_any_form() -> None:
    """The URL's user:hunter2pass went out as Basic Ym9iOmh1bnRlcjJwYXNz and came back in the error."""
    with FakeServer({"/props": echo_authorization(403)}) as fake:
        url = fake.url.replace("http://", "http://bob:hunter2pass@")
        with pytest.raises(ServerError) as err:
            ServerClient(ServerSpec(url)).get_json("/props")
        assert "Ym9iOmh1bnRlcjJwYXNz" not in str(err.value) and "Basic ***" in str(err.value)
    spec = ServerSpec("http://bob:hunter2pass@h:1")
    assert spec.hide_secrets("bob:hunter2pass hunter2pass x") == "*** *** x"


def test_a_secret_the_server_writes_with_json_escapes_is_hidden_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hidden in the raw body only, "sk-ab\\/cd+ef==" (PHP's escaped slash) and "p\\u00e4ssw0rd" came back
    whole once the JSON was read (a review's)."""
    monkeypatch.setenv("SRV_KEY", "sk-ab/cd+ef==")
    keyed = ServerSpec("http://h:1", api_key_env="SRV_KEY")
    raw = b'{"error": {"message": "Incorrect API key provided: Bearer sk-ab\\/cd+ef=="}}'
    assert "sk-ab" not in str(http_error(401, "u", raw, keyed)) and "Bearer ***" in str(http_error(401, "u", raw, keyed))
    login = ServerSpec("http://bob:p%C3%A4ssw0rd@h:1")
    raw = b'{"error": {"message": "bad login bob:p\\u00e4ssw0rd"}}'
    assert "ssw0rd" not in str(http_error(500, "u", raw, login)) and "bad login ***" in str(http_error(500, "u", raw, login))
    for malformed in ("{not json sk-ab/cd+ef==", '{not json "sk-ab\\/cd+ef=="'):  # a malformed answer is quoted,
        with pytest.raises(ServerError) as err:  # its secret hidden, escaped or not (a review's)
            parse_json(malformed, "u", keyed.hide_secrets)
        assert "sk-ab" not in str(err.value) and "{not json " in str(err.value) and "***" in str(err.value)


def test_a_key_in_an_error_sent_inside_the_stream_is_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SRV_KEY", "sk-SECRETKEY123456")
    raw = 'data: {"error": {"message": "quota of sk-SECRETKEY123456 is spent"}}\n\n'
    with FakeServer({CHAT: sse(raw)}) as fake:
        with pytest.raises(ServerError, match=r"mid-reply: quota of \*\*\* is spent"):
            list(client(fake, api_key_env="SRV_KEY").stream(CHAT, {}))


def test_a_url_ending_in_v1_or_a_path_puts_requests_under_it() -> None:
    ok = lambda req, body: send_json(req, 200, {"ok": True})  # noqa: E731
    with FakeServer({"/v1/models": ok, "/proxy/v1/models": ok}) as fake:
        assert client(fake, "/v1/").get_json("/v1/models") == {"ok": True}
        assert client(fake, "/proxy").get_json("/v1/models") == {"ok": True}
        assert [r[0] for r in fake.requests] == ["/v1/models", "/proxy/v1/models"]


def test_events_are_read_as_the_sse_format_says() -> None:
    raw = (": keep-alive ping\n\n"
           'data: {"n": 1}\r\n\r\n'
           'event: chunk\nid: 7\ndata:{"n": 2}\n\n'  # other fields ignored, the space after "data:" optional
           'data: {"n":\ndata: 3}\n\n'  # several data lines make one payload
           "data: [DONE]\n\n"
           'data: {"n": 4}\n\n')  # nothing after [DONE] is read
    with FakeServer({CHAT: sse(raw)}) as fake:
        assert list(client(fake).stream(CHAT, {"stream": True})) == [{"n": 1}, {"n": 2}, {"n": 3}]
        assert fake.posts()[0] == {"stream": True}
        assert fake.requests[0][2]["Content-Type"] == "application/json"


def test_a_plain_json_answer_is_one_payload() -> None:
    answer = {"choices": [{"message": {"content": "hi"}}]}
    with FakeServer({CHAT: lambda req, body: send_json(req, 200, answer)}) as fake:
        assert list(client(fake).stream(CHAT, {})) == [answer]
        assert client(fake).post_json(CHAT, {}) == answer


def catch(fake: FakeServer, **spec: Any) -> tuple[list[Any], ServerError]:
    got: list[Any] = []
    with pytest.raises(ServerError) as err:
        for payload in client(fake, **spec).stream(CHAT, {}):
            got.append(payload)
    return got, err.value


@pytest.mark.parametrize("raw, kind, message", [
    ('data: {"n": 1}\n\n', "cut", "/v1/chat/completions: the server closed the stream before the reply ended "
                                  "(no [DONE]); it may have crashed or been stopped"),
    ('data: {"n": 1}\n\ndata: {"n": 2\n\n', "malformed", "/v1/chat/completions: the server sent malformed JSON: '{\"n\": 2'"),
    ('data: {"n": 1}\n\ndata: [1, 2]\n\n', "malformed", "/v1/chat/completions: expected a JSON object, got list"),
    ('data: {"n": 1}\n\ndata: {"error": {"message": "slot crashed"}}\n\n', "server",
     "the server reported an error mid-reply: slot crashed"),
])
def test_a_stream_that_goes_wrong_keeps_what_came_before(raw: str, kind: str, message: str) -> None:
    with FakeServer({CHAT: sse(raw)}) as fake:
        got, error = catch(fake)
        assert got == [{"n": 1}] and error.kind == kind and str(error).endswith(message)
        assert error.status is None


def test_silence_past_the_timeout_is_a_timeout_error() -> None:
    release = threading.Event()

    def silent(req, body):  # type: ignore[no-untyped-def]
        start_sse(req)
        write_events(req, [{"n": 1}])
        release.wait(30)

    with FakeServer({CHAT: silent}) as fake:
        try:
            got, error = catch(fake, timeout=0.3)
        finally:
            release.set()
        assert got == [{"n": 1}] and error.kind == "timeout"
        assert "the server sent nothing for 0.3 s (timeout); the reply so far is kept" in str(error)


def test_keep_alive_comments_alone_past_the_timeout_are_a_timeout_error() -> None:
    """A server that sends only ``: ping`` comments, forever, is as stalled as a silent one: the
    comments kept the socket's timeout from ever firing and ``generate`` waited for good."""
    release = threading.Event()

    def pinging(req, body):  # type: ignore[no-untyped-def]
        start_sse(req)
        write_events(req, [{"n": 1}])
        while not release.is_set():
            write_events(req, [": ping\n\n"])
            release.wait(0.02)

    with FakeServer({CHAT: pinging}) as fake:
        outcome: list[Any] = []
        reader = threading.Thread(target=lambda: outcome.append(catch(fake, timeout=0.3)), daemon=True)
        reader.start()
        reader.join(20)
        release.set()
        assert outcome, "the reader still waits after 20 s of keep-alive comments"
        got, error = outcome[0]
        assert got == [{"n": 1}] and error.kind == "timeout"
        assert "the server sent only keep-alive comments for 0.3 s (timeout); the reply so far is kept" in str(error)


@pytest.mark.parametrize("then", ["hold", "reset", "ping"])
def test_a_reply_that_gave_its_finish_reason_is_whole_if_the_server_then_holds_or_drops_the_line(
        monkeypatch: pytest.MonkeyPatch, then: str) -> None:
    """Held open after the finishing chunk (no [DONE], no close), the reply failed when the 120 s
    timeout ran out: "the server sent nothing for 120 s", its text kept but marked failed. Held open
    with keep-alive comments ("ping"), it waited out the whole timeout."""
    import engine.remote.client as client_module

    monkeypatch.setattr(client_module, "FINISHED_GRACE_S", 0.2)
    release = threading.Event()
    finishing = {"choices": [{"delta": {}, "index": 0, "finish_reason": "stop"}]}

    def holds(req, body):  # type: ignore[no-untyped-def]
        start_sse(req)
        write_events(req, [{"n": 1}, finishing])
        if then == "reset":  # half an event, then the connection goes
            req.wfile.write(b'data: {"usa')
            req.wfile.flush()
            req.connection.shutdown(socket.SHUT_RDWR)
        while then == "ping" and not release.is_set():
            write_events(req, [": ping\n\n"])
            release.wait(0.02)
        release.wait(30)

    with FakeServer({CHAT: holds}) as fake:
        outcome: list[Any] = []
        reader = threading.Thread(target=lambda: outcome.append(list(client(fake, timeout=30).stream(CHAT, {}))),
                                  daemon=True)
        reader.start()
        reader.join(10)
        release.set()
        assert outcome, "the reader still waits 10 s after the reply's end"
        assert outcome[0] == [{"n": 1}, finishing]  # and no error


def test_a_compressed_answer_nobody_asked_for_is_named() -> None:
    """A gzip event stream read as "closed the stream before the reply ended (no [DONE])"."""
    import gzip

    def gzipped(req, body):  # type: ignore[no-untyped-def]
        data = gzip.compress(b'data: {"n": 1}\n\ndata: [DONE]\n\n')
        req.send_response(200)
        req.send_header("Content-Type", "text/event-stream")
        req.send_header("Content-Encoding", "gzip")
        req.send_header("Content-Length", str(len(data)))
        req.end_headers()
        req.wfile.write(data)

    with FakeServer({CHAT: gzipped, "/props": gzipped}) as fake:
        for call in (lambda c: list(c.stream(CHAT, {})), lambda c: c.get("/props")):
            with pytest.raises(ServerError, match=r"the server sent its answer compressed \(gzip\), which specchat "
                                                  r"did not ask for") as err:
                call(client(fake))
            assert err.value.kind == "malformed"


def test_cancel_ends_a_silent_stream_quietly() -> None:
    release = threading.Event()

    def silent(req, body):  # type: ignore[no-untyped-def]
        start_sse(req)
        write_events(req, [{"n": 1}])
        release.wait(30)

    cancel = threading.Event()
    with FakeServer({CHAT: silent}) as fake:
        got = []
        try:
            for payload in client(fake).stream(CHAT, {}, cancel):
                got.append(payload)
                cancel.set()  # the watcher shuts the socket; the blocked read ends without an error
        finally:
            release.set()
        assert got == [{"n": 1}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_nobody_listening_is_refused_with_what_to_check() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ServerError) as err:
        ServerClient(ServerSpec(url)).get("/v1/models")
    assert err.value.kind == "refused"
    assert str(err.value) == (f"cannot connect to {url}: connection refused. "
                              "Is the server running, and is this its address and port?")
    cancel = threading.Event()
    cancel.set()
    assert list(ServerClient(ServerSpec(url)).stream(CHAT, {}, cancel)) == []  # cancelled: no error to show


def test_an_http_error_status_carries_the_servers_message() -> None:
    def fail(req, body):  # type: ignore[no-untyped-def]
        send_json(req, 503, {"error": {"message": "loading model"}})

    with FakeServer({"/v1/models": fail, CHAT: fail}) as fake:
        for call in (lambda c: c.get("/v1/models"), lambda c: list(c.stream(CHAT, {}))):
            with pytest.raises(ServerError) as err:
                call(client(fake))
            assert err.value.kind == "http" and err.value.status == 503
            assert str(err.value).endswith(": HTTP 503 (the server says: loading model)")


SPEC = ServerSpec("http://h:1")
KEYED = ServerSpec("http://h:1", api_key_env="MY_KEY")


@pytest.mark.parametrize("status, spec, raw, kind, message", [
    (401, SPEC, b'{"error": {"message": "Invalid API Key"}}', "auth",
     "u: 401 unauthorized: the server wants an API key: put it in an environment variable and name it with "
     '--api-key-env, or api_key_env in the profile (e.g. api_key_env = "OPENAI_API_KEY") (the server says: '
     "Invalid API Key)"),
    (403, KEYED, b"", "auth", "u: 403 forbidden: check the key in $MY_KEY"),
    (401, ServerSpec("http://bob:pw@h:1"), b"", "auth",  # it asked for an API key, which such a url cannot have too
     "u: 401 unauthorized: check the user and password in the url"),
    (404, SPEC, b"File Not Found", "not_found",
     "u: 404 not found: check the url (the server's root, e.g. http://127.0.0.1:8080) and the model name "
     "(the server says: File Not Found)"),
    (422, SPEC, b'{"detail": "messages: field required"}', "http",
     "u: HTTP 422 (the server says: messages: field required)"),
    (500, SPEC, b"x" * 300, "http", f"u: HTTP 500 (the server says: {'x' * 200}…)"),
    (502, SPEC, b"<html>\n<head><title>502 Bad Gateway</title><style>p {x}</style></head>\n<body>\n<h1>Bad\n"
                b"Gateway</h1>\n<!-- a padding comment -->\n</body></html>\n", "http",
     "u: HTTP 502 (the server says: 502 Bad Gateway Bad Gateway)"),  # one line, no markup
    (422, SPEC, b'{"detail": [{"loc": ["body", "messages"], "msg": "field required"}, {"msg": "bad role"}]}',
     "http", "u: HTTP 422 (the server says: field required; bad role)"),
])
def test_http_errors_say_what_to_fix(status: int, spec: ServerSpec, raw: bytes, kind: str, message: str) -> None:
    error = http_error(status, "u", raw, spec)
    assert (error.kind, error.status, str(error)) == (kind, status, message)


@pytest.mark.parametrize("payload, said", [
    ({"error": {"message": "bad"}}, "bad"),
    ({"error": {"msg": "worse"}}, "worse"),
    ({"error": "plain text"}, "plain text"),
    ({"detail": "FastAPI says"}, "FastAPI says"),
    ("just a string", "just a string"),
])
def test_error_message_finds_the_human_part(payload: Any, said: str) -> None:
    assert error_message(payload) == said


def test_malformed_json_shows_a_short_snippet() -> None:
    assert parse_json('{"a": 1}', "u") == {"a": 1}
    with pytest.raises(ServerError) as err:
        parse_json("<html>\n" + "y" * 500, "u")
    assert err.value.kind == "malformed"
    assert str(err.value) == f"u: the server sent malformed JSON: {('<html> ' + 'y' * 500)[:120]!r}"


@pytest.mark.parametrize("header, seconds", [("5", 5.0), (" 2.5 ", 2.5), ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),
                                             ("junk", None), ("nan", None), ("1e9", 3600.0), (None, None)])
def test_retry_after_is_read_as_seconds_or_a_date(header: str | None, seconds: float | None) -> None:
    from engine.remote.server_errors import retry_after

    assert retry_after(header) == seconds


def test_a_429_says_when_the_server_asks_to_be_tried_again() -> None:
    error = http_error(429, "u", b'{"error": {"message": "Too Many Requests"}}', SPEC, 30.0)
    assert str(error) == "u: HTTP 429 (the server says: Too Many Requests); it asks to try again in 30 s"
    assert error.retry_after_s == 30.0
