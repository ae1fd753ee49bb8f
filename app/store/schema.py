"""The history database's schema and its versioned upgrades.

The schema carries a version (``PRAGMA user_version``); :data:`MIGRATIONS` upgrades
an older file step by step, each step in one transaction, so a later release
can change the schema without losing chats (the same scheme as oterm's store).
Also here: telling a lock (wait and retry) from damage (set the file aside).
"""
from __future__ import annotations

import sqlite3
from collections.abc import Sequence

_SCHEMA = """
CREATE TABLE IF NOT EXISTS chats (
    id            INTEGER PRIMARY KEY,
    title         TEXT NOT NULL,
    profile       TEXT,
    system_prompt TEXT,
    created       REAL NOT NULL,
    updated       REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id            INTEGER PRIMARY KEY,
    chat_id       INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
    role          TEXT NOT NULL,
    content       TEXT NOT NULL,
    profile       TEXT,
    stats         TEXT,
    pieces        TEXT,
    finish_reason TEXT,
    created       REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_chat ON messages(chat_id, id);
"""

_AUTOINCREMENT = """
CREATE TABLE chats_v3 (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    title         TEXT NOT NULL,
    profile       TEXT,
    system_prompt TEXT,
    created       REAL NOT NULL,
    updated       REAL NOT NULL
);
INSERT INTO chats_v3(id, title, profile, system_prompt, created, updated)
    SELECT id, title, profile, system_prompt, created, updated FROM chats;
CREATE TABLE messages_v3 (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    chat_id       INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
    role          TEXT NOT NULL,
    content       TEXT NOT NULL,
    profile       TEXT,
    stats         TEXT,
    pieces        TEXT,
    finish_reason TEXT,
    created       REAL NOT NULL,
    superseded    INTEGER NOT NULL DEFAULT 0
);
INSERT INTO messages_v3(id, chat_id, role, content, profile, stats, pieces, finish_reason, created, superseded)
    SELECT id, chat_id, role, content, profile, stats, pieces, finish_reason, created, superseded FROM messages;
DROP TABLE messages;
DROP TABLE chats;
ALTER TABLE chats_v3 RENAME TO chats;
ALTER TABLE messages_v3 RENAME TO messages;
CREATE INDEX messages_by_chat ON messages(chat_id, id);
"""
"""Version 3: both tables rebuilt with ``AUTOINCREMENT`` (SQLite's "make other kinds of
table schema changes" recipe: new table, copy, drop, rename, with foreign keys off
meanwhile, see :func:`migrate`). The copies carry their ids, so ``sqlite_sequence`` starts
past the largest id in the file; a deleted chat's id above that was never recorded by
the old schema and cannot be known."""

MIGRATIONS: tuple[tuple[int, str], ...] = (
    (1, _SCHEMA),
    # An edited prompt's earlier exchange: kept and shown dimmed, never sent to the model again.
    (2, "ALTER TABLE messages ADD COLUMN superseded INTEGER NOT NULL DEFAULT 0;"),
    # Ids are never reused (AUTOINCREMENT): a chat deleted in one window can no longer be
    # written into by another window that still has it open, through a new chat given its id.
    (3, _AUTOINCREMENT),
    # A chat's own sampling (temperature, top-p, top-k, seed over its profile's), as JSON;
    # NULL follows the profile (app.ui.sampling).
    (4, "ALTER TABLE chats ADD COLUMN sampling TEXT;"),
)
"""``(version, SQL script)`` in order: the script upgrades a file at ``version - 1``
to ``version``. Append a step (never edit a released one) to change the schema."""

SCHEMA_VERSION = MIGRATIONS[-1][0]

_CORRUPTION = ("malformed", "not a database", "file is encrypted", "integrity check failed")


def is_lock_error(exc: BaseException) -> bool:
    """True for "database is locked" / "database table is locked" / busy errors."""
    text = str(exc).lower()
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text)


def is_corruption_error(exc: BaseException) -> bool:
    """True only for SQLite's own reports that the file is damaged or not a database."""
    return (isinstance(exc, sqlite3.DatabaseError) and not is_lock_error(exc)
            and any(word in str(exc).lower() for word in _CORRUPTION))


class NewerSchema(sqlite3.DatabaseError):
    """The file was written by a newer specchat (its user_version is above ours)."""


class ForeignFile(sqlite3.DatabaseError):
    """The file is an SQLite database of another program: left as it is, never upgraded."""


_OUR_TABLES = {"chats": {"id", "title", "created", "updated"}, "messages": {"id", "chat_id", "role", "content"}}


def check_ours(conn: sqlite3.Connection) -> None:
    """Raise :class:`ForeignFile` unless the file is empty or a specchat history (of any version).

    Run before anything writes (journal mode, upgrades): a tester's file of another program,
    with a ``chats`` table of its own, was switched to WAL, given ``user_version`` 2 and a
    ``messages`` table, while the notice said it "was left untouched". A file with a
    user_version is specchat's (0.x files had none, with these tables)."""
    if int(conn.execute("PRAGMA user_version").fetchone()[0]) != 0:
        return
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    tables -= {"sqlite_sequence"}
    for name in sorted(tables):
        columns = {row[1] for row in conn.execute(f"PRAGMA table_info({name})")}
        if name not in _OUR_TABLES or not _OUR_TABLES[name] <= columns:
            raise ForeignFile(f"it is another program's SQLite file: its table {name!r} is not specchat's")


def migrate(conn: sqlite3.Connection, migrations: Sequence[tuple[int, str]] = MIGRATIONS) -> int:
    """Bring the schema up to the last step of ``migrations``; returns the version.

    Each step runs in its own transaction together with its ``user_version``
    bump, so a failed step leaves the file at the previous version, data intact.
    Foreign keys are off while steps run (a step may rebuild a table: dropping the
    old parent table must not cascade into the copied children) and checked with
    ``PRAGMA foreign_key_check`` before each step commits (a step may not add dangling rows).
    """
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    latest = migrations[-1][0] if migrations else 0
    if version > latest:
        raise NewerSchema(f"History database was written by a newer specchat (schema {version}, "
                           f"this one knows up to {latest}).")
    pending = [(step, script) for step, script in migrations if step > version]
    if not pending:
        return version
    keys_on = bool(conn.execute("PRAGMA foreign_keys").fetchone()[0])
    if keys_on:
        conn.execute("PRAGMA foreign_keys = OFF")  # a no-op inside a transaction: set before BEGIN
    try:
        for step, script in pending:
            conn.execute("BEGIN IMMEDIATE")
            try:
                orphans = len(conn.execute("PRAGMA foreign_key_check").fetchall())  # kept as they were
                for statement in _statements(script):
                    conn.execute(statement)
                broken = len(conn.execute("PRAGMA foreign_key_check").fetchall())
                if broken > orphans:
                    raise sqlite3.IntegrityError(f"schema step {step} left {broken - orphans} rows without "
                                                 "their parent row")
                conn.execute(f"PRAGMA user_version = {int(step)}")
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            version = step
    finally:
        if keys_on:
            conn.execute("PRAGMA foreign_keys = ON")
    return version


def _statements(script: str) -> list[str]:
    """Split a migration script into statements (executescript would commit on its own)."""
    out, buf = [], ""
    for line in script.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            if buf.strip():
                out.append(buf.strip())
            buf = ""
    if buf.strip():
        out.append(buf.strip())
    return out
