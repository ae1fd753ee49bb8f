"""The Conversation widget: one chat's transcript, queue, reply stream and HUD fold, driven directly."""
from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from app.ui.app import SpecChatApp
from app.ui.widgets.chat_view import AssistantMessage, UserMessage
from engine.events import ChatMessage
from tests.app.fakes import FakeLoader
from tests.app.helpers import ready, wait_for

pytestmark = pytest.mark.anyio


async def test_prompts_queue_while_the_model_loads_and_go_out_in_order(make_app: Callable[..., SpecChatApp],
                                                                      loader: FakeLoader) -> None:
    loader.gate = threading.Event()
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        conversation = app.conversation
        conversation.queue_prompt("first")
        conversation.queue_prompt("second")
        assert [w.text for w in conversation.queued] == ["first", "second"]
        assert all(w.waiting for w in conversation.queued) and conversation.turns() == []
        loader.gate.set()
        await ready(pilot)
        await wait_for(pilot, lambda: len(loader.backends[0].calls) == 2 and not conversation.generating)
        second_request = loader.backends[0].calls[1]
        assert [m.content for m in second_request if m.role == "user"] == ["first", "second"]
        assert second_request[-2].role == "assistant"  # the first reply, read off the transcript


async def test_a_new_chat_puts_unsent_prompts_back_in_the_box(make_app: Callable[..., SpecChatApp],
                                                              loader: FakeLoader) -> None:
    loader.gate = threading.Event()
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        conversation = app.conversation
        conversation.queue_prompt("keep me")
        await conversation.new_chat()
        assert conversation.queued == [] and conversation.prompt.text == "keep me"
        assert not conversation.chat_log.query(UserMessage)
        loader.gate.set()
        await ready(pilot)


async def test_regenerate_sends_the_prompt_again_without_the_earlier_reply(make_app: Callable[..., SpecChatApp],
                                                                          loader: FakeLoader) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        conversation = app.conversation
        conversation.send_prompt("hi")
        await wait_for(pilot, lambda: not conversation.generating)
        first = conversation.query_one(AssistantMessage)
        conversation.regenerate()
        await wait_for(pilot, lambda: len(conversation.query(AssistantMessage)) == 2 and not conversation.generating)
        assert first.superseded
        sent = loader.backends[0].calls[-1]
        assert [m for m in sent if m.role != "system"] == [ChatMessage("user", "hi")]
        assert [t.role for t in conversation.turns()] == ["user", "assistant"]


async def test_an_edited_prompt_replaces_the_exchange_it_edits(make_app: Callable[..., SpecChatApp],
                                                              loader: FakeLoader) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        conversation = app.conversation
        conversation.send_prompt("hi")
        await wait_for(pilot, lambda: not conversation.generating)
        last = conversation.last_exchange()
        assert last is not None
        conversation.ask_edited(*last, "hello\n")
        await wait_for(pilot, lambda: len(conversation.query(AssistantMessage)) == 2 and not conversation.generating)
        assert last[0].superseded and last[1] is not None and last[1].superseded
        assert [m.content for m in loader.backends[0].calls[-1] if m.role == "user"] == ["hello"]


async def test_the_hud_folds_to_one_line_below_110_columns_unless_chosen(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        conversation = app.conversation
        conversation.fit_hud(100)
        assert conversation.hud.has_class("-line")
        conversation.fit_hud(140)
        assert not conversation.hud.has_class("-line")
        conversation.toggle_hud(140)  # the user's choice holds at any width
        conversation.fit_hud(200)
        assert conversation.hud.has_class("-line")
