"""The text and yes/no dialogs: what each shows, and what each key or button answers."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from textual.widgets import Button, Input, Label, TextArea

from app.ui.app import SpecChatApp
from app.ui.screens.edit import ConfirmScreen, EditScreen
from tests.app.helpers import ready, wait_for

pytestmark = pytest.mark.anyio


async def opened(pilot: Any, dialog: Any) -> list[object]:
    """Push ``dialog`` over the chat; returns the list its answer lands in."""
    app = pilot.app
    await ready(pilot)
    answers: list[object] = []
    app.push_screen(dialog, answers.append)
    await wait_for(pilot, lambda: app.screen is dialog)
    await pilot.pause()
    return answers


def labels(app: SpecChatApp) -> list[str]:
    return [str(label.render()) for label in app.screen.query(Label)]


async def test_a_one_line_box_with_its_title_and_hint(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        answers = await opened(pilot, EditScreen("Rename chat", "Notes", hint="Enter saves"))
        assert labels(app) == ["Rename chat", "Enter saves"]
        box = app.screen.query_one("#edit-value")
        assert isinstance(box, Input) and box.value == "Notes" and app.focused is box
        await pilot.press("end", *"!", "enter")
        await wait_for(pilot, lambda: answers == ["Notes!"])


async def test_a_multi_line_box_saves_with_ctrl_s(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        answers = await opened(pilot, EditScreen("System prompt", "Be brief.", multiline=True))
        assert labels(app) == ["System prompt"]  # no hint given: no hint line
        box = app.screen.query_one("#edit-value", TextArea)
        assert box.text == "Be brief."
        box.load_text("Be brief.\nUse lists.")
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: answers == ["Be brief.\nUse lists."])


@pytest.mark.parametrize("how", ["escape", "cancel"])
async def test_escape_and_cancel_answer_none(make_app: Callable[..., SpecChatApp], how: str) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        answers = await opened(pilot, EditScreen("Rename chat", "Notes"))
        if how == "escape":
            await pilot.press("escape")
        else:
            await pilot.click("#cancel")
        await wait_for(pilot, lambda: answers == [None])


async def test_confirm_focuses_no_so_enter_declines(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        answers = await opened(pilot, ConfirmScreen("Delete “Notes” and its 4 messages?"))
        assert labels(app) == ["Delete “Notes” and its 4 messages?"]
        assert isinstance(app.focused, Button) and app.focused.id == "no"
        await pilot.press("enter")
        await wait_for(pilot, lambda: answers == [False])


@pytest.mark.parametrize("keys, answer", [(["y"], True), (["n"], False), (["escape"], False), (["tab", "enter"], True)])
async def test_confirm_keys(make_app: Callable[..., SpecChatApp], keys: list[str], answer: bool) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        answers = await opened(pilot, ConfirmScreen("Delete?"))
        await pilot.press(*keys)
        await wait_for(pilot, lambda: answers == [answer])
        assert len(app.screen_stack) == 1
