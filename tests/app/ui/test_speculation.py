"""A reply that switched speculation off mid-way: its footer, the HUD, and F5 afterwards."""
from __future__ import annotations

from collections.abc import Callable

import pytest

from app.ui.app import SpecChatApp
from app.ui.widgets.chat_view import AssistantMessage
from app.ui.widgets.hud import Hud
from tests.app.fakes import FakeLoader
from tests.app.helpers import ready, send, wait_for

pytestmark = pytest.mark.anyio


async def test_mixed_mode_reply_footer_gives_each_mode_its_share(make_app: Callable[..., SpecChatApp]) -> None:
    loader = FakeLoader(auto_off_round=3)  # rounds 1-3 speculate (8 tokens), rounds 4-5 run plain (4)
    app = make_app(loader=loader)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "hi")
        await wait_for(pilot, lambda: not app.conversation.generating)
        reply = app.query_one(AssistantMessage)
        footer = str(reply.query_one(".reply-footer").render())
        assert "model draft on 67% · plain 33%" in footer
        assert "plain decoding" not in footer  # it did not run plain throughout
        assert "accepted" in footer and "α/token" in footer
        hud = app.query_one(Hud)
        hud.flush()
        stats = str(hud.query_one("#hud-stats").render())
        assert "model draft on 67% · plain 33%" in stats
        assert not any(n.title == "Engine" for n in app._notifications)  # quietly: no notice per reply


async def test_f5_after_an_automatic_switch_off_turns_speculation_on(make_app: Callable[..., SpecChatApp]) -> None:
    loader = FakeLoader(auto_off_round=2)
    app = make_app(loader=loader)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "hi")
        await wait_for(pilot, lambda: not app.conversation.generating)
        backend = loader.backends[0]
        hud = app.query_one(Hud)
        hud.flush()
        engine = str(hud.query_one("#hud-engine").render())
        assert "plain decoding" in engine and "speculation off: not paying here" in engine  # plain words
        await pilot.press("f5")
        assert backend.speculation is True  # the first press turns it ON, and says from what
        assert list(app._notifications)[-1].message == (
            "Speculation was off (automatic: not paying here); now forced on until you press F5 again.")
        hud.flush()
        assert "speculative" in str(hud.query_one("#hud-engine").render())
        await pilot.press("f5")
        assert backend.speculation is False
        assert list(app._notifications)[-1].message == (
            "Speculation off (by you): plain decoding until you press F5 again.")
        hud.flush()
        assert "switched off by you" in str(hud.query_one("#hud-engine").render())
        await pilot.press("f5")
        assert backend.speculation is True
        assert list(app._notifications)[-1].message == (
            "Speculation on: it steps aside by itself where it does not pay.")


async def test_the_folded_hud_says_speculation_stepped_aside(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app(loader=FakeLoader(auto_off_round=2))
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        await send(pilot, "hi")
        await wait_for(pilot, lambda: not app.conversation.generating)
        hud = app.query_one(Hud)
        hud.flush()
        line = str(hud.query_one("#hud-line").render())
        assert "speculation off: not paying here" in line


async def test_f5_says_why_speculation_cannot_come_on(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app(loader=FakeLoader(fallback_reason="the draft does not fit in memory"))
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await pilot.press("f5")
        message = list(app._notifications)[-1].message
        assert message == "Speculation cannot be switched on: the draft does not fit in memory."
