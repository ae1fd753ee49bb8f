"""Snapshots of what users see: the main screen, the HUD mid-reply, the profile picker.

Deterministic by construction: fixed terminal size, the scripted fake backend
(fixed statistics, no clocks), the prompt's cursor blink off and toasts cleared.
Update with ``pytest tests/app/ui/test_snapshots.py --snapshot-update`` after a
deliberate visual change, and look at the report before committing.
"""
from __future__ import annotations

from collections.abc import Callable

from textual.pilot import Pilot

from app.ui.app import SpecChatApp
from app.ui.screens.profiles import ProfilePicker
from app.ui.widgets.hud import Hud
from app.ui.widgets.prompt import PromptArea
from tests.app.fakes import FakeLoader
from tests.app.helpers import ready, send, wait_for

SIZE = (120, 36)


async def settle(pilot: Pilot) -> None:
    """Freeze what would otherwise move between runs."""
    app = pilot.app
    app.query_one(PromptArea).cursor_blink = False
    app.clear_notifications()
    app.query_one(Hud).flush()
    await pilot.pause()


def test_main_screen(snap_compare: Callable[..., bool], make_app: Callable[..., SpecChatApp]) -> None:
    async def run_before(pilot: Pilot) -> None:
        await ready(pilot)
        await settle(pilot)

    assert snap_compare(make_app(), terminal_size=SIZE, run_before=run_before)


def test_hud_mid_reply(snap_compare: Callable[..., bool], make_app: Callable[..., SpecChatApp]) -> None:
    loader = FakeLoader(hold_after=3)

    async def run_before(pilot: Pilot) -> None:
        app = pilot.app
        await ready(pilot)
        await send(pilot, "Show me some code")
        await wait_for(pilot, loader.backends[0].held.is_set)
        hud = app.query_one(Hud)
        await wait_for(pilot, lambda: hud.stats is not None and hud.stats.rounds == 3)
        await pilot.pause(0.1)
        await settle(pilot)

    assert snap_compare(make_app(loader=loader), terminal_size=SIZE, run_before=run_before)


def test_finished_reply_in_colour_view(snap_compare: Callable[..., bool], make_app: Callable[..., SpecChatApp]) -> None:
    async def run_before(pilot: Pilot) -> None:
        app = pilot.app
        await ready(pilot)
        await send(pilot, "Show me some code")
        await wait_for(pilot, lambda: not app.conversation.generating)  # type: ignore[attr-defined]
        await pilot.press("f4")
        await settle(pilot)

    assert snap_compare(make_app(), terminal_size=SIZE, run_before=run_before)


def test_profile_picker(snap_compare: Callable[..., bool], make_app: Callable[..., SpecChatApp]) -> None:
    async def run_before(pilot: Pilot) -> None:
        app = pilot.app
        await ready(pilot)
        await settle(pilot)
        await pilot.press("f2")
        await wait_for(pilot, lambda: isinstance(app.screen, ProfilePicker))
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=SIZE, run_before=run_before)


def test_narrow_80x24_after_a_reply(snap_compare: Callable[..., bool], make_app: Callable[..., SpecChatApp]) -> None:
    """At 80×24 the HUD is one status line and the chat keeps the width."""
    async def run_before(pilot: Pilot) -> None:
        app = pilot.app
        await ready(pilot)
        await send(pilot, "Show me some code")
        await wait_for(pilot, lambda: not app.conversation.generating)  # type: ignore[attr-defined]
        await settle(pilot)

    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=run_before)


def test_wide_160x48_after_a_reply(snap_compare: Callable[..., bool], make_app: Callable[..., SpecChatApp]) -> None:
    """At 160×48 the full HUD sits beside the chat."""
    async def run_before(pilot: Pilot) -> None:
        app = pilot.app
        await ready(pilot)
        await send(pilot, "Show me some code")
        await wait_for(pilot, lambda: not app.conversation.generating)  # type: ignore[attr-defined]
        await settle(pilot)

    assert snap_compare(make_app(), terminal_size=(160, 48), run_before=run_before)
