"""A long saved chat opens with only what is on screen mounted; the rest comes as the user scrolls up."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from app.store.history import History
from app.ui.app import SpecChatApp
from app.ui.widgets.chat_log import OlderMessages
from app.ui.widgets.chat_view import AssistantMessage, UserMessage
from tests.app.helpers import ready, send, wait_for

pytestmark = pytest.mark.anyio

TURNS = 30


def _long_chat() -> int:
    history = History.open()
    chat = history.create_chat("long", "fast")
    for n in range(TURNS):
        history.add_message(chat, "user", f"question {n}", profile="fast")
        history.add_message(chat, "assistant", f"answer **{n}**", profile="fast", finish_reason="eos",
                            pieces=[(f"answer **{n}**", "draft" if n == 0 else "target")])
    history.close()
    return chat


def _shown(app: SpecChatApp) -> list[str]:
    return [w.text for w in app.conversation.chat_log.children if isinstance(w, (UserMessage, AssistantMessage))]


async def test_a_long_chat_mounts_the_newest_first_and_the_rest_on_scrolling_up(
    make_app: Callable[..., SpecChatApp], specchat_dirs: Path
) -> None:
    chat = _long_chat()
    every = [t for n in range(TURNS) for t in (f"question {n}", f"answer **{n}**")]
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await app.open_chat(chat)
        await pilot.pause()
        log = app.conversation.chat_log
        shown = _shown(app)
        assert 2 <= len(shown) < len(every) // 2 and shown == every[-len(shown):]  # the newest, in order
        assert "earlier messages" in str(log.query_one(OlderMessages).render())
        # What the model sees, what copying offers and the colour legend never depend on scrolling.
        assert [m.content for m in app.conversation.turns()] == every
        assert [text for _, text in app.conversation.messages()] == every
        assert "draft" in app.conversation.hud.seen_sources
        await pilot.press("f4")  # the colour view reaches the messages not mounted yet
        for _ in range(20):
            if not log.older:
                break
            top_before = next(w for w in log.children if isinstance(w, (UserMessage, AssistantMessage)))
            log.scroll_home(animate=False, immediate=True)
            await wait_for(pilot, lambda: top_before is not next(
                w for w in log.children if isinstance(w, (UserMessage, AssistantMessage))))
            await pilot.pause()
            # the message that was at the top is still in view: the view did not jump
            assert log.scroll_y > 0 or not log.older
            assert top_before.region.y >= log.region.y or not log.older
        assert log.older == [] and not log.query(OlderMessages)
        assert _shown(app) == every  # the oldest message came, and all in order
        assert all(m.has_class("-sources") for m in log.query(AssistantMessage))
        await send(pilot, "one more")
        await wait_for(pilot, lambda: not app.conversation.generating and len(_shown(app)) == len(every) + 2)
        assert _shown(app)[-2] == "one more"


async def test_opening_another_chat_forgets_the_messages_not_mounted(
    make_app: Callable[..., SpecChatApp], specchat_dirs: Path
) -> None:
    chat = _long_chat()
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await app.open_chat(chat)
        await pilot.pause()
        assert app.conversation.chat_log.older
        await app.action_new_chat()
        await pilot.pause()
        assert app.conversation.chat_log.older == [] and app.conversation.turns() == []
