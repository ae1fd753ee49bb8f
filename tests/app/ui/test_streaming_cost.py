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


async def reply_and_asks(app: SpecChatApp, loader: FakeLoader) -> tuple[str, str, list[float | None]]:
    """One reply in ``app``: (its text, the text the engine sent, each ``yield_to_ui`` the UI asked)."""
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        backend = loader.backends[0]
        asked: list[float | None] = []
        backend.yield_to_ui = lambda seconds=None: asked.append(seconds)  # type: ignore[attr-defined]
        await send(pilot, "hello")
        await wait_for(pilot, lambda: not app.conversation.generating)
        sent = "".join(text for round_ in backend.script for text, _ in round_)
        return app.query(AssistantMessage).last().text, sent, asked


async def test_each_paint_of_a_streaming_reply_first_asks_the_engine_for_a_core(
        make_app: Callable[..., SpecChatApp], loader: FakeLoader) -> None:
    """On 2 cores a paint displaced one of the engine's two threads and the other waited for it; with
    a core lent for it the engine kept a median 0.956 of its speed while the app painted, against
    0.944 (app/ui/pacing.py)."""
    shown, sent, asked = await reply_and_asks(make_app(), loader)
    assert shown == sent  # nothing held back for the lent core is lost
    assert asked and set(asked) == {pacing.PAINT_YIELD_S}


async def test_with_no_core_to_lend_set_a_reply_paints_without_asking(
        make_app: Callable[..., SpecChatApp], loader: FakeLoader, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pacing, "PAINT_YIELD_S", 0.0)  # scripts/paint_cost.py --lend-s 0
    shown, sent, asked = await reply_and_asks(make_app(), loader)
    assert shown == sent and asked == []
