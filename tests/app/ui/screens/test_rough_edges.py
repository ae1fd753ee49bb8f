"""Rough edges a new user met at 80×24 (issue 37): rename replaces the title it starts from,
and Enter in delete's confirmation deletes."""
from __future__ import annotations

from collections.abc import Callable

import pytest

from textual import events

from app.ui.app import SpecChatApp
from app.ui.screens.edit import ConfirmScreen, EditScreen
from tests.app.helpers import ready, wait_for
from tests.app.ui.screens.test_chats import chats, opened, rows

pytestmark = pytest.mark.anyio


async def test_typing_a_new_name_replaces_the_old_title(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        (chat_id,) = chats(app, "Notes")
        screen, _ = await opened(pilot)
        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, EditScreen))
        await pilot.press(*"Plans", "enter")
        await wait_for(pilot, lambda: rows(screen) == ["Plans"])
        assert app.archive.history.get_chat(chat_id).title == "Plans"  # type: ignore[union-attr]


async def test_a_new_name_typed_right_after_r_replaces_the_title(make_app: Callable[..., SpecChatApp]) -> None:
    """Keys typed at once after r went to the chats list below the rename box (its n started a
    new chat, and the box's answer then crashed the app); they are the box's, replacing the title."""
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        (chat_id,) = chats(app, "Notes")
        screen, answers = await opened(pilot)
        for ch in "rPlans":
            app.post_message(events.Key(ch, ch))
        app.post_message(events.Key("enter", "\r"))
        await wait_for(pilot, lambda: rows(screen) == ["Plans"])
        assert app.screen is screen and answers == []  # the chats list is still open, nothing else happened
        assert app.archive.history.get_chat(chat_id).title == "Plans"  # type: ignore[union-attr]


async def test_enter_in_deletes_confirmation_deletes(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        keep, gone = chats(app, "keep", "gone")
        screen, _ = await opened(pilot)
        await pilot.press("d")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("enter")
        await wait_for(pilot, lambda: rows(screen) == ["keep"])
        assert [c.id for c in app.archive.history.list_chats()] == [keep]  # type: ignore[union-attr]
