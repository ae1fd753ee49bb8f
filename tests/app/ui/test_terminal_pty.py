"""The real app on a real pseudo-terminal against a hostile server: every byte the app writes
is captured, and none of the server's escape sequences (nor a pasted one) is among them.

A pty (not tmux) so the test reads exactly what Textual's driver wrote, not a terminal's
interpretation of it. Uses the loopback fake server: no weights needed.
"""
from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from tests.fake_server import FakeServer, llama_routes, props_route, reply_stream, start_sse, write_events
from engine.text_safety import inert
from tests.hostile import HOSTILE

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="needs a pty")
MARKED = [f"{name}={seq}" for name, seq in HOSTILE.items()]
"""One piece per sequence, after its marker (not ``<name>``: Markdown drops what looks like an
HTML tag): the raw form must never be written, the inert one must."""


class Pty:
    """A child process on a pseudo-terminal; ``out`` collects every byte it writes."""

    def __init__(self, argv: list[str], env: dict[str, str], size: tuple[int, int] = (140, 50)) -> None:
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", size[1], size[0], 0, 0))
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=ROOT,
                                     start_new_session=True)
        os.close(slave)
        self.out = b""

    def read(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.master], [], [], 0.05)
            if ready:
                try:
                    self.out += os.read(self.master, 65536)
                except OSError:
                    return

    def wait_for(self, text: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while text.encode() not in self.out:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError(f"{text!r} never written; tail: {self.out[-3000:]!r}")
            self.read(0.1)

    def send(self, data: str) -> None:
        os.write(self.master, data.encode())
        self.read(0.3)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        os.close(self.master)


def test_nothing_hostile_reaches_the_real_terminal(tmp_path: Path) -> None:
    def chat(req, body):  # type: ignore[no-untyped-def]
        start_sse(req)
        write_events(req, reply_stream(["Hi\n\n", *[m + "\n\n" for m in MARKED], "END-OF-REPLY"]))

    routes = llama_routes(chat)
    routes["/props"] = props_route(build="b1" + MARKED[2])
    env = {**os.environ, "TERM": "xterm-256color", "PYTHONPATH": str(ROOT), "LANG": "C.UTF-8",
           "SPECCHAT_DATA_DIR": str(tmp_path / "data"), "SPECCHAT_CONFIG_DIR": str(tmp_path / "config"),
           "SPECCHAT_STATE_DIR": str(tmp_path / "state"), "SPECCHAT_CACHE_DIR": str(tmp_path / "cache")}
    with FakeServer(routes) as fake:
        term = Pty([sys.executable, "-m", "app.cli", "--server", fake.url], env)
        try:
            term.wait_for("server ready")
            term.send("\x1b[200~pasted" + HOSTILE["osc52-clipboard"] + "-after\x1b[201~")
            term.wait_for("-after")
            term.send("\r")  # send the pasted prompt
            term.wait_for("END-OF-REPLY")
            term.read(1.0)
        finally:
            term.close()
    written = term.out.decode("utf-8", "replace")
    for marked in MARKED:
        assert marked not in written  # the sequence as the server sent it, never written
    for name, seq in HOSTILE.items():
        assert f"{name}={inert(seq[0])}" in written, name  # shown, as visible characters
    assert "pasted\x1b]52" not in written and "pasted␛]52;c;cm0gLXJmIH4=␇-after" in written
