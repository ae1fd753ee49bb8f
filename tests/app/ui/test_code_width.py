"""A code block wider than the chat (beside the full HUD, at 80 columns or at 160) gets a scrollbar
to reach the rest of its lines; one that fits gets none (issue 37: "code is clipped beside the
full HUD")."""
from __future__ import annotations

from collections.abc import Callable

import pytest

from app.ui.app import SpecChatApp
from app.ui.widgets.chat_view import AssistantMessage
from app.ui.widgets.hud import Hud
from app.ui.widgets.reply_markdown import ReplyFence
from tests.app.fakes import FakeLoader
from tests.app.helpers import ready, send, wait_for

pytestmark = pytest.mark.anyio

WIDE = "result = compute(" + ", ".join(f"argument_{i}" for i in range(14)) + ")"


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
async def test_a_wide_code_block_scrolls_and_a_narrow_one_does_not(make_app: Callable[..., SpecChatApp],
                                                                   loader: FakeLoader, size: tuple[int, int]) -> None:
    text = f"Two blocks:\n\n```python\n{WIDE}\n```\n\n```python\nx = 1\n```\n"
    loader.backend_kwargs["script"] = [[(text, "target")]]
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await ready(pilot)
        hud = app.query_one(Hud)
        if hud.has_class("-line"):  # folded below 110 columns: F6 brings the full HUD back
            await pilot.press("f6")
            await pilot.pause()
        assert not hud.has_class("-line")  # the full HUD beside the chat
        await send(pilot, "code please")
        await wait_for(pilot, lambda: not app.conversation.generating)
        await pilot.pause()
        wide, narrow = app.query(AssistantMessage).last().query(ReplyFence)
        assert wide.code == WIDE and wide.size.width < len(WIDE)  # clipped by the chat's width
        assert wide.max_scroll_x > 0 and wide.show_horizontal_scrollbar  # and the rest is reachable
        wide.scroll_to(x=wide.max_scroll_x, animate=False)
        await pilot.pause()
        assert wide.scroll_x == wide.max_scroll_x >= len(WIDE) - wide.size.width
        assert not narrow.show_horizontal_scrollbar and narrow.max_scroll_x == 0
