"""What can still be read from a history file that was set aside as damaged.

:meth:`app.store.history.History.open` renames a confirmed corrupt ``history.db`` aside
and starts a new one. One bad page (a disk error, a copy cut short) then took every chat
out of the app, though most of them were still readable one by one (a tester's 200 chats
with one page overwritten: 194 readable). :func:`salvage` copies each chat that reads
whole, with all its messages, into the new file under its own id; a chat of which any
part fails to read is left out whole, never copied in part. The damaged file itself is
never written: the copy is read from a private temporary copy of it (its write-ahead log
included, which holds the newest rows), and the file stays where it was set aside for
whatever the user wants to try with other tools.
"""
from __future__ import annotations

import shutil
import sqlite3
import tempfile
from pathlib import Path

from app.store.records import decoded

__all__ = ["Salvaged", "salvage"]

_SIDE_FILES = ("-wal", "-journal")


class Salvaged:
    """How a salvage went: ``copied`` chats read whole, ``lost`` chats that could not be."""

    def __init__(self, copied: int = 0, lost: int = 0) -> None:
        self.copied = copied
        self.lost = lost

    def sentence(self) -> str:
        """One sentence for the history's notice."""
        if not self.copied and not self.lost:
            return "No chat could be read from it."
        if not self.lost:
            return f"All {self.copied} of its chats were read into the new one."
        return (f"{self.copied} of its {self.copied + self.lost} chats were read into the new one; "
                f"{self.lost} could not be read and are only in the damaged file.")


def salvage(damaged: Path, into: sqlite3.Connection) -> Salvaged:
    """Copy every chat of ``damaged`` that reads whole into ``into`` (a history of the current
    schema, with no chats yet). Never raises for the damaged file's sake: what cannot be read
    is counted as lost (or, if not even the chats' ids can be read, nothing is copied)."""
    with tempfile.TemporaryDirectory(prefix="specchat-salvage-") as folder:
        copy = Path(folder) / "history.db"
        try:
            shutil.copyfile(damaged, copy)
            for suffix in _SIDE_FILES:
                side = Path(f"{damaged}{suffix}")
                if side.exists():
                    shutil.copyfile(side, Path(f"{copy}{suffix}"))
            source = sqlite3.connect(copy)
        except (OSError, sqlite3.Error):
            return Salvaged()
        source.text_factory = decoded  # as the history reads text
        try:
            return _copy_chats(source, into)
        finally:
            source.close()


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]


def _chat_ids(source: sqlite3.Connection) -> list[int]:
    """Every chat id the damaged file still names: a scan of the table, or else every id up to
    the highest one it remembers handing out (each then read alone)."""
    try:
        return [row[0] for row in source.execute("SELECT id FROM chats ORDER BY id")]
    except sqlite3.Error:
        pass
    try:
        highest = source.execute("SELECT max(id) FROM chats").fetchone()[0]
    except sqlite3.Error:
        try:
            highest = source.execute("SELECT seq FROM sqlite_sequence WHERE name = 'chats'").fetchone()[0]
        except (sqlite3.Error, TypeError):
            return []
    return list(range(1, int(highest or 0) + 1))


def _copy_chats(source: sqlite3.Connection, into: sqlite3.Connection) -> Salvaged:
    try:
        chat_cols = [c for c in _columns(source, "chats") if c in _columns(into, "chats")]
        message_cols = [c for c in _columns(source, "messages") if c in _columns(into, "messages")]
    except sqlite3.Error:
        return Salvaged()
    if "id" not in chat_cols or "chat_id" not in message_cols:
        return Salvaged()
    result = Salvaged()
    chat_list, message_list = ", ".join(chat_cols), ", ".join(message_cols)
    for chat_id in _chat_ids(source):
        try:
            chat = source.execute(f"SELECT {chat_list} FROM chats WHERE id = ?", (chat_id,)).fetchone()
            if chat is None:
                continue  # an id never used, or deleted before the damage
            messages = source.execute(f"SELECT {message_list} FROM messages WHERE chat_id = ? ORDER BY id",
                                      (chat_id,)).fetchall()
        except sqlite3.Error:
            result.lost += 1
            continue
        try:
            with into:
                into.execute(f"INSERT INTO chats ({chat_list}) VALUES ({', '.join('?' * len(chat_cols))})", chat)
                into.executemany(f"INSERT INTO messages ({message_list}) VALUES ({', '.join('?' * len(message_cols))})",
                                 messages)
        except sqlite3.Error:
            result.lost += 1
            continue
        result.copied += 1
    return result
