"""history.db: saving as it streams, private file modes, damaged/locked files set aside, export."""
from __future__ import annotations

import signal
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from app.ui.app import SpecChatApp
from app.ui.export import export_chat
import app.store.history as history_module
import app.store.schema as schema_module
import app.store.saver as saver_module
from app.store.history import History, HistoryError
from app.store.schema import migrate
from app.store.saver import ChatRef, HistorySaver
from app.ui.screens.chats import ChatsScreen
from app.ui.widgets.chat_view import AssistantMessage, UserMessage
from tests.app.fakes import FakeLoader
from tests.conftest import REPO
from tests.app.helpers import ready, send, wait_for


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_roundtrip_and_private_modes(specchat_dirs: Path) -> None:
    history = History.open()
    assert history.notice is None and history.path == specchat_dirs / "history.db"
    chat = history.create_chat("Greeting", "fast", None)
    history.add_message(chat, "user", "hi", profile="fast")
    reply = history.add_message(chat, "assistant", "", profile="fast")
    history.update_message(reply, "Hello!", stats={"alpha": 0.5, "mode": "spec"},
                           pieces=[("Hello", "draft"), ("!", "target")], finish_reason="eos")
    (rec_user, rec_reply) = history.messages(chat)
    assert (rec_user.role, rec_user.content) == ("user", "hi")
    assert rec_reply.pieces == [("Hello", "draft"), ("!", "target")] and rec_reply.stats == {"alpha": 0.5, "mode": "spec"}
    history.rename_chat(chat, "Renamed")
    assert [c.title for c in history.list_chats()] == ["Renamed"]
    assert history.list_chats()[0].message_count == 2
    assert mode(specchat_dirs) == 0o700
    for path in specchat_dirs.glob("history.db*"):
        assert mode(path) == 0o600, path
    history.delete_chat(chat)
    assert history.list_chats() == [] and history.messages(chat) == []
    history.close()


def test_damaged_database_is_set_aside_not_overwritten(specchat_dirs: Path) -> None:
    specchat_dirs.mkdir(parents=True)
    garbage = b"this is not sqlite" * 100
    (specchat_dirs / "history.db").write_bytes(garbage)
    history = History.open()
    assert history.notice is not None and "corrupt-" in history.notice
    (aside,) = specchat_dirs.glob("history.db.corrupt-*")
    assert aside.read_bytes() == garbage
    history.create_chat("still works", None)
    assert [c.title for c in history.list_chats()] == ["still works"]
    history.close()


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


@pytest.fixture
def short_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(history_module, "BUSY_TIMEOUT_S", 0.2)
    monkeypatch.setattr(history_module, "OPEN_ATTEMPTS", 2)
    monkeypatch.setattr(saver_module, "BACKOFF_S", (0.05, 0.2))


def test_lock_at_start_is_not_corruption(specchat_dirs: Path, short_busy: None) -> None:
    first = History.open()
    first.create_chat("kept", None)
    first.close()
    thread, _ = hold_lock(specchat_dirs / "history.db", 1.0)
    history = History.open()
    assert history.notice is not None and "locked" in history.notice
    assert not list(specchat_dirs.glob("history.db.corrupt-*"))
    with pytest.raises(HistoryError) as err:
        history.create_chat("while locked", None)
    assert err.value.locked
    thread.join()
    history.create_chat("after the lock", None)  # the same file, not a fresh one
    assert [c.title for c in history.list_chats()] == ["after the lock", "kept"]
    history.close()
    assert not list(specchat_dirs.glob("history.db.corrupt-*"))


def test_lock_released_during_open_is_waited_for(specchat_dirs: Path, short_busy: None) -> None:
    first = History.open()
    first.create_chat("kept", None)
    first.close()
    thread, _ = hold_lock(specchat_dirs / "history.db", 0.3)  # longer than one busy timeout
    history = History.open()
    thread.join()
    assert history.notice is None
    assert [c.title for c in history.list_chats()] == ["kept"]


def test_unusable_or_newer_file_is_left_untouched(specchat_dirs: Path) -> None:
    first = History.open()
    first.create_chat("from the future", None)
    first.close()
    conn = sqlite3.connect(specchat_dirs / "history.db")
    conn.execute(f"PRAGMA user_version = {schema_module.SCHEMA_VERSION + 1}")
    conn.close()
    before = (specchat_dirs / "history.db").read_bytes()
    history = History.open()
    assert history.path is None and history.notice is not None and "newer specchat" in history.notice
    history.create_chat("in memory", None)
    assert (specchat_dirs / "history.db").read_bytes() == before
    assert not list(specchat_dirs.glob("history.db.corrupt-*"))


def test_malformed_database_is_confirmed_and_set_aside(specchat_dirs: Path) -> None:
    first = History.open()
    for i in range(200):
        first.add_message(first.create_chat(f"chat {i}", None), "user", "x" * 500)
    first.close()
    conn = sqlite3.connect(specchat_dirs / "history.db")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    path = specchat_dirs / "history.db"
    data = bytearray(path.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    for off in range(2 * page, len(data), page):  # scribble over every b-tree page after the first
        data[off:off + 8] = b"\xff" * 8
    path.write_bytes(bytes(data))
    assert history_module.History._confirm_corrupt(path)
    history = History.open()
    assert history.notice is not None and "damaged" in history.notice
    assert len(list(specchat_dirs.glob("history.db.corrupt-*"))) == 1


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


def test_saver_keeps_rounds_while_locked_and_writes_the_final_state(specchat_dirs: Path, short_busy: None) -> None:
    history = History.open()
    lags: list[str | None] = []
    saver = HistorySaver(history, lags.append)
    chat = ChatRef("locked reply", "fast")
    first = saver.start_reply(chat, "hello", "fast")
    saver.update(first, "Hi", [("Hi", "target")], None)
    assert saver.flush(5)
    thread, _ = hold_lock(specchat_dirs / "history.db", 1.0, exclusive=False)
    for i in range(5):
        saver.update(first, "Hi" + " there" * (i + 1), [("Hi" + " there" * (i + 1), "target")], {"tokens": i})
    saver.update(first, "Hi there, done.", [("Hi there, done.", "draft")], {"tokens": 9}, "eos")
    second = saver.start_reply(chat, "again", "fast")
    saver.update(second, "Yes.", [("Yes.", "target")], None, "eos")
    time.sleep(0.5)
    assert saver.lagging and saver.unsaved() == 2 and lags and lags[0] and "locked" in lags[0]
    thread.join()
    assert saver.close(5)
    assert lags[-1] is None and not saver.lagging
    rows = [(m.role, m.content, m.finish_reason) for m in history.messages(chat.id)]  # type: ignore[arg-type]
    assert rows == [("user", "hello", None), ("assistant", "Hi there, done.", "eos"),
                    ("user", "again", None), ("assistant", "Yes.", "eos")]
    assert history.messages(chat.id)[1].stats == {"tokens": 9}  # type: ignore[arg-type]


def _child(db: Path, rounds: int, finish: bool) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.app.saver_child", str(db), str(rounds), "1" if finish else "0"],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )


def _saved_reply(db: Path) -> tuple[str, str | None]:
    history = History.open(db)
    assert history.notice is None  # a killed writer leaves no damage and no lock
    (chat,) = history.list_chats()
    (_user, reply) = history.messages(chat.id)
    history.close()
    return reply.content, reply.finish_reason


def test_kill_9_mid_reply_loses_nothing_confirmed(tmp_path: Path) -> None:
    db = tmp_path / "history.db"
    child = _child(db, 10_000, finish=False)
    assert child.stdout is not None
    confirmed = 0
    for line in child.stdout:
        if line.startswith("saved "):
            confirmed = int(line.split()[1])
        if confirmed >= 50:
            break
    child.send_signal(signal.SIGKILL)
    child.wait()
    text, finish = _saved_reply(db)
    assert text.startswith("".join(f" r{i}" for i in range(confirmed)))
    assert finish is None


def test_kill_9_after_a_lock_clears_keeps_the_final_state(tmp_path: Path) -> None:
    db = tmp_path / "history.db"
    first = History.open(db)
    first.close()
    thread, _ = hold_lock(db, 1.5, exclusive=False)
    child = _child(db, 40, finish=True)
    assert child.stdout is not None
    lines = []
    for line in child.stdout:
        lines.append(line.strip())
        if line.startswith("all saved"):
            break
    child.send_signal(signal.SIGKILL)
    child.wait()
    thread.join()
    assert lines[0] == "pending 1"  # the first rounds waited in memory while the lock was held
    text, finish = _saved_reply(db)
    assert text == "".join(f" r{i}" for i in range(40)) and finish == "length"


def test_export_markdown_with_stats(specchat_dirs: Path, tmp_path: Path) -> None:
    history = History.open()
    chat = history.create_chat("Code please", "fast", "Be brief.")
    history.add_message(chat, "user", "show code", profile="fast")
    history.add_message(chat, "assistant", "```python\nprint(1)\n```", profile="fast", finish_reason="cancelled",
                        stats={"mode": "spec", "drafter": "model", "k": 4, "adaptive": True, "alpha": 0.8,
                               "tau": 3.2, "tokens_per_s": 50.0, "itl_ms": 20.0, "speedup": 2.5, "tokens": 9})
    path = export_chat(history, chat)
    assert path.parent == specchat_dirs / "exports" and mode(path) == 0o600 and mode(path.parent) == 0o700
    text = path.read_text()
    assert text.startswith("# Code please") and "Be brief." in text and "```python\nprint(1)\n```" in text
    assert "acceptance rate 80% (accepted ÷ proposed)" in text and "2.50×" in text
    assert "K 4 (adaptive)" in text and "*(stopped)*" in text
    custom = export_chat(history, chat, tmp_path / "out" / "chat.md")
    assert custom.read_text() == text and mode(custom) == 0o600


def test_export_gives_each_mode_its_share_of_the_tokens(specchat_dirs: Path) -> None:
    history = History.open()
    chat = history.create_chat("Summary", "pocket", None)
    history.add_message(chat, "user", "summarise", profile="pocket")
    history.add_message(chat, "assistant", "text", profile="pocket", finish_reason="eos",
                        stats={"mode": "plain", "drafter": "n-gram lookup", "alpha": 0.54, "alpha_per_token": 0.8,
                               "proposed": 50, "tokens": 100, "mode_tokens": {"ngram": 72, "plain": 28},
                               "plain_rounds": 31, "plain_tokens_per_s": 95.0, "plain_measured_tokens_per_s": 97.0})
    text = export_chat(history, chat).read_text()
    assert "mode n-gram 72% · plain 28%" in text and "plain decoding" not in text
    assert "α per token 0.80" in text and "acceptance rate 54%" in text
    assert "31 K=0 rounds: 97.0 tok/s" in text


pytestmark_async = pytest.mark.anyio


@pytestmark_async
async def test_reply_is_saved_while_streaming(make_app: Callable[..., SpecChatApp], specchat_dirs: Path) -> None:
    loader = FakeLoader(hold_after=2)
    app = make_app(loader=loader)
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "hi")
        await wait_for(pilot, loader.backends[0].held.is_set)

        def rows() -> list[tuple[object, ...]]:
            probe = sqlite3.connect(specchat_dirs / "history.db")
            try:
                return probe.execute("SELECT role, content, finish_reason FROM messages ORDER BY id").fetchall()
            finally:
                probe.close()

        await wait_for(pilot, lambda: rows() == [("user", "hi", None), ("assistant", "Hello there! Here is code", None)],
                       timeout=20)
        loader.backends[0].release.set()
        await wait_for(pilot, lambda: not app.conversation.generating)


@pytestmark_async
async def test_lock_during_reply_shows_notice_and_saves_everything_after(
    make_app: Callable[..., SpecChatApp], specchat_dirs: Path, short_busy: None
) -> None:
    loader = FakeLoader(hold_after=1)
    app = make_app(loader=loader)
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "hi")
        await wait_for(pilot, loader.backends[0].held.is_set)
        assert app.archive.saver is not None
        await wait_for(pilot, lambda: app.archive.saver.unsaved() == 1 and app.conversation.chat_id is not None)
        thread, _ = hold_lock(specchat_dirs / "history.db", 1.5, exclusive=False)
        loader.backends[0].release.set()
        await wait_for(pilot, lambda: not app.conversation.generating)
        await wait_for(pilot, lambda: any("saved when the lock is released" in n.message
                                          for n in app._notifications))
        assert app.archive.saver.unsaved() == 1
        thread.join()
        await wait_for(pilot, lambda: app.archive.saver.unsaved() == 0)
        assert any("everything is saved" in n.message for n in app._notifications)
        (user, reply) = app.archive.history.messages(app.conversation.chat_id)
        assert reply.content == "Hello there! Here is code:\n\n```python\nprint('hi')\n```\nDone."
        assert reply.finish_reason == "eos" and reply.stats is not None and reply.stats["rounds"] == 5


@pytestmark_async
async def test_reopen_chat_after_restart(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "remember me")
        await wait_for(pilot, lambda: not app.conversation.generating)
        await pilot.press("f4")  # the colour view must survive the restart too
    loader = FakeLoader()
    again = make_app(loader=loader)
    async with again.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        assert not again.query(UserMessage)
        await pilot.press("f3")
        await wait_for(pilot, lambda: isinstance(again.screen, ChatsScreen))
        await pilot.press("enter")
        await wait_for(pilot, lambda: bool(again.query(UserMessage)))
        assert again.query_one(UserMessage).text == "remember me"
        reply = again.query_one(AssistantMessage)
        assert reply.text.startswith("Hello there!") and reply.finish_reason == "eos"
        assert ("Hello there", "draft") in reply.pieces
        await send(pilot, "and again")
        await wait_for(pilot, lambda: not again.conversation.generating and len(again.query(UserMessage)) == 2)
        sent = [(m.role, m.content) for m in loader.backends[0].calls[0]]
        assert sent[1] == ("user", "remember me") and sent[2][0] == "assistant" and sent[3] == ("user", "and again")
        assert len(again.archive.history.list_chats()) == 1


@pytestmark_async
async def test_chats_screen_rename_and_delete(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "first chat")
        await wait_for(pilot, lambda: not app.conversation.generating)
        await pilot.press("f3")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatsScreen))
        await pilot.press("r")
        await pilot.press(*"Renamed", "enter")
        await wait_for(pilot, lambda: app.archive.history.list_chats()[0].title == "Renamed")
        await pilot.press("d")
        await pilot.press("y")
        await wait_for(pilot, lambda: app.archive.history.list_chats() == [])
        await pilot.press("escape")
        assert app.conversation.chat_id is None


@pytestmark_async
async def test_damaged_database_in_app_is_reported_and_app_works(
    make_app: Callable[..., SpecChatApp], specchat_dirs: Path
) -> None:
    specchat_dirs.mkdir(parents=True)
    (specchat_dirs / "history.db").write_bytes(b"\x00garbage" * 64)
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        assert any("corrupt-" in n.message for n in app._notifications)
        await send(pilot, "works anyway")
        await wait_for(pilot, lambda: not app.conversation.generating)
        assert [c.title for c in app.archive.history.list_chats()] == ["works anyway"]
    assert len(list(specchat_dirs.glob("history.db.corrupt-*"))) == 1


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
