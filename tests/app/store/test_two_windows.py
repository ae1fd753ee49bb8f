"""Two app instances on one history file: a chat deleted in one is never mixed into another chat."""
from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import app.store.schema as schema_module
from app.store.history import ChatDeleted, History
from app.store.saver import HistoryRescued, HistorySaver
from app.store.pending import ChatRef


def _contents(history: History, chat_id: int) -> list[str]:
    return [m.content for m in history.messages(chat_id)]


def test_a_deleted_chat_id_is_never_given_to_a_new_chat(tmp_path: Path) -> None:
    db = tmp_path / "history.db"
    a, b = History.open(db), History.open(db)
    first = a.create_chat("mine", "fast")
    b.add_message(first, "user", "hello", profile="fast")
    a.delete_chat(first)
    second = a.create_chat("A's new chat", "fast")
    assert second != first
    with pytest.raises(ChatDeleted) as refused:
        b.add_message(first, "user", "my bank PIN is 1234", profile="fast")
    assert not refused.value.locked and "deleted" in str(refused.value)
    assert _contents(a, second) == [] and a.messages(first) == []
    a.close()
    b.close()


def test_a_reply_streaming_into_a_chat_deleted_elsewhere_is_refused_not_lost(tmp_path: Path) -> None:
    db = tmp_path / "history.db"
    a, b = History.open(db), History.open(db)
    chat = b.create_chat("shared", "fast")
    b.add_message(chat, "user", "hi", profile="fast")
    reply = b.add_message(chat, "assistant", "", profile="fast")
    a.delete_chat(chat)
    with pytest.raises(ChatDeleted):  # the update finds no row: it says so instead of writing nothing
        b.update_message(chat, reply, "Hello")


def test_saver_moves_unsaved_messages_of_a_chat_deleted_elsewhere_to_a_new_chat(tmp_path: Path) -> None:
    db = tmp_path / "history.db"
    a, b = History.open(db), History.open(db)
    rescued: list[HistoryRescued] = []
    lags: list[str | None] = []
    saver = HistorySaver(b, lags.append, on_rescue=rescued.append)
    chat = ChatRef("Bank", "fast")
    first = saver.start_reply(chat, "what is my balance?", "fast")
    saver.update(first, "100", [("100", "target")], None, "eos")
    assert saver.flush(5)
    deleted = chat.id
    assert deleted is not None
    a.delete_chat(deleted)
    a_new = a.create_chat("A's new chat", "fast")
    assert a_new != deleted
    second = saver.start_reply(chat, "my bank PIN is 1234", "fast")
    saver.update(second, "Noted.", [("Noted.", "target")], None, "eos")
    assert saver.flush(5) and saver.unsaved() == 0
    assert _contents(a, a_new) == []  # never in A's new chat
    assert chat.id not in (None, deleted, a_new)
    assert _contents(a, chat.id) == ["my bank PIN is 1234", "Noted."]
    assert a.get_chat(chat.id).title == "Bank (recovered)"  # type: ignore[union-attr]
    assert [(r.chat_id, r.title) for r in rescued] == [(chat.id, "Bank (recovered)")]
    assert "deleted in another window" in rescued[0].notice and "'Bank (recovered)'" in rescued[0].notice
    assert lags == []  # refused once, never retried as if locked
    saver.close(5)


def test_saver_drops_what_is_unsaved_of_a_chat_deleted_in_its_own_window(tmp_path: Path) -> None:
    history = History.open(tmp_path / "history.db")
    rescued: list[HistoryRescued] = []
    saver = HistorySaver(history, on_rescue=rescued.append)
    chat = ChatRef("Gone", "fast")
    record = saver.start_reply(chat, "hi", "fast")
    assert saver.flush(5)
    history.delete_chat(chat.id)  # type: ignore[arg-type]
    saver.update(record, "late", [("late", "target")], None, "eos")
    assert saver.flush(5) and saver.unsaved() == 0
    assert history.list_chats() == [] and rescued == []
    saver.close(5)


def test_a_version_2_file_is_rebuilt_with_ids_that_are_never_reused(tmp_path: Path) -> None:
    db = tmp_path / "history.db"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA foreign_keys = ON")
    assert schema_module.migrate(conn, schema_module.MIGRATIONS[:2]) == 2
    for n in (1, 2, 3):
        conn.execute("INSERT INTO chats(id, title, created, updated) VALUES (?, ?, 0, 0)", (n, f"c{n}"))
        conn.execute("INSERT INTO messages(chat_id, role, content, created, superseded) VALUES (?, 'user', ?, 0, ?)",
                     (n, f"m{n}", n == 2))
    conn.execute("DELETE FROM chats WHERE id = 2")  # cascades: message 2 goes too
    conn.close()
    history = History.open(db)
    assert history.notice is None
    assert [(c.id, c.title) for c in sorted(history.list_chats(), key=lambda c: c.id)] == [(1, "c1"), (3, "c3")]
    assert [(m.id, m.content, m.superseded) for m in history.messages(3)] == [(3, "m3", False)]
    schema = history._conn.execute("SELECT sql FROM sqlite_master WHERE name IN ('chats', 'messages')").fetchall()
    assert all("AUTOINCREMENT" in sql for (sql,) in schema) and len(schema) == 2
    assert "ON DELETE CASCADE" in schema[1][0] or "ON DELETE CASCADE" in schema[0][0]
    assert history._conn.execute("PRAGMA foreign_key_check").fetchall() == []
    assert history._conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    history.delete_chat(3)
    new = history.create_chat("new", None)
    assert new == 4  # past the largest id the file had, though 3 was deleted
    assert history.add_message(new, "user", "x") == 4
    history.delete_chat(1)  # cascades still work in the rebuilt tables
    assert history._conn.execute("SELECT count(*) FROM messages WHERE chat_id = 1").fetchone()[0] == 0
    history.close()


def test_superseding_from_a_message_of_another_chat_marks_nothing(tmp_path: Path) -> None:
    history = History.open(tmp_path / "history.db")
    gone = history.create_chat("gone", None)
    stale = history.add_message(gone, "user", "old prompt")
    history.delete_chat(gone)
    chat = history.create_chat("recovered", None)
    history.add_message(chat, "user", "kept")
    history.mark_superseded(chat, stale)  # an id from the deleted chat, lower than every id here
    assert [m.superseded for m in history.messages(chat)] == [False]
    history.close()


def test_an_edit_in_one_window_retires_its_own_exchange_not_the_other_windows_later_ones(tmp_path: Path) -> None:
    history = History.open(tmp_path / "history.db")
    chat = history.create_chat("shared", None)
    mine = history.add_message(chat, "user", "u1 from A")
    history.add_message(chat, "assistant", "r1")
    history.add_message(chat, "assistant", "r1, answered again")
    history.add_message(chat, "user", "u2 from B")
    history.add_message(chat, "assistant", "r2 to B")
    history.mark_superseded(chat, mine)  # A edits its prompt (ctrl+g): A's exchange is replaced
    assert [m.superseded for m in history.messages(chat)] == [True, True, True, False, False]
    last = history.add_message(chat, "user", "u3")
    history.mark_superseded(chat, last)  # the last prompt: to the end
    assert [m.superseded for m in history.messages(chat)][-1] is True
    history.close()


def test_a_reply_answering_a_prompt_of_a_deleted_chat_again_brings_its_prompt(tmp_path: Path) -> None:
    history = History.open(tmp_path / "history.db")
    gone = history.create_chat("gone", None)
    stale = history.add_message(gone, "user", "the prompt")
    history.delete_chat(gone)
    chat = ChatRef("recovered", None, id=history.create_chat("recovered", None))
    saver = HistorySaver(history)
    record = saver.start_reply(chat, "the prompt", None, user_id=stale)  # regenerate, its row gone
    saver.update(record, "again", [("again", "target")], None, "eos")
    assert saver.flush(5)
    rows = [(m.role, m.content) for m in history.messages(chat.id)]  # type: ignore[arg-type]
    assert rows == [("user", "the prompt"), ("assistant", "again")]
    saver.close(5)
