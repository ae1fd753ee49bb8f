"""Keys and input: Enter sends exactly what was typed, however fast; a paste never sends; prompts outlive a restart."""
from __future__ import annotations

from collections.abc import Callable

import pytest
from textual import events

from app.ui.app import SpecChatApp
from app.ui.widgets.chat_view import UserMessage
from tests.app.fakes import FakeLoader
from tests.app.helpers import ready, send, wait_for

pytestmark = pytest.mark.anyio


def burst(app: SpecChatApp, text: str) -> None:
    """Queue every key of ``text`` and Enter at once, without waiting between them."""
    for ch in text:
        app.post_message(events.Key(ch, ch))
    app.post_message(events.Key("enter", "\r"))


async def test_text_and_enter_in_one_burst_send_the_whole_text(make_app: Callable[..., SpecChatApp],
                                                               loader: FakeLoader) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        texts = ["Now shorten the text", "second one", "third"]
        for text in texts:
            burst(app, text)
        await wait_for(pilot, lambda: len(loader.backends[0].calls) == 3 and not app.conversation.generating)
        assert [m.text for m in app.query(UserMessage)] == texts
        assert [c[-1].content for c in loader.backends[0].calls] == texts
        assert app.conversation.prompt.text == ""


async def test_newline_keys_in_a_burst_land_where_typed(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        app.conversation.prompt.focus()
        for key, ch in [("a", "a"), ("b", "b"), ("ctrl+j", "\n"), ("c", "c")]:
            app.post_message(events.Key(key, ch))
        await wait_for(pilot, lambda: app.conversation.prompt.text == "ab\nc")


@pytest.mark.parametrize("keys, before, after", [
    ([("home", None), ("H", "H")], "hello", "Hhello"),
    ([("ctrl+e", None), ("E", "E")], "hello", "helloE"),
    ([("ctrl+u", None), *[(c, c) for c in "Zab"]], "Q", "Zab"),
    ([("ctrl+w", None), ("W", "W")], "hello", "W"),
    ([("left", None), ("left", None), ("X", "X")], "hello", "helXlo"),
], ids=["home", "ctrl+e", "ctrl+u", "ctrl+w", "left"])
async def test_editing_keys_in_a_burst_act_before_the_letters_after_them(
        make_app: Callable[..., SpecChatApp], keys: list[tuple[str, str | None]], before: str, after: str) -> None:
    """The box's own editing keys (Home, ctrl+e, ctrl+u, ctrl+w…) in one read with letters: the
    letters landed first (a reviewer's `[Home "H"]` gave "helloH"), as over a laggy SSH link."""
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        prompt = app.conversation.prompt
        prompt.focus()
        prompt.load_text(before)
        prompt.move_cursor(prompt.document.end)
        await pilot.pause()
        for key, ch in keys:
            app.post_message(events.Key(key, ch))
        await wait_for(pilot, lambda: prompt.text == after)


async def test_editing_keys_in_a_burst_keep_their_order_in_a_dialogs_input(make_app: Callable[..., SpecChatApp]) -> None:
    """F3's rename box, `ctrl+u Quick` in one read: the box was left empty (a reviewer's)."""
    from textual.widgets import Input

    from app.ui.screens.edit import EditScreen

    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        answers: list[object] = []
        app.push_screen(EditScreen("Rename chat", "Old title"), answers.append)
        await wait_for(pilot, lambda: isinstance(app.focused, Input))
        await pilot.pause()
        for key, ch in [("ctrl+u", None), *[(c, c) for c in "Quick"], ("home", None), ("A", "A"), ("enter", "\r")]:
            app.post_message(events.Key(key, ch))
        await wait_for(pilot, lambda: answers == ["AQuick"])


async def test_paste_keeps_newlines_and_does_not_send(make_app: Callable[..., SpecChatApp],
                                                      loader: FakeLoader) -> None:
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        app.conversation.prompt.focus()
        app.post_message(events.Paste("line one\nline two\n"))
        await wait_for(pilot, lambda: app.conversation.prompt.text == "line one\nline two\n")
        assert not loader.backends[0].calls and not app.query(UserMessage)


async def test_prompt_history_survives_a_restart(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "remember me")
        await wait_for(pilot, lambda: not app.conversation.generating)
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        await pilot.press("up")
        assert app.conversation.prompt.text == "remember me"


@pytest.mark.parametrize("key", ["f8", "f9"])
async def test_dialog_opened_as_a_reply_finishes_keeps_the_keys(make_app: Callable[..., SpecChatApp], key: str) -> None:
    """F8/F9 pressed just before the reply's end: the dialog opens and keeps focus (the end of
    a reply used to pull focus back to the prompt box behind the dialog)."""
    from textual.widgets import Input, TextArea

    from app.ui.screens.edit import EditScreen

    loader = FakeLoader(hold_after=4)
    app = make_app(loader=loader)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "hi")
        await wait_for(pilot, loader.backends[0].held.is_set)
        await pilot.press(key)
        await wait_for(pilot, lambda: isinstance(app.screen, EditScreen))
        loader.backends[0].release.set()
        await wait_for(pilot, lambda: not app.conversation.generating)
        await pilot.pause(0.1)
        assert isinstance(app.screen, EditScreen)
        assert isinstance(app.focused, (Input, TextArea)) and app.focused.screen is app.screen
        await pilot.press("z")
        value = app.focused.value if isinstance(app.focused, Input) else app.focused.text
        assert "z" in value and "z" not in app.conversation.prompt.text


async def test_tab_in_the_prompt_box_indents_and_what_follows_is_not_lost(make_app: Callable[..., SpecChatApp],
                                                                          loader: FakeLoader) -> None:
    """Tab moved the focus to the chat log, where the keys typed next, Enter too, were dropped; three
    Tabs brought it back (a hostile tester's). A click on the log or the HUD takes no focus either."""
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await pilot.press("a", "b", "c", "tab", "d", "e", "f", "enter")
        await wait_for(pilot, lambda: len(loader.backends[0].calls) == 1)
        sent = loader.backends[0].calls[0][-1].content
        assert sent.startswith("abc") and sent.endswith("def") and sent[3:-3].strip() == ""
        await pilot.click("#chat-log")
        await pilot.click("#hud")
        assert app.focused is app.conversation.prompt
