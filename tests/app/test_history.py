"""history.db: saving as it streams, private file modes, damaged/locked files set aside, export."""
from __future__ import annotations

import sqlite3
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from app.app import SpecChatApp
from app.export import export_chat
from app.history import History
from app.screens.chats import ChatsScreen
from app.widgets.chat_view import AssistantMessage, UserMessage
from tests.app.fakes import FakeLoader
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


def test_locked_database_is_set_aside(specchat_dirs: Path) -> None:
    first = History.open()
    first.create_chat("kept", None)
    first.close()
    locker = sqlite3.connect(specchat_dirs / "history.db")
    locker.execute("PRAGMA journal_mode = DELETE").fetchone()
    locker.execute("BEGIN EXCLUSIVE")
    try:
        history = History.open()
    finally:
        locker.rollback()
        locker.close()
    assert history.notice is not None
    (aside,) = specchat_dirs.glob("history.db.corrupt-*")
    assert [c.title for c in History.open(aside).list_chats()] == ["kept"]
    assert history.list_chats() == []


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
    assert "α 0.80" in text and "2.50×" in text and "K 4 (adaptive)" in text and "*(stopped)*" in text
    custom = export_chat(history, chat, tmp_path / "out" / "chat.md")
    assert custom.read_text() == text and mode(custom) == 0o600


pytestmark_async = pytest.mark.anyio


@pytestmark_async
async def test_reply_is_saved_while_streaming(make_app: Callable[..., SpecChatApp], specchat_dirs: Path) -> None:
    loader = FakeLoader(hold_after=2)
    app = make_app(loader=loader)
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "hi")
        await wait_for(pilot, loader.backends[0].held.is_set)
        probe = sqlite3.connect(specchat_dirs / "history.db")
        rows = probe.execute("SELECT role, content, finish_reason FROM messages ORDER BY id").fetchall()
        probe.close()
        assert rows == [("user", "hi", None), ("assistant", "Hello there! Here is code", None)]
        loader.backends[0].release.set()
        await wait_for(pilot, lambda: not app.generating)


@pytestmark_async
async def test_reopen_chat_after_restart(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "remember me")
        await wait_for(pilot, lambda: not app.generating)
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
        await wait_for(pilot, lambda: not again.generating and len(again.query(UserMessage)) == 2)
        sent = [(m.role, m.content) for m in loader.backends[0].calls[0]]
        assert sent[1] == ("user", "remember me") and sent[2][0] == "assistant" and sent[3] == ("user", "and again")
        assert len(again.history.list_chats()) == 1


@pytestmark_async
async def test_chats_screen_rename_and_delete(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "first chat")
        await wait_for(pilot, lambda: not app.generating)
        await pilot.press("f3")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatsScreen))
        await pilot.press("r")
        await pilot.press(*"Renamed", "enter")
        await wait_for(pilot, lambda: app.history.list_chats()[0].title == "Renamed")
        await pilot.press("d")
        await pilot.press("y")
        await wait_for(pilot, lambda: app.history.list_chats() == [])
        await pilot.press("escape")
        assert app.chat_id is None


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
        await wait_for(pilot, lambda: not app.generating)
        assert [c.title for c in app.history.list_chats()] == ["works anyway"]
    assert len(list(specchat_dirs.glob("history.db.corrupt-*"))) == 1
