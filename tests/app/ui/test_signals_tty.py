"""SIGTERM and SIGHUP in a real terminal (a pty): the app saves and gives the terminal back.

The app runs on the fake backend with its stdin, stdout and stderr on one pty (Textual
draws on stderr); everything it writes is read from the pty's other end.
"""
from __future__ import annotations

import os
import pty
import select
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
RESTORED = {"leaves the alternate screen": b"\x1b[?1049l", "shows the cursor": b"\x1b[?25h",
            "mouse reporting off": b"\x1b[?1000l"}


class PtyApp:
    def __init__(self, tmp_path: Path) -> None:
        self.data = tmp_path / "data"
        env = {**os.environ, "TERM": "xterm-256color", "SPECCHAT_DATA_DIR": str(self.data),
               "SPECCHAT_STATE_DIR": str(tmp_path / "state"), "SPECCHAT_CONFIG_DIR": str(tmp_path / "config"),
               "SPECCHAT_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT),
               "COLUMNS": "120", "LINES": "36"}
        self.master, slave = pty.openpty()
        os.set_blocking(self.master, False)
        import fcntl
        import struct
        import termios
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 36, 120, 0, 0))
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.app.tty_app"], cwd=ROOT, env=env,
                                     stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
        os.close(slave)
        self.out = b""

    def read(self, timeout: float) -> None:
        ready, _, _ = select.select([self.master], [], [], timeout)
        if ready:
            try:
                self.out += os.read(self.master, 1 << 16)
            except OSError:  # EIO: the app closed its end
                time.sleep(timeout)

    def wait_for(self, what: bytes, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while what not in self.out:
            if time.monotonic() > deadline:
                raise AssertionError(f"{what!r} never came; last output: {self.out[-400:]!r}")
            self.read(0.1)

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def wait_exit(self, timeout: float = 20.0) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self.read(0.05)
        self.read(0.2)
        code = self.proc.poll()
        assert code is not None, "the app did not exit"
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.master)


def _rows(db: Path) -> list[tuple[str, str]]:
    if not db.exists():
        return []
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT role, content FROM messages ORDER BY id").fetchall()
    finally:
        conn.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_saves_the_chat_and_restores_the_terminal(tmp_path: Path, sig: signal.Signals) -> None:
    app = PtyApp(tmp_path)
    try:
        app.wait_for(b"fake:0")
        app.type("hello from the pty\r")
        db = app.data / "history.db"
        deadline = time.monotonic() + 20
        while not any(role == "assistant" and text for role, text in _rows(db)):
            assert time.monotonic() < deadline, "the reply was never saved"
            app.read(0.1)
        before = len(app.out)
        app.proc.send_signal(sig)
        code = app.wait_exit()
        after = app.out[before:]
    finally:
        app.close()
    assert code == 128 + sig  # it exited through the app, not Python's default (which is -sig)
    for what, sequence in RESTORED.items():
        assert sequence in after, f"the terminal was not restored: the app never {what}"
    rows = _rows(db)
    assert rows[0] == ("user", "hello from the pty") and rows[1][0] == "assistant" and rows[1][1]


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_closing_the_terminal_mid_reply_ends_the_app_and_keeps_the_reply(tmp_path: Path) -> None:
    """A terminal closed under a streaming reply (tmux killed, an SSH link dropped): the kernel
    hangs the terminal up (SIGHUP, then SIGCONT) and every write fails. The app used to stay
    behind for good, its main thread waiting on Textual's output queue, its engine loaded."""
    from tests.app.tmux import Tmux, saved_messages

    env = {**os.environ, "TERM": "xterm-256color", "SPECCHAT_DATA_DIR": str(tmp_path / "data"),
           "SPECCHAT_STATE_DIR": str(tmp_path / "state"), "SPECCHAT_CONFIG_DIR": str(tmp_path / "config"),
           "PYTHONPATH": str(ROOT), "TTY_APP_LONG": "1"}
    tmux = Tmux.start(tmp_path / "tmux.sock", "hangup", f"{sys.executable} -m tests.app.tty_app",
                      width=120, height=36, cwd=ROOT, env=env)
    try:
        tmux.wait_for("fake:0")
        pid = int(tmux.run("display", "-p", "-t", tmux.session, "#{pane_pid}").strip())
        tmux.keys("-l", "tell me a long story")
        tmux.keys("Enter")
        tmux.wait_for("word40")  # streaming, the screen changing all the time
    finally:
        tmux.kill_server()
    from app.ui.archive import SAVE_FLUSH_AT_EXIT_S
    from app.ui.quitting import EXIT_ANYWAY_S

    deadline = time.monotonic() + SAVE_FLUSH_AT_EXIT_S + EXIT_ANYWAY_S + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        os.kill(pid, signal.SIGKILL)
        raise AssertionError("the app outlived its terminal")
    rows = saved_messages(tmp_path / "data")
    assert [role for role, _, _ in rows] == ["user", "assistant"]
    assert rows[1][1].startswith("word0 word1") and "word40" in rows[1][1]  # what was on screen is kept


def test_a_signal_while_another_program_locks_the_history_exports_says_where_and_keeps_the_unsent_text(
        tmp_path: Path) -> None:
    """With the history locked, SIGTERM waited out the saver's full wait and the lock's, was ended by the
    last resort at 14 s, and so never exported the reply, said where, nor kept the unsent text (a hostile
    tester's). Now the reply the history could not take is exported once the saver had its wait."""
    import json

    from app.ui.archive import SAVE_FLUSH_AT_EXIT_S
    from app.ui.quitting import EXIT_ANYWAY_S

    app = PtyApp(tmp_path)
    lock = None
    try:
        app.wait_for(b"fake:0")
        db = app.data / "history.db"
        lock = sqlite3.connect(db, timeout=0)
        lock.execute("BEGIN EXCLUSIVE")
        app.type("hello under a lock\r")
        app.wait_for(b"Hello")
        app.type("typed, not sent")
        app.wait_for(b"typed, not sent")
        before = len(app.out)
        app.proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        code = app.wait_exit(timeout=30)
        took = time.monotonic() - started
        after = app.out[before:]
    finally:
        if lock is not None:
            lock.rollback()
            lock.close()
        app.close()
    assert code == 128 + signal.SIGTERM
    assert took < SAVE_FLUSH_AT_EXIT_S + EXIT_ANYWAY_S, f"the exit took {took:.1f} s: the last resort ended it"
    for what, sequence in RESTORED.items():
        assert sequence in after, f"the terminal was not restored: the app never {what}"
    assert b"they were exported to" in after
    (exported,) = (app.data / "exports").glob("unsaved-chat-*.md")
    assert "hello under a lock" in exported.read_text() and "Hello" in exported.read_text()
    state = json.loads((tmp_path / "state" / "state.json").read_text())
    assert "typed, not sent" in json.dumps(state)
