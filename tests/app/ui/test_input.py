"""Keys and input: Enter sends exactly what was typed, however fast; prompts queue while busy; history."""
from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from textual import events

from app.ui.app import SpecChatApp
from app.ui.widgets.chat_view import AssistantMessage, UserMessage
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


async def test_paste_keeps_newlines_and_does_not_send(make_app: Callable[..., SpecChatApp],
                                                      loader: FakeLoader) -> None:
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        app.conversation.prompt.focus()
        app.post_message(events.Paste("line one\nline two\n"))
        await wait_for(pilot, lambda: app.conversation.prompt.text == "line one\nline two\n")
        assert not loader.backends[0].calls and not app.query(UserMessage)


async def test_message_sent_while_loading_waits_and_goes_out_when_ready(
    make_app: Callable[..., SpecChatApp], loader: FakeLoader
) -> None:
    loader.gate = threading.Event()
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.engine.loading)
        await send(pilot, "early question")
        await pilot.pause()
        waiting = app.query_one(UserMessage)
        assert waiting.has_class("-queued") and "waiting for the model to load" in str(waiting.border_subtitle)
        assert app.conversation.prompt.text == "" and not app.query(AssistantMessage)
        loader.gate.set()
        await wait_for(pilot, lambda: loader.backends and len(loader.backends[0].calls) == 1 and not app.conversation.generating)
        assert not waiting.has_class("-queued") and not waiting.border_subtitle
        assert loader.backends[0].calls[0][-1].content == "early question"
        assert app.query_one(AssistantMessage).finish_reason == "eos"


async def test_prompt_sent_while_a_reply_streams_follows_it(make_app: Callable[..., SpecChatApp]) -> None:
    loader = FakeLoader(hold_after=1)
    app = make_app(loader=loader)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "one")
        backend = loader.backends[0]
        await wait_for(pilot, backend.held.is_set)
        await send(pilot, "two")
        await pilot.pause()
        assert app.query(UserMessage).last().has_class("-queued") and len(backend.calls) == 1
        backend.hold_after = None
        backend.release.set()
        await wait_for(pilot, lambda: len(backend.calls) == 2 and not app.conversation.generating)
        # The transcript keeps its order: you, reply, you, reply.
        kinds = [type(w).__name__ for w in app.conversation.chat_log.children]
        assert kinds == ["UserMessage", "AssistantMessage", "UserMessage", "AssistantMessage"]
        assert [(m.role, m.content) for m in backend.calls[1]][-3:] == [
            ("user", "one"), ("assistant", app.query(AssistantMessage).first().text), ("user", "two")]


async def test_failed_load_returns_waiting_prompts_to_the_box(make_app: Callable[..., SpecChatApp],
                                                             loader: FakeLoader) -> None:
    from engine.errors import ModelSourceError

    loader.gate = threading.Event()
    loader.error = ModelSourceError("no such model")
    app = make_app()
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.engine.loading)
        await send(pilot, "keep me")
        loader.gate.set()
        await wait_for(pilot, lambda: not app.engine.loading)
        await pilot.pause()
        assert app.conversation.prompt.text == "keep me" and not app.query(UserMessage)


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


async def test_page_keys_scroll_the_chat_from_the_prompt_box(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(100, 24)) as pilot:
        await ready(pilot)
        for i in range(4):
            await send(pilot, f"question {i}")
            await wait_for(pilot, lambda: not app.conversation.generating)
        log = app.conversation.chat_log
        await wait_for(pilot, lambda: log.max_scroll_y > 0 and log.scroll_y == log.max_scroll_y)
        bottom = log.scroll_y
        await pilot.press("pageup")
        await wait_for(pilot, lambda: log.scroll_y < bottom)
        assert app.focused is app.conversation.prompt
        await pilot.press("pagedown")
        await wait_for(pilot, lambda: log.scroll_y == bottom)


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
