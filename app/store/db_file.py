"""The history file itself: opened private, checked, configured, confirmed damaged, set aside.

What :class:`app.store.history.History` does with a file before and beside its rows: every
function here works on a path or a fresh connection and knows nothing of chats.
"""
from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from app.store.paths import ensure_private_dir
from app.store.records import decoded
from app.store.schema import SCHEMA_VERSION, check_ours, is_corruption_error, migrate

SIDE_FILES = ("-wal", "-shm", "-journal")


def private_file(path: Path) -> None:
    """Create ``path`` if missing, readable by its owner only (0600)."""
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    os.close(fd)


def first_line(error: BaseException, limit: int = 120) -> str:
    """An error's first line, cut to ``limit`` characters (an integrity check's report runs on)."""
    line = (str(error).splitlines() or [""])[0]
    return line if len(line) <= limit else line[: limit - 1] + "…"


def connect(path: Path, timeout: float) -> sqlite3.Connection:
    """A checked, configured and upgraded connection to ``path`` (created private if missing),
    waiting ``timeout`` s for another program's lock; raises on locks and damage."""
    ensure_private_dir(path.parent)
    private_file(path)
    conn = sqlite3.connect(path, timeout=timeout, check_same_thread=False)
    try:
        prepare(conn)
    except BaseException:
        conn.close()
        raise
    restrict_files(path)
    return conn


def contains_folded(haystack: object, folded: str) -> bool:
    """SQL ``contains_folded(CAST(text AS BLOB), needle)``: whether ``text`` holds ``needle``, already
    case-folded, ignoring case in any script (``str.casefold``: "STRASSE" holds "straße"). The text
    comes as bytes, read as the history reads them (:func:`~app.store.records.decoded`): as text, one
    message that was not UTF-8 failed every search."""
    if isinstance(haystack, bytes):
        haystack = decoded(haystack)
    return isinstance(haystack, str) and folded in haystack.casefold()


def add_functions(conn: sqlite3.Connection) -> None:
    """The SQL functions the history's queries use, on a connection of its own."""
    conn.create_function("contains_folded", 2, contains_folded, deterministic=True)


def open_read_only(path: Path, timeout: float) -> sqlite3.Connection | None:
    """``path`` opened to read only, if it is a current specchat history that can be read (None:
    not a file, unreadable, or of another schema version). A WAL file in a folder that cannot be
    written opens read-only only while its side files exist; else it is read as immutable (nothing
    can write it there, this app included)."""
    if not path.is_file():
        return None
    for query in ("mode=ro", "mode=ro&immutable=1"):
        try:
            conn = sqlite3.connect(f"{path.resolve().as_uri()}?{query}", uri=True, timeout=timeout,
                                   check_same_thread=False)
        except sqlite3.Error:
            continue
        try:
            current = int(conn.execute("PRAGMA user_version").fetchone()[0]) == SCHEMA_VERSION
            conn.execute("SELECT count(*) FROM chats").fetchone()
        except sqlite3.Error:
            conn.close()
            continue
        if current:
            return conn
        conn.close()
        return None
    return None


def prepare(conn: sqlite3.Connection) -> None:
    """Check, configure and upgrade an open connection (raises on locks and damage)."""
    conn.execute("PRAGMA foreign_keys = ON")
    row = conn.execute("PRAGMA quick_check").fetchone()
    if row is None or row[0] != "ok":
        raise sqlite3.DatabaseError(f"integrity check failed: {row[0] if row else '?'}")
    check_ours(conn)  # before anything is written to it
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    migrate(conn)
    # Force a read now, so a locked file is caught here.
    conn.execute("SELECT count(*) FROM chats").fetchone()


def restrict_files(path: Path) -> None:
    """The history file and its side files readable by their owner only, once the file is known
    to be specchat's (another program's is left as it was, its mode too)."""
    os.chmod(path, 0o600)
    for suffix in SIDE_FILES:
        side = Path(f"{path}{suffix}")
        if side.exists():
            os.chmod(side, 0o600)


def confirm_corrupt(path: Path, timeout: float) -> bool:
    """``PRAGMA integrity_check`` on a fresh connection: True unless it says "ok"."""
    try:
        conn = sqlite3.connect(path, timeout=timeout)
    except sqlite3.Error:
        return False
    try:
        rows = conn.execute("PRAGMA integrity_check").fetchall()
        return [r[0] for r in rows] != ["ok"]
    except sqlite3.Error as exc:
        return is_corruption_error(exc)
    finally:
        conn.close()


def set_aside(path: Path) -> Path:
    """Rename ``path`` (and its -wal/-shm files) to ``<name>.corrupt-<timestamp>``."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while target.exists():
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
        n += 1
    if path.exists():
        os.replace(path, target)
    for suffix in SIDE_FILES:
        side = Path(f"{path}{suffix}")
        if side.exists():
            os.replace(side, Path(f"{target}{suffix}"))
    return target
