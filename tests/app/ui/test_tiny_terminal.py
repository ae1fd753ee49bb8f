"""A terminal shrunk to a few cells: the app keeps running, and draws its chat again when it grows."""
from __future__ import annotations

from collections.abc import Callable

import pytest
from textual.geometry import Size

from app.ui.app import SpecChatApp
from app.ui.widgets.chat_view import AssistantMessage
from tests.app.fakes import FakeLoader
from tests.app.helpers import ready, send, send_held, wait_for

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("tiny", [(4, 3), (5, 2), (1, 1), (20, 5)])
async def test_a_tiny_terminal_mid_chat_draws_nothing_broken_and_recovers(
        make_app: Callable[..., SpecChatApp], tiny: tuple[int, int]) -> None:
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await send(pilot, "Say hello")
        await wait_for(pilot, lambda: not app.conversation.generating and app.query(AssistantMessage))
        for size in (tiny, (100, 30)):
            await pilot.resize_terminal(*size)
            await pilot.pause(0.2)
            assert app.is_running and app.size == Size(*size)
        assert app.query_one(AssistantMessage).text.startswith("Hello there")


async def test_a_tiny_terminal_while_a_reply_streams_and_with_dialogs_open(
        make_app: Callable[..., SpecChatApp]) -> None:
    loader = FakeLoader(hold_after=2)
    app = make_app(loader=loader)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        backend = await send_held(pilot, loader, "hi")
        await pilot.resize_terminal(4, 3)
        await pilot.pause(0.2)
        backend.release.set()
        await wait_for(pilot, lambda: not app.conversation.generating)
        for key in ("f1", "escape", "f2", "escape", "f3", "escape", "f10", "escape", "f7", "escape", "f8", "escape",
                    "f6", "f6", "ctrl+g", "escape"):
            await pilot.press(key)
            await pilot.pause(0.1)
            assert app.is_running
        await pilot.resize_terminal(100, 30)
        await pilot.pause(0.2)
        assert app.query_one(AssistantMessage).finish_reason == "eos"


@pytest.mark.parametrize("kind", ["confirm", "quit"])
@pytest.mark.parametrize("width", [40, 60])
async def test_a_yes_no_question_fits_a_narrow_terminal_and_every_button_can_be_reached(
        make_app: Callable[..., SpecChatApp], width: int, kind: str) -> None:
    """The question dialogs were a fixed 60 columns: at 40 the question was cut mid-word and No (the
    focused default) or Cancel lay off the screen (a hostile tester's)."""
    from textual.widgets import Button

    from app.ui.screens.edit import ConfirmScreen
    from app.ui.screens.quit import QuitScreen

    app = make_app()
    async with app.run_test(size=(width, 15)) as pilot:
        await ready(pilot)
        question = "Delete “a chat with a rather long title that wraps”? It cannot be undone."
        asked = ConfirmScreen(question) if kind == "confirm" else QuitScreen(question)
        app.push_screen(asked)
        await wait_for(pilot, lambda: app.screen is asked)
        await pilot.pause()
        screen = app.screen.region
        dialog = app.screen.query_one(".confirm-dialog")
        assert dialog.region.right <= screen.right
        assert app.screen.query_one(".dialog-title").region.right <= screen.right
        for button in app.screen.query(Button):
            button.focus()
            await pilot.pause()
            assert screen.contains_region(button.region), f"{button.label} out of reach at {width} columns"
