"""Schema 4: a chat's own sampling, saved as JSON with the chat; older files gain the column."""
from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import app.store.schema as schema_module
from app.store.history import History
from app.store.saver import HistorySaver
from app.store.pending import ChatRef
from app.store.schema import migrate


def test_a_version_3_file_gains_the_sampling_column_and_keeps_its_chats(specchat_dirs: Path) -> None:
    specchat_dirs.mkdir(parents=True)
    conn = sqlite3.connect(specchat_dirs / "history.db", isolation_level=None)
    assert migrate(conn, schema_module.MIGRATIONS[:3]) == 3
    conn.execute("INSERT INTO chats(title, profile, created, updated) VALUES ('v3', 'fast', 0, 0)")
    conn.execute("INSERT INTO messages(chat_id, role, content, created) VALUES (1, 'user', 'hi', 0)")
    conn.close()
    history = History.open()
    try:
        assert history._conn.execute("PRAGMA user_version").fetchone()[0] == 4 == schema_module.SCHEMA_VERSION
        [chat] = history.list_chats()
        assert (chat.title, chat.message_count, chat.sampling) == ("v3", 1, None)
        history.set_sampling(chat.id, {"temperature": 0.7, "seed": 42})
        assert history.get_chat(chat.id).sampling == {"temperature": 0.7, "seed": 42}  # type: ignore[union-attr]
        history.set_sampling(chat.id, None)
        assert history.get_chat(chat.id).sampling is None  # type: ignore[union-attr]
    finally:
        history.close()


def test_a_chat_the_saver_creates_is_saved_with_its_sampling(tmp_path: Path) -> None:
    history = History.open(tmp_path / "h.db")
    saver = HistorySaver(history)
    try:
        chat = ChatRef("warm", "fast", None, {"temperature": 1.2, "top_p": 0.5})
        record = saver.start_reply(chat, "hi", "fast")
        saver.update(record, "hello", [], None, finish="eos")
        assert saver.flush(5.0) and chat.id is not None
        assert history.get_chat(chat.id).sampling == {"temperature": 1.2, "top_p": 0.5}  # type: ignore[union-attr]
        assert history.list_chats()[0].sampling == {"temperature": 1.2, "top_p": 0.5}
    finally:
        saver.close(1.0)
        history.close()


def test_damaged_sampling_json_reads_as_none(tmp_path: Path) -> None:
    history = History.open(tmp_path / "h.db")
    try:
        chat = history.create_chat("t", "fast", sampling={"seed": 1})
        history._conn.execute("UPDATE chats SET sampling = '[1, 2' WHERE id = ?", (chat,))
        history._conn.commit()
        assert history.get_chat(chat).sampling is None  # type: ignore[union-attr]
        history._conn.execute("UPDATE chats SET sampling = '[1, 2]' WHERE id = ?", (chat,))
        history._conn.commit()
        assert history.get_chat(chat).sampling is None  # type: ignore[union-attr]
    finally:
        history.close()


def test_settings_of_a_chat_not_written_yet_go_in_with_it_and_later_ones_in_order(tmp_path: Path) -> None:
    history = History.open(tmp_path / "h.db")
    saver = HistorySaver(history)
    try:
        chat = ChatRef("early", "fast")
        chat.sampling = {"seed": 5}
        saver.save_setting(chat, "sampling")  # no row yet: the creation takes it
        record = saver.start_reply(chat, "hi", "fast")
        saver.update(record, "hello", [], None, finish="eos")
        assert saver.flush(5.0) and chat.id is not None and saver.unsaved_settings() == 0
        assert history.get_chat(chat.id).sampling == {"seed": 5}  # type: ignore[union-attr]
        chat.profile, chat.system_prompt = "other", "Be brief."
        saver.save_setting(chat, "profile")
        saver.save_setting(chat, "system_prompt")
        assert saver.flush(5.0)
        saved = history.get_chat(chat.id)
        assert saved is not None and (saved.profile, saved.system_prompt, saved.sampling) == ("other", "Be brief.", {"seed": 5})
        with pytest.raises(ValueError, match="unknown chat setting 'colour'"):
            saver.save_setting(chat, "colour")  # type: ignore[arg-type]
    finally:
        saver.close(1.0)
        history.close()
