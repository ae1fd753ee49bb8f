"""Helpers for the history tests: file modes, a lock held by another connection."""
from __future__ import annotations

import sqlite3
import stat
import threading
import time
from pathlib import Path



def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def hold_lock(path: Path, seconds: float, *, exclusive: bool = True) -> tuple[threading.Thread, threading.Event]:
    """A second connection, in a thread, holding a write (or exclusive) lock for ``seconds``."""
    taken = threading.Event()

    def run() -> None:
        conn = sqlite3.connect(path, isolation_level=None)
        if exclusive:
            conn.execute("PRAGMA journal_mode = DELETE")
        conn.execute("BEGIN EXCLUSIVE" if exclusive else "BEGIN IMMEDIATE")
        taken.set()
        time.sleep(seconds)
        conn.execute("ROLLBACK")
        conn.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert taken.wait(5)
    return thread, taken
