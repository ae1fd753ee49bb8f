"""At 80×24 (issue 37): every footer key shows whole, notices leave the prompt box readable,
and a dialog's hint is shown whole (wrapped) instead of cut at the dialog's edge."""
from __future__ import annotations

from collections.abc import Callable

import pytest
from textual.widgets import Label
from textual.widgets._footer import FooterKey
from textual.widgets._toast import Toast

from app.ui.app import SpecChatApp
from app.ui.notices import notice
from app.ui.screens.chats import ChatsScreen
from tests.app.helpers import ready, wait_for

pytestmark = pytest.mark.anyio


async def test_every_footer_key_fits_in_80_columns(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        keys = list(app.screen.query(FooterKey))
        shown = {k.key_display for k in keys}
        assert {"f1", "f2", "f3", "f4", "f5", "f6", "f7", "^n", "^q"} <= shown
        for key in keys:
            width = len(f"{key.key_display} {key.description}")
            assert key.region.right <= 80 and key.region.width >= width, (key.key_display, key.region)
        in_order = [k.key_display for k in sorted(keys, key=lambda k: k.region.x)]
        assert in_order == ["f1", "f2", "f3", "f4", "f5", "f6", "f7", "^q", "^n"]  # it read "f6 f7 ^q f1 …"


async def test_a_notice_does_not_cover_the_prompt_box(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await ready(pilot)
        notice(app, "A notice of several lines\nsecond line\nthird line\nfourth line", title="Test")
        await wait_for(pilot, lambda: len(app.screen.query(Toast)) > 0 and all(
            t.region.height > 0 for t in app.screen.query(Toast)))
        prompt = app.conversation.prompt.region
        for toast in app.screen.query(Toast):
            assert not toast.region.overlaps(prompt), (toast.region, prompt)


async def test_a_dialog_hint_wraps_instead_of_being_cut(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        await pilot.press("f3")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatsScreen))
        await pilot.pause()
        hint = next(label for label in app.screen.query(Label) if "dialog-hint" in label.classes)
        text = str(hint.render())
        assert text.endswith("Esc closes")
        box = hint.parent.content_region  # type: ignore[union-attr]
        assert hint.region.right <= box.right, (hint.region, box)  # inside the dialog, not cut at its edge
        assert hint.region.height >= 2 and hint.region.width * hint.region.height >= len(text)  # wrapped


async def test_while_a_reply_streams_at_80_columns_the_footer_still_shows_stop_and_quit(
        make_app: Callable[..., SpecChatApp]) -> None:
    from tests.app.fakes import FakeLoader
    from tests.app.helpers import send_held

    loader = FakeLoader(hold_after=2)
    app = make_app(loader=loader)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        backend = await send_held(pilot, loader, "hi")
        await pilot.pause(0.2)
        footer = app.screen._compositor.render_strips()[-1].text
        assert footer.startswith("esc Stop f1 Help") and "^q Quit" in footer
        backend.release.set()


async def test_the_colour_view_at_80_columns_names_its_colours_on_the_hud_line(
        make_app: Callable[..., SpecChatApp]) -> None:
    """F4 at 80x24 coloured the tokens with no legend anywhere (only the full side panel had one)."""
    from tests.app.helpers import send

    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        await send(pilot, "hi")
        await wait_for(pilot, lambda: not app.conversation.generating)
        await pilot.press("f4")
        await pilot.pause(0.2)
        line = str(app.query_one("#hud-line").render())
        assert line.startswith(" draft accepted    target produced ")
        await pilot.press("f4")
        await pilot.pause(0.2)
        assert "draft accepted" not in str(app.query_one("#hud-line").render())
