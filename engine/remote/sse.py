"""The server-sent events of a streamed reply: its lines, its events, and their JSON.

A line ends at CRLF, LF or a bare CR, as the event-stream format allows; an event is its
``data:`` lines joined, ended by a blank line; an event the stream cut off is whole only if it
still reads as one. Each event is at most :data:`MAX_EVENT_BYTES`, and a line must end within
:data:`LINE_TIMEOUTS` timeouts.
"""
from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from engine.remote.server_errors import ServerError, error_message
from engine.text_safety import without_lone_surrogates

MAX_EVENT_BYTES = 8 * 2**20
"""The most one server-sent event (or a plain answer) may hold: a reply's event carries a few
tokens, and a line that never ended grew to gigabytes in memory (a hostile server)."""
LINE_TIMEOUTS = 2
"""A line of the stream must end within this many ``timeout``s (a server dripping a byte a second
never lets the socket's own timeout fire)."""
READ_BYTES = 65536


class Deadline(Protocol):
    """What shuts the socket when a line takes too long (the client's watch thread)."""

    deadline: float | None
    timed_out: bool


class Lines:
    """The answer's lines, each returned with a ``\n`` however it ended (CRLF, LF or a bare CR:
    ``resp.readline`` knows LF alone, and a stream of CR-ended lines read as one endless line).
    A CR at the end of what has arrived ends its line at once; an LF that then follows is
    dropped, so CRLF split between two reads is one line end."""

    def __init__(self, resp: http.client.HTTPResponse) -> None:
        self._resp = resp
        self._buf = b""
        self._skip_lf = False
        self._eof = False

    def readline(self, limit: int) -> bytes:
        """The next line (``b""`` at the end of the answer); past ``limit`` bytes without an end,
        what has arrived (its caller refuses it)."""
        while True:
            if self._skip_lf and self._buf:
                self._skip_lf = False
                if self._buf.startswith(b"\n"):
                    self._buf = self._buf[1:]
            ends = [i for i in (self._buf.find(b"\r"), self._buf.find(b"\n")) if i >= 0]
            if ends:
                at = min(ends)
                line, rest = self._buf[:at], self._buf[at + 1:]
                if self._buf[at:at + 1] == b"\r":
                    if rest.startswith(b"\n"):
                        rest = rest[1:]
                    elif not rest:
                        self._skip_lf = True  # its LF may be in the next read
                self._buf = rest
                return line + b"\n"
            if len(self._buf) > limit or self._eof:
                line, self._buf = self._buf, b""
                return line
            chunk = self._resp.read1(READ_BYTES)
            if not chunk:
                self._eof = True
            self._buf += chunk


def says_finished(payload: dict[str, Any]) -> bool:
    """Whether a chunk carries a choice's ``finish_reason``: the reply is whole even if the server
    then closes the stream without ``[DONE]``."""
    choices = payload.get("choices")
    return isinstance(choices, list) and any(isinstance(c, dict) and c.get("finish_reason") for c in choices)


def read_events(resp: http.client.HTTPResponse, url: str, timeout: float, cancel: threading.Event,
                watch: Deadline | None = None, *, finished: threading.Event | None = None,
                grace_s: float = 0.0) -> Iterator[str]:
    """The ``data`` of each server-sent event (several ``data:`` lines joined by newlines).
    Keep-alive comments alone for ``timeout`` seconds are a timeout, as silence is (they would
    keep the socket's own timeout from ever firing), and so is a line that takes longer than
    twice that to end (``watch`` shuts the socket at its deadline: twice, so that silence is
    always the socket's own timeout, said as such). Once ``finished`` is set (the reply gave its
    ``finish_reason``), ``grace_s`` takes the place of ``timeout``: comments after the reply's end
    kept a whole reply waiting out the full timeout. An event is at most :data:`MAX_EVENT_BYTES`;
    returns at once when ``cancel`` is set."""
    data: list[str] = []
    size = 0
    last_data = time.monotonic()
    lines = Lines(resp)
    while not cancel.is_set():
        if finished is not None and finished.is_set():
            timeout = min(timeout, grace_s)
        if watch is not None:
            watch.deadline = time.monotonic() + LINE_TIMEOUTS * timeout
        failed: BaseException | None = None
        try:
            line = lines.readline(MAX_EVENT_BYTES + 1)
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
            if data and whole_event("\n".join(data)):
                yield "\n".join(data)
            elif data:
                raise ServerError("cut", f"{url}: the stream stopped in the middle of an event (the connection "
                                         "closed); the reply so far is kept")
            return
        text = line.decode("utf-8", "replace").rstrip("\n")
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


def whole_event(data: str) -> bool:
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


def parse_json(text: str, url: str, hide: Callable[[str], str] = str) -> Any:
    """``text`` parsed, with each lone surrogate (JSON's ``\\ud800`` alone: no character, and
    nothing UTF-8 can write to a terminal or a database) as U+FFFD; malformed, an error quoting
    its start through ``hide`` (:meth:`~engine.config.server.ServerSpec.hide_secrets`)."""
    try:
        value = json.loads(text)
        return _no_lone_surrogates(value) if "\\ud" in text.lower() else value
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
        snippet = hide(text.strip()).replace("\n", " ")[:120]
        raise ServerError("malformed", f"{url}: the server sent malformed JSON: {snippet!r}") from None


def _no_lone_surrogates(value: Any) -> Any:
    if isinstance(value, str):
        return without_lone_surrogates(value)
    if isinstance(value, list):
        return [_no_lone_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {_no_lone_surrogates(k): _no_lone_surrogates(v) for k, v in value.items()}
    return value


def checked(payload: Any, url: str, hide: Callable[[str], str] = str) -> Any:
    """The payload, unless it is an error object sent inside a 200 answer (whose words are quoted
    through ``hide``: :meth:`~engine.config.server.ServerSpec.hide_secrets`)."""
    if not isinstance(payload, dict):
        raise ServerError("malformed", f"{url}: expected a JSON object, got {type(payload).__name__}")
    if "error" in payload and "choices" not in payload:
        raise ServerError("server", f"the server reported an error mid-reply: {hide(error_message(payload))}")
    return payload
