"""While a reply streams the UI wakes only to paint: the HUD's timer rests and the prompt's
cursor stops blinking (each wake-up on 2 cores takes a moment from an engine thread)."""
from __future__ import annotations

from collections.abc import Callable

import pytest

from app.ui.app import SpecChatApp
from tests.app.fakes import FakeLoader
from tests.app.helpers import ready, send_held, wait_for

pytestmark = pytest.mark.anyio


async def test_the_hud_timer_and_the_cursor_rest_while_a_reply_streams_and_come_back_after(
        make_app: Callable[..., SpecChatApp]) -> None:
    loader = FakeLoader(hold_after=1)
    app = make_app(loader=loader)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        conversation = app.conversation
        timer = conversation._hud_timer
        assert conversation.prompt.cursor_blink and timer._active.is_set()
        backend = await send_held(pilot, loader, "first")
        assert not timer._active.is_set()  # paused mid-reply
        assert not conversation.prompt.cursor_blink
        backend.release.set()
        await wait_for(pilot, lambda: not conversation.generating)
        assert timer._active.is_set()
        assert conversation.prompt.cursor_blink
