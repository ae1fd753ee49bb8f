"""history.db's schema: migrations in steps, a failed step rolled back, old files upgraded."""
from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import app.store.schema as schema_module
from app.store.history import History
from app.store.schema import migrate


def test_migrations_upgrade_in_steps_and_roll_back_a_failed_step(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "h.db", isolation_level=None)
    assert migrate(conn) == schema_module.SCHEMA_VERSION
    conn.execute("INSERT INTO chats(title, created, updated) VALUES ('old', 0, 0)")
    steps = (*schema_module.MIGRATIONS, (schema_module.SCHEMA_VERSION + 1,
                                          "ALTER TABLE chats ADD COLUMN pinned INTEGER DEFAULT 0;"))
    assert migrate(conn, steps) == schema_module.SCHEMA_VERSION + 1
    assert conn.execute("SELECT title, pinned FROM chats").fetchall() == [("old", 0)]
    bad = (*steps, (schema_module.SCHEMA_VERSION + 2,
                    "CREATE TABLE tags (name TEXT);\nINSERT INTO nowhere VALUES (1);"))
    with pytest.raises(sqlite3.OperationalError):
        migrate(conn, bad)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == schema_module.SCHEMA_VERSION + 1
    assert conn.execute("SELECT name FROM sqlite_master WHERE name = 'tags'").fetchall() == []
    assert conn.execute("SELECT title FROM chats").fetchall() == [("old",)]


def test_file_without_version_is_upgraded(specchat_dirs: Path) -> None:
    specchat_dirs.mkdir(parents=True)
    conn = sqlite3.connect(specchat_dirs / "history.db")
    conn.executescript(schema_module._SCHEMA)
    conn.execute("INSERT INTO chats(title, created, updated) VALUES ('v0', 0, 0)")
    conn.commit()
    conn.close()
    history = History.open()
    assert history.notice is None and [c.title for c in history.list_chats()] == ["v0"]
    assert history._conn.execute("PRAGMA user_version").fetchone()[0] == schema_module.SCHEMA_VERSION


def test_a_version_1_file_gains_the_superseded_mark_and_keeps_its_messages(specchat_dirs: Path) -> None:
    specchat_dirs.mkdir(parents=True)
    conn = sqlite3.connect(specchat_dirs / "history.db", isolation_level=None)
    assert migrate(conn, schema_module.MIGRATIONS[:1]) == 1
    conn.execute("INSERT INTO chats(title, created, updated) VALUES ('v1', 0, 0)")
    conn.execute("INSERT INTO messages(chat_id, role, content, created) VALUES (1, 'user', 'hi', 0)")
    conn.close()
    history = History.open()
    [message] = history.messages(1)
    assert message.content == "hi" and message.superseded is False
    history.mark_superseded(1, message.id)
    assert history.messages(1)[0].superseded is True
