"""Dialogs answer Esc and Enter in the order keys were typed (app.ui.screens.dialog, app.ui.key_hold).

Each test queues its keys on the app at once, before the UI handles any of them:
what a fast typist's keys look like when they arrive in one read.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from textual import events

from app.ui.app import SpecChatApp
from app.ui.screens.copy import CopyChoice, CopyScreen
from app.ui.screens.edit import ConfirmScreen, EditScreen
from app.ui.screens.help import HelpScreen
from tests.app.helpers import ready, wait_for


def key(name: str) -> events.Key:
    characters = {"escape": "\x1b", "enter": "\r", "down": None}
    return events.Key(name, characters.get(name, name))


async def open_dialog(app: SpecChatApp, pilot: Any, dialog: Any, answers: list[object] | None = None) -> list[object]:
    """Push ``dialog`` over the chat; returns the list its answer is appended to."""
    answers = [] if answers is None else answers
    await ready(pilot)
    app.push_screen(dialog, answers.append)
    await wait_for(pilot, lambda: len(app.screen_stack) == 2)
    await pilot.pause(0.1)
    return answers


def type_at_once(app: SpecChatApp, keys: list[str]) -> None:
    for name in keys:
        app.post_message(key(name))


@pytest.mark.anyio
@pytest.mark.parametrize("dialog", [lambda: EditScreen("Export chat to Markdown", "/tmp/chat.md"),
                                    lambda: ConfirmScreen("Delete?"), lambda: HelpScreen([])],
                         ids=["edit", "confirm", "help"])
async def test_keys_right_after_esc_reach_the_prompt_box_not_the_closing_dialog(
        make_app: Callable[..., SpecChatApp], dialog: Callable[[], Any]) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await open_dialog(app, pilot, dialog())
        type_at_once(app, ["escape", *"typed"])
        await wait_for(pilot, lambda: app.conversation.prompt.text == "typed")
        assert len(app.screen_stack) == 1


@pytest.mark.anyio
async def test_enter_answers_with_the_text_typed_before_it_and_the_rest_goes_to_the_prompt(
        make_app: Callable[..., SpecChatApp]) -> None:
    """Before: the rename box answered "abcd" (the next prompt's first keys went into the name)."""
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        answers = await open_dialog(app, pilot, EditScreen("Rename chat", ""))
        type_at_once(app, ["a", "b", "enter", "c", "d"])
        await wait_for(pilot, lambda: app.conversation.prompt.text == "cd")
        assert answers == ["ab"] and len(app.screen_stack) == 1


@pytest.mark.anyio
async def test_enter_picks_the_option_the_keys_before_it_moved_to(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    choices = [CopyChoice("first", "1"), CopyChoice("second", "2"), CopyChoice("third", "3")]
    async with app.run_test(size=(120, 40)) as pilot:
        answers = await open_dialog(app, pilot, CopyScreen(choices))
        type_at_once(app, ["down", "down", "enter", "x"])
        await wait_for(pilot, lambda: app.conversation.prompt.text == "x")
        assert answers == [choices[2]]


@pytest.mark.anyio
async def test_enter_on_a_focused_button_and_y_answer_at_once(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        answers = await open_dialog(app, pilot, ConfirmScreen("Delete?"))  # "No" has the focus
        type_at_once(app, ["enter", "z"])
        await wait_for(pilot, lambda: app.conversation.prompt.text == "z")
        await open_dialog(app, pilot, ConfirmScreen("Delete?"), answers)
        type_at_once(app, ["y", "w"])
        await wait_for(pilot, lambda: app.conversation.prompt.text == "zw")
        assert answers == [False, True]


@pytest.mark.anyio
async def test_enter_in_a_multi_line_box_is_a_new_line(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        answers = await open_dialog(app, pilot, EditScreen("System prompt", "", multiline=True))
        type_at_once(app, ["a", "enter", "b"])
        await pilot.pause(0.3)
        assert len(app.screen_stack) == 2 and answers == []
        assert app.screen.query_one("#edit-value").text == "a\nb"  # type: ignore[attr-defined]
        type_at_once(app, ["ctrl+s"])
        await wait_for(pilot, lambda: answers == ["a\nb"])


@pytest.mark.anyio
async def test_a_click_still_answers(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        answers = await open_dialog(app, pilot, EditScreen("Rename chat", "Notes"))
        await pilot.click("#save")
        await wait_for(pilot, lambda: answers == ["Notes"])
        await open_dialog(app, pilot, EditScreen("Rename chat", "Notes"), answers)
        await pilot.click("#cancel")
        await wait_for(pilot, lambda: answers == ["Notes", None])


@pytest.mark.anyio
async def test_keys_typed_after_the_key_that_opens_a_dialog_go_into_it(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        type_at_once(app, ["f8", "x", "y"])  # the system prompt box, opened and typed into at once
        await wait_for(pilot, lambda: isinstance(app.screen, EditScreen)
                       and "xy" in app.screen.query_one("#edit-value").text)  # type: ignore[attr-defined]
        assert app.conversation.prompt.text == ""


@pytest.mark.anyio
async def test_f2_then_enter_picks_a_profile_and_does_not_send_the_prompt(
        make_app: Callable[..., SpecChatApp]) -> None:
    """Before, Enter reached the prompt box ahead of the picker and sent the half-typed prompt."""
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        app.conversation.prompt.insert("half a thought")
        switched: list[str] = []
        app.switch_profile = switched.append  # type: ignore[method-assign]
        type_at_once(app, ["f2", "down", "enter"])
        await wait_for(pilot, lambda: switched != [])
        assert switched == ["lookup"] and app.conversation.prompt.text == "half a thought"
        assert len(app.screen_stack) == 1 and app.conversation.chat_id is None  # nothing was sent


@pytest.mark.anyio
async def test_the_apps_keys_are_the_dialogs_while_one_is_open(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await pilot.press("f1")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
        await pilot.press("f2", "f9", "ctrl+n")
        await pilot.pause(0.2)
        assert len(app.screen_stack) == 2 and isinstance(app.screen, HelpScreen)
        await pilot.press("f1")  # closes the help it opened
        await wait_for(pilot, lambda: len(app.screen_stack) == 1)
