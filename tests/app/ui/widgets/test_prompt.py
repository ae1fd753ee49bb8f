"""The prompt box: Enter sends, ctrl+j and friends add a line, Up/Down recall earlier prompts, PageUp/Down scroll."""
from __future__ import annotations

from collections.abc import Callable

import pytest
from textual import on
from textual.app import App, ComposeResult

from app.ui.app import SpecChatApp
from app.ui.widgets.chat_view import UserMessage
from app.ui.widgets.prompt import PromptArea
from tests.app.helpers import ready, send, wait_for

pytestmark = pytest.mark.anyio


class Box(App[None]):
    """A prompt box alone; what it submits is collected in ``sent``."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[str] = []

    def compose(self) -> ComposeResult:
        yield PromptArea(id="prompt")

    def on_mount(self) -> None:
        self.query_one(PromptArea).focus()

    @on(PromptArea.Submitted)
    def took(self, event: PromptArea.Submitted) -> None:
        assert event.control is event.prompt
        self.sent.append(event.text)


async def test_enter_posts_the_text_and_empties_the_box() -> None:
    app = Box()
    async with app.run_test() as pilot:
        box = app.query_one(PromptArea)
        await pilot.press(*"hi", "shift+enter", *"yo", "alt+enter", "enter")
        await wait_for(pilot, lambda: app.sent == ["hi\nyo\n"])
        assert box.text == "" and box.prompts == []  # remembering is the listener's choice


async def test_whitespace_alone_is_not_sent_and_stays() -> None:
    app = Box()
    async with app.run_test() as pilot:
        box = app.query_one(PromptArea)
        await pilot.press("space", "ctrl+j", "enter")
        await pilot.pause()
        assert app.sent == [] and box.text == " \n"


async def test_history_keeps_a_repeat_once_and_skips_blank_prompts() -> None:
    app = Box()
    async with app.run_test():
        box = app.query_one(PromptArea)
        box.set_history(["one", "two", "two", "  ", "one"])
        assert box.prompts == ["one", "two", "one"]
        box.remember("one")
        assert box.prompts == ["one", "two", "one"]
        box.set_history([])
        assert box.prompts == []


async def test_up_in_a_box_with_new_text_moves_the_cursor_not_the_history() -> None:
    app = Box()
    async with app.run_test() as pilot:
        box = app.query_one(PromptArea)
        box.set_history(["earlier"])
        await pilot.press("a", "ctrl+j", "b", "up", "x")
        assert box.text == "ax\nb"
        box.clear()
        await pilot.press("down")  # Down in an empty box: nothing newer than the box
        assert box.text == ""
        await pilot.press("up", "backspace", "up")  # an edited recalled prompt is new text
        assert box.text == "earlie"


async def test_restore_puts_refused_text_ahead_of_what_was_typed_since() -> None:
    app = Box()
    async with app.run_test() as pilot:
        box = app.query_one(PromptArea)
        box.restore("refused")
        assert box.text == "refused"
        box.load_text("typed since")
        box.restore("first\nsecond")
        assert box.text == "first\nsecond\ntyped since" and box.cursor_location == box.document.end
        await pilot.press("pageup", "pagedown")  # nothing to scroll: no error
        assert box.text == "first\nsecond\ntyped since"


async def test_newline_key_does_not_send(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        prompt = app.query_one(PromptArea)
        prompt.focus()
        await pilot.press("a", "ctrl+j", "b")
        assert prompt.text == "a\nb" and not app.query(UserMessage)
        await pilot.press("enter")
        await wait_for(pilot, lambda: not app.conversation.generating and app.query(UserMessage))
        assert app.query_one(UserMessage).text == "a\nb" and prompt.text == ""


async def test_up_and_down_recall_earlier_prompts(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        for text in ("first prompt", "second prompt"):
            await send(pilot, text)
            await wait_for(pilot, lambda: not app.conversation.generating)
        prompt = app.conversation.prompt
        await pilot.press("up")
        assert prompt.text == "second prompt"
        await pilot.press("up")
        assert prompt.text == "first prompt"
        await pilot.press("up")
        assert prompt.text == "first prompt"  # the oldest stays
        await pilot.press("down")
        assert prompt.text == "second prompt"
        await pilot.press("down")
        assert prompt.text == ""
        # An edited recalled prompt is a new text: Up moves the cursor again, it does not recall.
        await pilot.press("up", "!")
        assert prompt.text == "second prompt!"
        await pilot.press("up")
        assert prompt.text == "second prompt!"


async def scrolled_chat(pilot, app: SpecChatApp, prompts: int):  # type: ignore[no-untyped-def]
    """The chat log after ``prompts`` exchanges, followed to its end."""
    await ready(pilot)
    for i in range(prompts):
        await send(pilot, f"question {i}")
        await wait_for(pilot, lambda: not app.conversation.generating)
    log = app.conversation.chat_log
    await wait_for(pilot, lambda: log.max_scroll_y > 0 and log.scroll_y == log.max_scroll_y)
    return log


async def test_page_keys_scroll_the_chat_from_the_prompt_box(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(100, 24)) as pilot:
        log = await scrolled_chat(pilot, app, 4)
        bottom = log.scroll_y
        await pilot.press("pageup")
        await wait_for(pilot, lambda: log.scroll_y < bottom)
        assert app.focused is app.conversation.prompt
        await pilot.press("pagedown")
        await wait_for(pilot, lambda: log.scroll_y == bottom)


async def test_page_keys_in_one_read_scroll_a_page_each(make_app: Callable[..., SpecChatApp]) -> None:
    """Two PageUps in one read scrolled one page (Textual's page scroll waits for a refresh), and
    PageDowns then stopped short of the end (a reviewer's)."""
    from textual import events

    app = make_app()
    async with app.run_test(size=(100, 24)) as pilot:
        log = await scrolled_chat(pilot, app, 8)
        bottom, page = log.scroll_y, log.scrollable_content_region.height
        assert bottom >= 2 * page
        for _ in range(2):
            app.post_message(events.Key("pageup", None))
        await wait_for(pilot, lambda: log.scroll_y == bottom - 2 * page)
        for _ in range(3):
            app.post_message(events.Key("pagedown", None))
        await wait_for(pilot, lambda: log.scroll_y == log.max_scroll_y)
