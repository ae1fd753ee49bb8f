"""The chats dialog: the saved chats newest first, the open one marked; open, new, rename, delete, export."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Label, OptionList

from app.store.history import ChatRecord, HistoryError
from app.ui.app import SpecChatApp
from app.ui.screens.chats import ChatsScreen, chat_option
from app.ui.screens.edit import ConfirmScreen, EditScreen
from tests.app.helpers import ready, wait_for

pytestmark = pytest.mark.anyio


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_an_option_shows_title_time_profile_and_count(utc: None) -> None:
    chat = ChatRecord(7, "Plans", "fast", None, created=0.0, updated=1_700_000_000.0, message_count=4)
    option = chat_option(chat, current=False)
    assert option.id == "7" and str(option.prompt) == "Plans\n  2023-11-14 22:13 · fast · 4 messages"
    nameless = ChatRecord(8, "Old", None, None, created=0.0, updated=1_700_000_000.0)
    assert str(chat_option(nameless, current=True).prompt) == "Old  ● open\n  2023-11-14 22:13 · — · 0 messages"


def chats(app: SpecChatApp, *titles: str) -> list[int]:
    """Save a chat per title, each with a prompt and a reply; ids oldest first."""
    history = app.archive.history
    assert history is not None
    ids = []
    for title in titles:
        ids.append(history.create_chat(title, "fast"))
        history.add_message(ids[-1], "user", f"about {title}")
        history.add_message(ids[-1], "assistant", "ok", profile="fast", finish_reason="eos")
    return ids


async def opened(pilot: Any, current: int | None = None) -> tuple[ChatsScreen, list[object]]:
    app = pilot.app
    answers: list[object] = []
    screen = ChatsScreen(app.archive, current)
    app.push_screen(screen, answers.append)
    await wait_for(pilot, lambda: app.screen is screen)
    await pilot.pause()
    return screen, answers


def rows(screen: ChatsScreen) -> list[str]:
    options = screen.query_one(OptionList)
    return [str(options.get_option_at_index(i).prompt).split("\n")[0] for i in range(options.option_count)]


async def test_no_chats_yet(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        screen, answers = await opened(pilot)
        assert rows(screen) == ["No saved chats yet."]
        assert screen.query_one(OptionList).get_option_at_index(0).disabled
        assert "Enter opens · n new · r rename · d delete · e export · Esc closes" in [
            str(label.render()) for label in screen.query(Label)]
        await pilot.press("enter", "r", "d", "e")  # nothing to open, rename, delete or export
        await pilot.pause(0.1)
        assert app.screen is screen and answers == []


async def test_newest_first_the_open_one_marked_and_enter_opens(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        first, second = chats(app, "first", "second")
        screen, answers = await opened(pilot, current=first)
        assert rows(screen) == ["second", "first  ● open"]
        assert app.focused is screen.query_one(OptionList)
        await pilot.press("down", "enter")
        await wait_for(pilot, lambda: answers == [("open", first)])


async def test_n_asks_for_a_new_chat(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        chats(app, "one")
        _, answers = await opened(pilot)
        await pilot.press("n")
        await wait_for(pilot, lambda: answers == [("new", None)])


async def test_rename_starts_from_the_title_and_a_blank_name_changes_nothing(
        make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        (chat_id,) = chats(app, "Notes")
        screen, _ = await opened(pilot)
        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, EditScreen))
        assert app.screen.query_one("#edit-value").value == "Notes"  # type: ignore[attr-defined]
        await pilot.press("ctrl+a", "backspace", "space", "enter")
        await wait_for(pilot, lambda: app.screen is screen)
        assert app.archive.history.get_chat(chat_id).title == "Notes"  # type: ignore[union-attr]
        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, EditScreen))
        await pilot.press("end", *" 2", "enter")
        await wait_for(pilot, lambda: rows(screen) == ["Notes 2"])
        assert app.archive.history.get_chat(chat_id).title == "Notes 2"  # type: ignore[union-attr]


async def test_delete_asks_first_and_tells_the_app(make_app: Callable[..., SpecChatApp],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    deleted: list[int] = []
    monkeypatch.setattr(SpecChatApp, "on_chats_screen_deleted", lambda self, message: deleted.append(message.chat_id))
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        keep, gone = chats(app, "keep", "gone")
        screen, _ = await opened(pilot)
        await pilot.press("d")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        question = [str(label.render()) for label in app.screen.query(Label)]
        assert question == ["Delete “gone” and its 2 messages?", "Enter or y deletes · Esc or n keeps it"]
        await pilot.press("n")
        await wait_for(pilot, lambda: app.screen is screen)
        assert rows(screen) == ["gone", "keep"] and deleted == []
        await pilot.press("delete")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await wait_for(pilot, lambda: rows(screen) == ["keep"] and deleted == [gone])
        assert [c.id for c in app.archive.history.list_chats()] == [keep]  # type: ignore[union-attr]


async def test_a_deleted_chats_prompts_leave_ups_recall(make_app: Callable[..., SpecChatApp]) -> None:
    """Up brought back a deleted chat's prompt until the next start (a hostile tester's); a prompt
    another chat also holds stays recalled. A chat of one message says "1 message"."""
    from app.ui.widgets.prompt import PromptArea

    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        history = app.archive.history
        assert history is not None
        secret = history.create_chat("secret", "fast")
        history.add_message(secret, "user", "my secret prompt")
        history.add_message(secret, "user", "shared words")
        other = history.create_chat("other", "fast")
        history.add_message(other, "user", "shared words")
        lone = history.create_chat("lone", "fast")
        history.add_message(lone, "user", "alone")
        box = app.query_one(PromptArea)
        box.set_history(history.recent_prompts())
        assert box.prompts == ["my secret prompt", "shared words", "alone"]
        screen, _ = await opened(pilot)
        for title in ("secret", "lone"):
            while rows(screen)[screen.query_one(OptionList).highlighted or 0] != title:
                await pilot.press("down")
            await pilot.press("d")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            if title == "lone":
                assert str(app.screen.query(Label)[0].render()) == "Delete “lone” and its 1 message?"
            await pilot.press("enter")
            await wait_for(pilot, lambda: app.screen is screen and title not in rows(screen))
        await wait_for(pilot, lambda: box.prompts == ["shared words"])


async def test_export_writes_the_highlighted_chat(make_app: Callable[..., SpecChatApp], tmp_path: Path) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        chats(app, "Exported")
        screen, _ = await opened(pilot)
        await pilot.press("e")
        await wait_for(pilot, lambda: isinstance(app.screen, EditScreen))
        out = tmp_path / "chat.md"
        app.screen.query_one("#edit-value").value = str(out)  # type: ignore[attr-defined]
        await pilot.press("enter")
        await wait_for(pilot, out.exists)
        assert "about Exported" in out.read_text()
        assert any(n.message == f"Exported to {out}" for n in app._notifications)


async def test_an_unreadable_history_is_a_notice_and_an_empty_list(make_app: Callable[..., SpecChatApp],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)

        def locked() -> list[ChatRecord]:
            raise HistoryError("Reading chat history failed: database is locked")

        monkeypatch.setattr(app.archive.history, "list_chats", locked)
        screen, _ = await opened(pilot)
        assert rows(screen) == ["No saved chats yet."]
        assert any(n.message == "Reading chat history failed: database is locked" and n.severity == "error"
                   for n in app._notifications)


@pytest.mark.parametrize("key", ["r", "d", "e"])
async def test_a_chat_deleted_in_another_window_is_said_gone_and_the_list_refreshed(
        make_app: Callable[..., SpecChatApp], key: str) -> None:
    """Rename, delete and export of a chat another window deleted did nothing without a word,
    and its row stayed in the list."""
    from app.store.history import History

    app = make_app()
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await ready(pilot)
        keep, gone = chats(app, "keep", "gone")
        screen, _ = await opened(pilot)
        other = History.open()
        other.delete_chat(gone)
        other.close()
        await pilot.press(key)
        await wait_for(pilot, lambda: rows(screen) == ["keep"])
        assert app.screen is screen
        assert any("no longer exists" in n.message for n in app._notifications)
