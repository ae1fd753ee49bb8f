"""HTTP to an OpenAI-compatible server with the standard library: JSON GETs and
the server-sent-event stream of ``POST /v1/chat/completions`` (read by :mod:`engine.remote.sse`).

Every failure becomes a :class:`~engine.remote.server_errors.ServerError` whose message says
what happened and what to check.

Cancelling: while a stream is read, a watcher thread polls the ``cancel``
event and shuts the socket down, so Esc stops a reply even while the server is
silent (a blocked read cannot otherwise be interrupted).
"""
from __future__ import annotations

import errno
import http.client
import json
import os
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from functools import partial
from typing import Any
from urllib.parse import quote, urlsplit

from engine.config.server import ServerSpec
from engine.errors import EngineError
from engine.remote.server_errors import ServerError, http_error, retry_after
from engine.remote.sse import (
    LINE_TIMEOUTS, MAX_EVENT_BYTES, checked, parse_json, read_events, says_finished,
)
from engine.text_safety import inert

CONNECT_TIMEOUT_S = 10.0
CANCEL_POLL_S = 0.05
FINISHED_GRACE_S = 2.0
"""How long a stream may stay silent after a choice's ``finish_reason`` (its usage chunk and
``[DONE]`` may follow) before the reply is taken as whole: a server that held the connection
open after finishing had the reply marked failed when the 120 s timeout ran out."""
USER_AGENT = "specchat"


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
                if watch.cancel.is_set():  # Esc while connecting, too late for the connect to see it
                    raise _Cancelled("stopped before the request was sent")
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
            raise http_error(resp.status, url, raw, self.spec, retry_after(resp.getheader("Retry-After")))
        coding = (resp.getheader("Content-Encoding") or "").strip().lower()
        if coding not in ("", "identity"):  # asked for nothing else: it read as a stream closed early
            conn.close()
            raise ServerError("malformed", f"{url}: the server sent its answer compressed ({inert(coding[:40])}), "
                                           "which specchat did not ask for and cannot read; a proxy in between may "
                                           "be compressing it: turn that off for this address")
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
            raw = _read_capped(resp, url, limit, cancel, watch)
        except ServerError:
            if cancel.is_set():
                raise ServerError("cut", f"{url}: stopped") from None
            if watch.timed_out:  # the watch shut the socket while the answer's head was dripped
                raise _unended(url, limit) from None
            raise
        finally:
            watch.done.set()
            if resp is not None:
                resp.close()
            conn.close()
        if raw is None:
            raise ServerError("cut", f"{url}: stopped")
        return raw.decode("utf-8", "replace"), resp.getheader("Content-Type", "")

    def get_json(self, path: str, timeout: float | None = None, cancel: threading.Event | None = None) -> Any:
        text, _ = self.get(path, timeout, cancel)
        return parse_json(text, self.spec.root + path, self.spec.hide_secrets)

    def post_json(self, path: str, body: dict[str, Any], cancel: threading.Event | None = None) -> Any:
        """``POST path`` without streaming; the parsed JSON answer."""
        parts = list(self.stream(path, body, cancel))
        if not parts:
            raise ServerError("cut", f"{self.spec.root + path}: empty answer")
        return parts[-1]

    def _payload(self, text: str, url: str) -> Any:
        """One JSON payload of an answer, an error object in it raised, the server's words quoted with
        their secrets hidden (:meth:`~engine.config.server.ServerSpec.hide_secrets`)."""
        return checked(parse_json(text, url, self.spec.hide_secrets), url, self.spec.hide_secrets)

    def stream(self, path: str, body: dict[str, Any], cancel: threading.Event | None = None) -> Iterator[Any]:
        """``POST path`` and yield each JSON payload of the event stream until ``[DONE]``.

        A plain JSON answer (a server that does not stream) is yielded whole.
        Returns quietly when ``cancel`` is set; raises :class:`ServerError` when
        the stream stops early, times out, carries malformed JSON or an error.
        """
        url = self.spec.root + path
        cancel = cancel or threading.Event()
        if cancel.is_set():  # Esc came first (during the metrics read before a reply): nothing is sent
            return
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
                raw = _read_capped(resp, url, self.spec.timeout, cancel, watch)
                if raw is not None:
                    yield self._payload(raw.decode("utf-8", "replace"), url)
                return
            finished = threading.Event()
            try:
                for payload in read_events(resp, url, self.spec.timeout, cancel, watch, finished=finished,
                                           grace_s=FINISHED_GRACE_S):
                    if cancel.is_set():  # the rest of an event cut by Esc is no error
                        return
                    if payload.strip() == "[DONE]":
                        return
                    chunk = self._payload(payload, url)
                    if not finished.is_set() and says_finished(chunk):
                        finished.set()
                        if watch.sock is not None:  # the response's socket, whoever holds it now
                            watch.sock.settimeout(FINISHED_GRACE_S)
                    yield chunk
            except ServerError as exc:
                if finished.is_set() and exc.kind in ("timeout", "cut"):  # silent or closed after the reply's end
                    return
                raise
            if not cancel.is_set() and not finished.is_set():  # a reply that gave its finish_reason is whole without [DONE]
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
    last: OSError | None = None
    for family, kind, proto, _, addr in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
        # each address its own timeout, as create_connection gives it (a dropped IPv6 one left none)
        deadline = time.monotonic() + (timeout if timeout is not None else CONNECT_TIMEOUT_S)
        if cancel.is_set():
            raise _Cancelled("stopped before connecting")
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


def _read_capped(resp: http.client.HTTPResponse, url: str, timeout: float, cancel: threading.Event,
                 watch: _Watch) -> bytes | None:
    """A whole (not streamed) answer's bytes, at most :data:`MAX_EVENT_BYTES`, read under ``watch``'s
    deadline; None when Esc (``cancel``) ended the read."""
    try:
        raw = resp.read(MAX_EVENT_BYTES + 1)
    except (socket.timeout, TimeoutError):
        raise ServerError("timeout", f"{url}: the answer stopped for {timeout:g} s (timeout)") from None
    except (OSError, http.client.HTTPException) as exc:
        if cancel.is_set():
            return None
        if watch.timed_out:
            raise _unended(url, timeout) from None
        raise ServerError("cut", f"{url}: the answer was cut off ({type(exc).__name__})") from None
    if cancel.is_set():
        return None
    if watch.timed_out:
        raise _unended(url, timeout)
    if len(raw) > MAX_EVENT_BYTES:
        raise ServerError("malformed", f"{url}: the answer is over {MAX_EVENT_BYTES // 2**20} MiB; "
                                       "specchat stopped reading it")
    return raw


def _unended(url: str, timeout: float) -> ServerError:
    return ServerError("timeout", f"{url}: the answer did not end within {LINE_TIMEOUTS * timeout:g} s (timeout)")
