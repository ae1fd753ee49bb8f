"""A tiny OpenAI-compatible server on the loopback that plays recorded answers.

Each route maps a path to a handler ``(request, body) -> None`` that writes the
answer through the helpers below; every request is logged (path, JSON body,
headers) so tests can check what specchat sent. The default routes imitate
llama-server's shapes (chunks, final ``timings``), taken from its source.
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Handler = Callable[["_Request", Any], None]


class _Request(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    server: "_Server"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _dispatch(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        fake = self.server.fake
        with fake.lock:
            fake.requests.append((self.path, body, dict(self.headers)))
        route = fake.routes.get(self.path.split("?")[0])
        try:
            if route is None:
                send_json(self, 404, {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}})
            else:
                route(self, body)
        except (BrokenPipeError, ConnectionResetError):
            pass

    do_GET = _dispatch
    do_POST = _dispatch


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    fake: "FakeServer"


class FakeServer:
    """Start with ``with FakeServer() as fake:``; ``fake.url`` is its root."""

    def __init__(self, routes: dict[str, Handler] | None = None) -> None:
        self.routes: dict[str, Handler] = dict(routes or {})
        self.requests: list[tuple[str, Any, dict[str, str]]] = []
        self.lock = threading.Lock()
        self.httpd = _Server(("127.0.0.1", 0), _Request)
        self.httpd.fake = self
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def posts(self, path: str = "/v1/chat/completions") -> list[Any]:
        with self.lock:
            return [body for p, body, _ in self.requests if p == path]

    def __enter__(self) -> "FakeServer":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def send_json(req: _Request, status: int, obj: Any) -> None:
    data = json.dumps(obj).encode()
    req.send_response(status)
    req.send_header("Content-Type", "application/json")
    req.send_header("Content-Length", str(len(data)))
    req.end_headers()
    req.wfile.write(data)


def send_text(req: _Request, status: int, text: str, ctype: str = "text/plain; version=0.0.4") -> None:
    data = text.encode()
    req.send_response(status)
    req.send_header("Content-Type", ctype)
    req.send_header("Content-Length", str(len(data)))
    req.end_headers()
    req.wfile.write(data)


def start_sse(req: _Request) -> None:
    req.send_response(200)
    req.send_header("Content-Type", "text/event-stream")
    req.send_header("Cache-Control", "no-cache")
    req.end_headers()


def write_events(req: _Request, events: Iterable[Any], delay: float = 0.0) -> None:
    """Each event as ``data: JSON``; a str is written raw; a float sleeps that long."""
    for event in events:
        if isinstance(event, float):
            time.sleep(event)
            continue
        line = event if isinstance(event, str) else f"data: {json.dumps(event)}\n\n"
        req.wfile.write(line.encode())
        req.wfile.flush()
        if delay:
            time.sleep(delay)


def chunk(content: str | None = None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    """One ``chat.completion.chunk`` as llama-server writes it."""
    delta = {} if content is None else {"content": content}
    out: dict[str, Any] = {"choices": [{"finish_reason": finish, "index": 0, "delta": delta}],
                           "created": 1, "id": "chatcmpl-x", "model": "m", "object": "chat.completion.chunk"}
    out.update(extra)
    return out


def timings(predicted_n: int, rate: float, draft_n: int | None = None, accepted: int | None = None) -> dict[str, Any]:
    t: dict[str, Any] = {"cache_n": 0, "prompt_n": 20, "prompt_ms": 5.0, "prompt_per_token_ms": 0.25,
                         "prompt_per_second": 4000.0, "predicted_n": predicted_n,
                         "predicted_ms": 1000.0 * predicted_n / rate, "predicted_per_token_ms": 1000.0 / rate,
                         "predicted_per_second": rate}
    if draft_n:
        t["draft_n"], t["draft_n_accepted"] = draft_n, accepted or 0
    return t


def reply_stream(pieces: Sequence[str], final_timings: dict[str, Any] | None = None,
                 finish: str = "stop") -> list[Any]:
    """A whole llama-server stream: a role chunk, the pieces, the finish chunk, usage + timings, [DONE]."""
    events: list[Any] = [chunk(None, None, )]
    events[0]["choices"][0]["delta"] = {"role": "assistant", "content": None}
    events += [chunk(p) for p in pieces]
    events.append(chunk(None, finish))
    usage: dict[str, Any] = {"choices": [], "object": "chat.completion.chunk",
                             "usage": {"completion_tokens": len(pieces), "prompt_tokens": 20,
                                       "total_tokens": 20 + len(pieces)}}
    if final_timings is not None:
        usage["timings"] = final_timings
    events.append(usage)
    events.append("data: [DONE]\n\n")
    return events


def models_route(owned_by: str = "llamacpp", ids: Sequence[str] = ("pocket.gguf",)) -> Handler:
    def handle(req: _Request, body: Any) -> None:
        send_json(req, 200, {"object": "list", "data": [{"id": i, "object": "model", "owned_by": owned_by} for i in ids]})
    return handle


def props_route(build: str = "b1-test") -> Handler:
    def handle(req: _Request, body: Any) -> None:
        send_json(req, 200, {"default_generation_settings": {"n_ctx": 2048}, "build_info": build, "total_slots": 1})
    return handle


def llama_routes(chat: Handler) -> dict[str, Handler]:
    """A llama-server: models, props, and ``chat`` for the completions."""
    return {"/v1/models": models_route(), "/props": props_route(), "/v1/chat/completions": chat}
