"""The app in a real terminal: a tmux session on a private socket, its keys and its screen.

Shared by the tty tests (tests/app/ui/test_smoke_tty.py, test_first_start_tty.py). Every
session runs on its own socket (``tmux -S``, ``-f /dev/null``), never the user's server.
The app draws on its stderr: a command started here must leave stderr on the terminal.
"""
from __future__ import annotations

import re
import sqlite3
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path


class Tmux:
    """One tmux session (``session``) on the server at ``socket``."""

    def __init__(self, session: str, socket: Path) -> None:
        self.session = session
        self.socket = socket

    @classmethod
    def start(cls, socket: Path, session: str, command: str, *, width: int, height: int, cwd: Path,
              env: Mapping[str, str]) -> "Tmux":
        """A new detached session of ``width`` x ``height`` running ``command`` (a shell line)."""
        subprocess.run(["tmux", "-S", str(socket), "-f", "/dev/null", "new-session", "-d", "-s", session,
                        "-x", str(width), "-y", str(height), command], check=True, cwd=cwd, env=dict(env))
        return cls(session, socket)

    def kill_server(self) -> None:
        """End the server on this socket, and every session on it (nothing if it is gone)."""
        subprocess.run(["tmux", "-S", str(self.socket), "kill-server"], capture_output=True)

    def run(self, *args: str) -> str:
        return subprocess.run(["tmux", "-S", str(self.socket), *args], check=True,
                              capture_output=True, text=True).stdout

    def keys(self, *keys: str) -> None:
        """Send keys, then pause like a person would (a burst can arrive as one paste)."""
        self.run("send-keys", "-t", self.session, *keys)
        time.sleep(0.3)

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", self.session)

    def wait_for(self, text: str, timeout: float = 15.0, regex: bool = False) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            screen = self.screen()
            if (re.search(text, screen) if regex else text in screen):
                return screen
            time.sleep(0.1)
        raise AssertionError(f"{text!r} never appeared; screen:\n{self.screen()}")

    def wait_gone(self, text: str, timeout: float = 15.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            screen = self.screen()
            if text not in screen:
                return screen
            time.sleep(0.1)
        raise AssertionError(f"{text!r} never went; screen:\n{self.screen()}")


def saved_messages(data_dir: Path) -> list[tuple[str, str, str | None]]:
    """(role, content, finish_reason) of every message in the app's history, in order."""
    return [(role, content, finish) for _, role, content, finish in saved_rows(data_dir)]


def saved_rows(data_dir: Path) -> list[tuple[int, str, str, str | None]]:
    """(chat_id, role, content, finish_reason) of every message in ``data_dir``'s history.db,
    in order; none while the app has not created the file or its tables."""
    path = data_dir / "history.db"
    if not path.exists():
        return []
    conn = sqlite3.connect(path, timeout=5)
    try:
        return conn.execute("SELECT chat_id, role, content, finish_reason FROM messages ORDER BY id").fetchall()
    except sqlite3.OperationalError:  # the app has not created the tables yet
        return []
    finally:
        conn.close()
