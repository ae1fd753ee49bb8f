"""HTTP to an OpenAI-compatible server with the standard library: JSON GETs and
the server-sent-event stream of ``POST /v1/chat/completions``.

Every failure becomes a :class:`ServerError` (an :class:`~engine.errors.EngineError`)
whose message says what happened and what to check, and whose ``kind`` names
the case: ``refused``, ``auth``, ``not_found``, ``http``, ``timeout``, ``cut``
(the stream stopped before the reply ended), ``malformed`` (not JSON) or
``server`` (the server reported an error inside the stream).

Cancelling: while a stream is read, a watcher thread polls the ``cancel``
event and shuts the socket down, so Esc stops a reply even while the server is
silent (a blocked read cannot otherwise be interrupted).
"""
from __future__ import annotations

import errno
import http.client
import json
import os
import re
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from functools import partial
from typing import Any
from urllib.parse import quote, urlsplit

from engine.errors import EngineError
from engine.config.server import ServerSpec
from engine.text_safety import inert, without_lone_surrogates

CONNECT_TIMEOUT_S = 10.0
CANCEL_POLL_S = 0.05
USER_AGENT = "specchat"
MAX_EVENT_BYTES = 8 * 2**20
"""The most one server-sent event (or a plain answer) may hold: a reply's event carries a few
tokens, and a line that never ended grew to gigabytes in memory (a hostile server)."""
LINE_TIMEOUTS = 2
"""A line of the stream must end within this many ``timeout``s (a server dripping a byte a second
never lets the socket's own timeout fire)."""
MAX_MESSAGE_CHARS = 1000
"""The most of an error's text shown (a server's own message is quoted in it)."""


class ServerError(EngineError):
    """A request to the server failed; ``kind`` says how, ``status`` the HTTP status if any."""

    def __init__(self, kind: str, message: str, status: int | None = None) -> None:
        if len(message) > MAX_MESSAGE_CHARS:  # it quotes the server: 200,000 characters were printed whole
            message = message[:MAX_MESSAGE_CHARS] + f"… ({len(message) - MAX_MESSAGE_CHARS:,} characters more)"
        super().__init__(inert(message))  # it quotes the server, and is shown on a terminal
        self.kind = kind
        self.status = status


class ServerClient:
    """Requests to one server. Each request opens its own connection (a reply
    that was cancelled or cut leaves no half-read connection behind)."""

    def __init__(self, spec: ServerSpec) -> None:
        self.spec = spec
        parts = urlsplit(spec.root)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or "localhost"
        self._port = parts.port
        self._prefix = quote(parts.path.rstrip("/"), safe="/%:@!$&'()*+,;=~")  # http.client sends ASCII only

    def _connection(self, timeout: float, cancel: threading.Event | None = None) -> http.client.HTTPConnection:
        """A connection whose connect gives up when ``cancel`` is set (a server whose host drops
        the handshake kept Esc waiting for the whole connect timeout)."""
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        conn = cls(self._host, self._port, timeout=timeout)
        conn._create_connection = partial(_connect, cancel=cancel or threading.Event())  # type: ignore[attr-defined]
        return conn

    def _headers(self, body: bool) -> dict[str, str]:
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json, text/event-stream"}
        if body:
            headers["Content-Type"] = "application/json"
        key = self.spec.api_key()
        if key and not (key.isascii() and key.isprintable()):
            raise EngineError(f"the API key in ${self.spec.api_key_env} holds a line break, a control character or a "
                              "character outside ASCII, which an HTTP header cannot carry: check the variable's "
                              "value (it is not shown here)")
        if key:
            headers["Authorization"] = f"Bearer {key}"
        basic = self.spec.basic_authorization()
        if basic:
            headers["Authorization"] = basic
        return headers

    def _open(self, method: str, path: str, body: dict[str, Any] | None, timeout: float,
              conn: http.client.HTTPConnection | None = None,
              watch: "_Watch | None" = None) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        url = self.spec.root + path
        headers = self._headers(body is not None)
        conn = conn or self._connection(min(timeout, CONNECT_TIMEOUT_S))
        try:
            conn.connect()
            assert conn.sock is not None
            conn.sock.settimeout(timeout)
            if watch is not None:
                watch.sock = conn.sock  # the response may own it after the connection lets go
            data = json.dumps(body).encode() if body is not None else None
            conn.request(method, self._prefix + path, body=data, headers=headers)
            resp = conn.getresponse()
        except ConnectionRefusedError:
            conn.close()
            raise ServerError("refused", f"cannot connect to {self.spec.root}: connection refused. "
                                         "Is the server running, and is this its address and port?") from None
        except (socket.timeout, TimeoutError):
            conn.close()
            raise ServerError("timeout", f"{url}: no answer within {timeout:g} s (timeout). The server may be "
                                         "busy or unreachable; raise `timeout` in the profile if it is just slow") from None
        except OSError as exc:
            conn.close()
            raise ServerError("refused", f"cannot reach {self.spec.root}: {exc}") from None
        except http.client.HTTPException as exc:
            conn.close()
            raise ServerError("cut", f"{url}: the server closed the connection without an answer "
                                     f"({type(exc).__name__})") from None
        if 300 <= resp.status < 400:
            where = inert(resp.getheader("Location", "") or "somewhere else")
            conn.close()
            raise ServerError("http", f"{url}: the server redirects ({resp.status}) to {where}; specchat does not "
                                      "follow redirects: put the address the server means in the profile's url",
                              resp.status)
        if resp.status >= 400:
            try:
                raw = resp.read(65536)
            except (OSError, http.client.HTTPException):
                raw = b""
            conn.close()
            raise http_error(resp.status, url, raw, self.spec)
        return conn, resp

    def get(self, path: str, timeout: float | None = None,
            cancel: threading.Event | None = None) -> tuple[str, str]:
        """``GET path``: the body as text and its content type. Errors as :class:`ServerError`.

        The whole answer must come within ``LINE_TIMEOUTS * timeout`` seconds (a server dripping a
        byte at a time never lets the socket's own timeout fire) and hold at most
        :data:`MAX_EVENT_BYTES`; ``cancel`` (Esc) ends the wait at once, as a ``cut``."""
        limit = timeout or self.spec.timeout
        url = self.spec.root + path
        cancel = cancel or threading.Event()
        watch = _Watch(cancel)
        watch.deadline = time.monotonic() + LINE_TIMEOUTS * limit
        conn = self._connection(min(limit, CONNECT_TIMEOUT_S), cancel)
        watch.start()
        resp: http.client.HTTPResponse | None = None
        try:
            conn, resp = self._open("GET", path, None, limit, conn, watch)
            raw = resp.read(MAX_EVENT_BYTES + 1)
        except (socket.timeout, TimeoutError):
            raise ServerError("timeout", f"{url}: the answer stopped for {limit:g} s (timeout)") from None
        except (OSError, http.client.HTTPException, ServerError) as exc:
            if cancel.is_set():
                raise ServerError("cut", f"{url}: stopped") from None
            if watch.timed_out:
                raise ServerError("timeout", f"{url}: the answer did not end within {LINE_TIMEOUTS * limit:g} s "
                                             "(timeout)") from None
            if isinstance(exc, ServerError):
                raise
            raise ServerError("cut", f"{url}: the answer was cut off ({exc})") from None
        finally:
            watch.done.set()
            if resp is not None:
                resp.close()
            conn.close()
        if cancel.is_set():
            raise ServerError("cut", f"{url}: stopped")
        if watch.timed_out:
            raise ServerError("timeout", f"{url}: the answer did not end within {LINE_TIMEOUTS * limit:g} s (timeout)")
        if len(raw) > MAX_EVENT_BYTES:
            raise ServerError("malformed", f"{url}: the answer is over {MAX_EVENT_BYTES // 2**20} MiB; "
                                           "specchat stopped reading it")
        return raw.decode("utf-8", "replace"), resp.getheader("Content-Type", "")

    def get_json(self, path: str, timeout: float | None = None, cancel: threading.Event | None = None) -> Any:
        text, _ = self.get(path, timeout, cancel)
        return parse_json(text, self.spec.root + path)

    def post_json(self, path: str, body: dict[str, Any], cancel: threading.Event | None = None) -> Any:
        """``POST path`` without streaming; the parsed JSON answer."""
        parts = list(self.stream(path, body, cancel))
        if not parts:
            raise ServerError("cut", f"{self.spec.root + path}: empty answer")
        return parts[-1]

    def stream(self, path: str, body: dict[str, Any], cancel: threading.Event | None = None) -> Iterator[Any]:
        """``POST path`` and yield each JSON payload of the event stream until ``[DONE]``.

        A plain JSON answer (a server that does not stream) is yielded whole.
        Returns quietly when ``cancel`` is set; raises :class:`ServerError` when
        the stream stops early, times out, carries malformed JSON or an error.
        """
        url = self.spec.root + path
        cancel = cancel or threading.Event()
        conn = self._connection(min(self.spec.timeout, CONNECT_TIMEOUT_S), cancel)
        watch = _Watch(cancel)
        watch.deadline = time.monotonic() + LINE_TIMEOUTS * self.spec.timeout  # the answer's head, dripped
        watch.start()
        resp: http.client.HTTPResponse | None = None
        try:
            try:
                conn, resp = self._open("POST", path, body, self.spec.timeout, conn, watch)
            except ServerError:
                if cancel.is_set():
                    return
                raise
            if "text/event-stream" not in resp.getheader("Content-Type", "").lower():  # media types ignore case
                watch.deadline = time.monotonic() + LINE_TIMEOUTS * self.spec.timeout
                text = _read_all(resp, url, self.spec.timeout, cancel, watch)
                if not cancel.is_set():
                    yield _checked(parse_json(text, url), url)
                return
            finished = False
            for payload in _events(resp, url, self.spec.timeout, cancel, watch):
                if cancel.is_set():  # the rest of an event cut by Esc is no error
                    return
                if payload.strip() == "[DONE]":
                    return
                checked = _checked(parse_json(payload, url), url)
                finished = finished or _says_finished(checked)
                yield checked
            if not cancel.is_set() and not finished:  # a reply that gave its finish_reason is whole without [DONE]
                raise ServerError("cut", f"{url}: the server closed the stream before the reply ended "
                                         "(no [DONE]); it may have crashed or been stopped")
        finally:
            watch.done.set()
            if resp is not None:
                resp.close()
            conn.close()


class _Cancelled(OSError):
    """Esc while connecting: the connect gave up (no error is shown for it)."""


def _connect(address: tuple[str, int], timeout: float | None = None, source_address: tuple[str, int] | None = None,
             *, cancel: threading.Event) -> socket.socket:
    """``socket.create_connection`` that gives up when ``cancel`` is set: the handshake runs
    non-blocking, looked at every :data:`CANCEL_POLL_S` (a blocked ``connect`` cannot be
    interrupted, and a host that drops the handshake holds it for the whole timeout)."""
    host, port = address
    deadline = time.monotonic() + (timeout if timeout is not None else CONNECT_TIMEOUT_S)
    last: OSError | None = None
    for family, kind, proto, _, addr in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
        sock = socket.socket(family, kind, proto)
        try:
            if source_address:
                sock.bind(source_address)
            sock.setblocking(False)
            code = sock.connect_ex(addr)
            with selectors.DefaultSelector() as sel:
                sel.register(sock, selectors.EVENT_WRITE)
                while code in (errno.EINPROGRESS, errno.EALREADY, errno.EWOULDBLOCK):
                    if cancel.is_set():
                        raise _Cancelled("stopped while connecting")
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError("timed out while connecting")
                    if sel.select(min(CANCEL_POLL_S, left)):
                        code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if code:
                raise OSError(code, os.strerror(code))  # ECONNREFUSED reads as ConnectionRefusedError
            sock.settimeout(timeout)
            return sock
        except _Cancelled:
            sock.close()
            raise
        except OSError as exc:
            sock.close()
            last = exc
    raise last or OSError(f"no address found for {host}")


class _Watch(threading.Thread):
    """Shuts the request's socket down when ``cancel`` is set before ``done``, or when the
    stream's ``deadline`` (``time.monotonic()``) passes: a server that sends a byte a second
    never lets the socket's own timeout fire, and no event ever ends (``timed_out`` then)."""

    def __init__(self, cancel: threading.Event) -> None:
        super().__init__(name="specchat-cancel", daemon=True)
        self.cancel = cancel
        self.done = threading.Event()
        self.sock: socket.socket | None = None
        self.deadline: float | None = None
        self.timed_out = False

    def run(self) -> None:
        while not self.done.is_set():
            deadline = self.deadline
            if deadline is not None and time.monotonic() > deadline and self.sock is not None:
                self.timed_out = True
                try:
                    self.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                return
            if self.cancel.wait(CANCEL_POLL_S):
                while not self.done.is_set():
                    if self.sock is not None:
                        try:
                            self.sock.shutdown(socket.SHUT_RDWR)
                        except OSError:
                            pass
                        return
                    self.done.wait(CANCEL_POLL_S)  # still connecting: shut it as soon as it exists
                return


def _read_all(resp: http.client.HTTPResponse, url: str, timeout: float, cancel: threading.Event,
              watch: _Watch | None = None) -> str:
    try:
        raw = resp.read(MAX_EVENT_BYTES + 1)
        if len(raw) > MAX_EVENT_BYTES:
            raise ServerError("malformed", f"{url}: the answer is over {MAX_EVENT_BYTES // 2**20} MiB; "
                                           "specchat stopped reading it")
    except (socket.timeout, TimeoutError):
        raise ServerError("timeout", f"{url}: the answer stopped for {timeout:g} s (timeout)") from None
    except (OSError, http.client.HTTPException) as exc:
        if cancel.is_set():
            return "{}"
        if watch is not None and watch.timed_out:
            raise _no_line_ended(url, timeout) from None
        raise ServerError("cut", f"{url}: the answer was cut off ({type(exc).__name__})") from None
    if watch is not None and watch.timed_out and not cancel.is_set():
        raise _no_line_ended(url, timeout)
    return raw.decode("utf-8", "replace")


def _says_finished(payload: dict[str, Any]) -> bool:
    """Whether a chunk carries a choice's ``finish_reason``: the reply is whole even if the server
    then closes the stream without ``[DONE]``."""
    choices = payload.get("choices")
    return isinstance(choices, list) and any(isinstance(c, dict) and c.get("finish_reason") for c in choices)


def _events(resp: http.client.HTTPResponse, url: str, timeout: float, cancel: threading.Event,
            watch: _Watch | None = None) -> Iterator[str]:
    """The ``data`` of each server-sent event (several ``data:`` lines joined by newlines).
    Keep-alive comments alone for ``timeout`` seconds are a timeout, as silence is (they would
    keep the socket's own timeout from ever firing), and so is a line that takes longer than
    twice that to end (``watch`` shuts the socket at its deadline: twice, so that silence is
    always the socket's own timeout, said as such). An event is at most :data:`MAX_EVENT_BYTES`;
    returns at once when ``cancel`` is set."""
    data: list[str] = []
    size = 0
    last_data = time.monotonic()
    while not cancel.is_set():
        if watch is not None:
            watch.deadline = time.monotonic() + LINE_TIMEOUTS * timeout
        failed: BaseException | None = None
        try:
            line = resp.readline(MAX_EVENT_BYTES + 1)
        except (OSError, http.client.HTTPException) as exc:  # socket.timeout is an OSError too
            line, failed = b"", exc
        if cancel.is_set():  # Esc shut the socket: whatever the read got or raised is no error
            return
        if watch is not None and watch.timed_out:  # the watch shut it: a line that never ended
            raise _no_line_ended(url, timeout)
        if isinstance(failed, (socket.timeout, TimeoutError)):
            raise ServerError("timeout", f"{url}: the server sent nothing for {timeout:g} s (timeout); "
                                         "the reply so far is kept. Raise `timeout` in the profile if the "
                                         "server is just slow")
        if failed is not None:
            raise ServerError("cut", f"{url}: the stream stopped mid-reply ({type(failed).__name__}: {failed}); "
                                     "the reply so far is kept")
        size += len(line)
        if size > MAX_EVENT_BYTES:
            raise ServerError("malformed", f"{url}: the server sent an event of over {MAX_EVENT_BYTES // 2**20} MiB "
                                           "(or a line that never ended); specchat stopped reading it")
        if not line:  # the stream ended; an event it cut off is whole only if it still reads as one
            if data and _whole_event("\n".join(data)):
                yield "\n".join(data)
            elif data:
                raise ServerError("cut", f"{url}: the stream stopped in the middle of an event (the connection "
                                         "closed); the reply so far is kept")
            return
        text = line.decode("utf-8", "replace").rstrip("\r\n")
        name, _, value = text.partition(":")
        if name == "data":
            data.append(value[1:] if value.startswith(" ") else value)
            last_data = time.monotonic()
        elif not text and data:
            yield "\n".join(data)
            data, size = [], 0
        elif time.monotonic() - last_data > timeout:  # comments (keep-alive pings), blank lines, other fields
            raise ServerError("timeout", f"{url}: the server sent only keep-alive comments for {timeout:g} s "
                                         "(timeout); the reply so far is kept. Raise `timeout` in the profile "
                                         "if the server is just slow")


def _whole_event(data: str) -> bool:
    if data.strip() == "[DONE]":
        return True
    try:
        json.loads(data)
    except (ValueError, RecursionError):
        return False
    return True


def _no_line_ended(url: str, timeout: float) -> ServerError:
    return ServerError("timeout", f"{url}: no line of the stream ended in {LINE_TIMEOUTS * timeout:g} s (twice the "
                                  "timeout); the reply so far is kept. Raise `timeout` in the profile if the server "
                                  "is just slow")


def parse_json(text: str, url: str) -> Any:
    """``text`` parsed, with each lone surrogate (JSON's ``\\ud800`` alone: no character, and
    nothing UTF-8 can write to a terminal or a database) as U+FFFD."""
    try:
        value = json.loads(text)
        return _no_lone_surrogates(value) if "\\ud" in text.lower() else value
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
        snippet = text.strip().replace("\n", " ")[:120]
        raise ServerError("malformed", f"{url}: the server sent malformed JSON: {snippet!r}") from None


def _no_lone_surrogates(value: Any) -> Any:
    if isinstance(value, str):
        return without_lone_surrogates(value)
    if isinstance(value, list):
        return [_no_lone_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {_no_lone_surrogates(k): _no_lone_surrogates(v) for k, v in value.items()}
    return value


def _checked(payload: Any, url: str) -> Any:
    """The payload, unless it is an error object sent inside a 200 answer."""
    if not isinstance(payload, dict):
        raise ServerError("malformed", f"{url}: expected a JSON object, got {type(payload).__name__}")
    if "error" in payload and "choices" not in payload:
        raise ServerError("server", f"the server reported an error mid-reply: {error_message(payload)}")
    return payload


def error_message(payload: Any) -> str:
    """The human part of an OpenAI-style ``{"error": {"message": ...}}`` body (or FastAPI's
    ``{"detail": ...}``, whose list of problems is joined by their messages)."""
    if isinstance(payload, dict) and "error" not in payload and "detail" in payload:  # FastAPI-style bodies
        detail = payload["detail"]
        if isinstance(detail, list):
            return "; ".join(str(d.get("msg", d)) if isinstance(d, dict) else str(d) for d in detail)
        return str(detail)
    err = payload.get("error", payload) if isinstance(payload, dict) else payload
    if isinstance(err, dict):
        return str(err.get("message") or err.get("msg") or err)
    return str(err)


_TAG = re.compile(r"<(script|style)\b.*?</\1\s*>|<!--.*?-->|<[^>]*>", re.S | re.I)


def one_line(text: str, limit: int = 200) -> str:
    """A server's text for a one-line message: an HTML page's tags, scripts and comments dropped,
    white space run together, at most ``limit`` characters."""
    if text.lstrip().startswith("<"):
        text = _TAG.sub(" ", text)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "…"


def http_error(status: int, url: str, raw: bytes, spec: ServerSpec) -> ServerError:
    """The error for an HTTP status >= 400, with the server's own message on one line."""
    text = raw.decode("utf-8", "replace").strip()
    try:
        detail = one_line(error_message(json.loads(text)))
    except (ValueError, RecursionError):
        detail = one_line(text)
    said = f" (the server says: {detail})" if detail else ""
    if status in (401, 403):
        fix = (f"check the key in ${spec.api_key_env}" if spec.api_key_env else
               "the server wants an API key: put it in an environment variable and name it with "
               "--api-key-env, or api_key_env in the profile (e.g. api_key_env = \"OPENAI_API_KEY\")")
        return ServerError("auth", f"{url}: {status} {'unauthorized' if status == 401 else 'forbidden'}: {fix}{said}",
                           status)
    if status == 404:
        return ServerError("not_found", f"{url}: 404 not found: check the url (the server's root, e.g. "
                                        f"http://127.0.0.1:8080) and the model name{said}", status)
    return ServerError("http", f"{url}: HTTP {status}{said}", status)
