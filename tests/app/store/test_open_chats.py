"""Which chat another window shows: a lock per shown chat, let go of when the window ends however it ends."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from app.store.open_chats import FOLDER, OpenChats


def test_a_chat_one_window_shows_is_shown_elsewhere_for_the_other(tmp_path: Path) -> None:
    db = tmp_path / "history.db"
    a, b = OpenChats(db), OpenChats(db)
    assert a.show(5) and a.shown == 5
    assert b.elsewhere(5) and not a.elsewhere(5)  # a window's own chat is not "elsewhere"
    assert not b.elsewhere(6)
    assert not b.show(5) and b.shown is None  # both show it now; the caller says so
    assert a.show(6) and not b.elsewhere(5) and b.elsewhere(6)  # a moved on: 5 is free
    assert b.show(5) and a.elsewhere(5)
    a.show(None)  # a new, unsaved chat: nothing held
    assert not b.elsewhere(6)
    b.release()
    assert not a.elsewhere(5)
    assert (tmp_path / FOLDER / "5.lock").exists()


def test_nothing_is_locked_without_a_history_file() -> None:
    a, b = OpenChats(None), OpenChats(None)
    assert a.show(1) and b.show(1) and not b.elsewhere(1)


def test_a_window_that_is_killed_lets_go_of_its_chat(tmp_path: Path) -> None:
    db = tmp_path / "history.db"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from app.store.open_chats import OpenChats;"
         f" o = OpenChats(Path({str(db)!r})); assert o.show(7); print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[3])
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        mine = OpenChats(db)
        assert mine.elsewhere(7) and not mine.show(7)
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
        deadline = time.monotonic() + 5
        while mine.elsewhere(7) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not mine.elsewhere(7) and mine.show(7)
    finally:
        holder.kill()
        holder.wait()
