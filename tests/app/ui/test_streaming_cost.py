"""What keeps streaming cheap: every core to the engine, and a streamed code block of an unknown language."""
from __future__ import annotations

from collections.abc import Callable

import pytest

from app.ui import pacing
from app.ui.app import SpecChatApp
from app.ui.loading import UI_NICE, engine_threads, ui_nice
from app.ui.widgets.chat_view import AssistantMessage
from app.ui.widgets.reply_markdown import ReplyFence
from tests.app.fakes import FakeLoader
from tests.app.helpers import ready, send, wait_for

pytestmark = pytest.mark.anyio


def test_the_engine_takes_every_core_and_the_ui_keeps_its_priority(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECCHAT_THREADS", raising=False)
    monkeypatch.delenv("SPECCHAT_UI_NICE", raising=False)
    assert ui_nice() == UI_NICE == 0  # a lowered UI starved on a busy machine (echo after a second)
    for cores in (1, 2, 8):
        monkeypatch.setattr("os.cpu_count", lambda: cores)
        assert engine_threads() is None  # torch's default: every core (it was one of two, 0.66x of generate)
    monkeypatch.setenv("SPECCHAT_UI_NICE", "10")
    assert ui_nice() == 10 and engine_threads() is None
    monkeypatch.setenv("SPECCHAT_THREADS", "3")
    assert engine_threads() == 3


async def test_a_streamed_code_block_of_an_unknown_language_renders(make_app: Callable[..., SpecChatApp],
                                                                    loader: FakeLoader) -> None:
    loader.backend_kwargs["script"] = [[("```weird-", "draft"), ("lang\nx", "target")], [(" = 1\n```\nDone.", "target")]]
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await send(pilot, "code please")
        await wait_for(pilot, lambda: not app.conversation.generating)
        reply = app.query(AssistantMessage).last()
        assert reply.text.startswith("```weird-lang") and reply.query_one(ReplyFence).code == "x = 1"


async def test_each_paint_of_a_streaming_reply_first_asks_the_engine_for_a_core(
        make_app: Callable[..., SpecChatApp], loader: FakeLoader) -> None:
    """On 2 cores a paint stalled both of the engine's threads; with a core lent for it the engine
    kept 0.956-0.981 of its speed while the app painted, against 0.927-0.951 (app/ui/pacing.py)."""
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        backend = loader.backends[0]
        asked: list[float | None] = []
        backend.yield_to_ui = lambda seconds=None: asked.append(seconds)  # type: ignore[attr-defined]
        await send(pilot, "hello")
        await wait_for(pilot, lambda: not app.conversation.generating)
        reply = app.query(AssistantMessage).last()
        assert reply.text == "".join(text for round_ in backend.script for text, _ in round_)  # nothing held back is lost
        assert asked and set(asked) == {pacing.PAINT_YIELD_S}
