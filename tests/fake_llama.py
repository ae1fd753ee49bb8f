"""A stand-in for llama.cpp's ``llama-server``: ``/health``, ``/completion`` (streamed or not), ``/tokenize``.

It replays one ``/completion`` reply (the server-sent JSON objects of a streamed reply, the last
one with ``stop: true`` and ``timings``, and every generated id), recorded from the real server or
made by :func:`synthetic`, cut to the request's ``n_predict`` and with ``timings.prompt_n`` set to
the prompt it was sent. Every request body is logged in ``requests``.

Run as a script (``python fake_llama.py -m FILE --port N ...``) it is a fake ``llama-server``
executable: a model file starting with ``CRASH`` makes it exit 1 with an error on stdout, as
llama-server does with a bad model.
"""
from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

RECORDED = Path(__file__).parent / "data" / "llama_server_stream.json"
Reply = dict[str, Any]  # {"chunks": [streamed JSON objects], "tokens": [every generated id]}


def load_recorded() -> Reply:
    """One real llama-server reply, streamed, plus its ids from the same request not streamed
    (recorded by tests/data/record_llama_server.py)."""
    return dict(json.loads(RECORDED.read_text()))


def synthetic(tokens: list[int], prompt_n: int = 3, draft: tuple[int, int] | None = None,
              held_back: tuple[int, ...] = (), per_second: float = 100.0) -> Reply:
    """A reply in llama-server's shapes for ``tokens``: one chunk per token, except the positions in
    ``held_back`` (llama-server sends no chunk for a token that ends inside a UTF-8 character; the
    next chunk's ``tokens_predicted`` jumps); ``draft`` = (draft_n, draft_n_accepted)."""
    chunks: list[dict[str, Any]] = []
    for i, tok in enumerate(tokens):
        if i in held_back:
            continue
        chunks.append({"index": 0, "content": f"<{tok}>", "tokens": [tok], "stop": False, "id_slot": 0,
                       "tokens_predicted": i + 1, "tokens_evaluated": prompt_n})
    n = len(tokens)
    timings: dict[str, Any] = {"cache_n": 0, "prompt_n": prompt_n, "prompt_ms": 5.0, "prompt_per_second": 600.0,
                               "predicted_n": n, "predicted_ms": 1000 * n / per_second, "predicted_per_second": per_second}
    if draft is not None:
        timings["draft_n"], timings["draft_n_accepted"] = draft
    chunks.append({"index": 0, "content": "", "tokens": [], "id_slot": 0, "stop": True, "model": "fake",
                   "tokens_predicted": n, "tokens_evaluated": prompt_n, "stop_type": "limit", "timings": timings})
    return {"chunks": chunks, "tokens": list(tokens)}


def replay(reply: Reply, prompt: Any, n_predict: int) -> tuple[list[dict[str, Any]], list[int]]:
    """The reply's chunks and ids cut to ``n_predict`` tokens, its timings fitted to ``prompt``."""
    total = int(reply["chunks"][-1]["tokens_predicted"])
    count = total if n_predict < 0 else min(n_predict, total)
    body = [dict(c) for c in reply["chunks"][:-1] if int(c["tokens_predicted"]) <= count]
    final = dict(reply["chunks"][-1])
    timings = dict(final.get("timings") or {})
    timings["prompt_n"] = len(prompt) if isinstance(prompt, list) else 1
    timings["predicted_n"] = count
    final["timings"], final["tokens_predicted"] = timings, count
    if count < total:
        final["stop_type"] = "limit"
    return [*body, final], list(reply["tokens"][:count])


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    server: "FakeLlamaServer"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _json(self, code: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._json(200, {"status": "ok"})
        else:
            self._json(404, {"error": {"message": "not found"}})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        self.server.requests.append((self.path, body))
        if self.path == "/tokenize":
            self._json(200, {"tokens": [len(w) for w in str(body.get("content", "")).split()]})
            return
        if self.path != "/completion":
            self._json(404, {"error": {"message": "not found"}})
            return
        if self.server.fail_with:
            self._json(500, {"error": {"message": self.server.fail_with}})
            return
        chunks, tokens = replay(self.server.reply, body.get("prompt"), int(body.get("n_predict", -1)))
        if not body.get("stream"):
            final = dict(chunks[-1])
            final["content"] = "".join(str(c.get("content", "")) for c in chunks)
            final["tokens"] = tokens if body.get("return_tokens") else []
            self._json(200, final)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for chunk in chunks:
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            self.wfile.flush()


class FakeLlamaServer(ThreadingHTTPServer):
    """The fake on a background thread; ``url`` to talk to it, ``close()`` to stop it."""

    daemon_threads = True

    def __init__(self, reply: Reply | None = None, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.reply = reply if reply is not None else load_recorded()
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.fail_with: str | None = None
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def close(self) -> None:
        self.shutdown()
        self.server_close()


def main(argv: list[str]) -> int:
    """The fake ``llama-server`` executable: ``-m FILE --port N`` (other options ignored)."""
    if "--version" in argv:
        print("version: 0 (fake)")
        return 0
    model = Path(argv[argv.index("-m") + 1])
    port = int(argv[argv.index("--port") + 1])
    print(f"fake llama-server: args {' '.join(argv)}", flush=True)
    if model.read_bytes().startswith(b"CRASH"):
        print(f"error: failed to load model '{model}'", flush=True)
        return 1
    server = FakeLlamaServer(synthetic(list(range(10, 42))), port=port)
    try:
        server._thread.join()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
