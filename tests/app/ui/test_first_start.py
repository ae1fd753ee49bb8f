"""While the model loads, the prompt box says so (and that typing is fine); it asks for a
message once the model is ready, and says nothing is loaded when loading fails."""
from __future__ import annotations

from collections.abc import Callable

import pytest
from textual.widgets import OptionList

from app.ui.app import SpecChatApp
from app.ui.widgets.chat_view import UserMessage
from engine.errors import ModelSourceError
from tests.app.fakes import FakeLoader
from tests.app.helpers import first_load_held, ready, send, wait_for

pytestmark = pytest.mark.anyio


async def test_the_prompt_box_says_it_waits_for_the_model(make_app: Callable[..., SpecChatApp],
                                                          loader: FakeLoader) -> None:
    async with first_load_held(make_app, loader, size=(80, 24)) as (app, pilot):
        prompt = app.conversation.prompt
        assert str(prompt.placeholder).startswith("Loading fast… you can type")
        assert "Ask" not in str(prompt.placeholder)
        await send(pilot, "hello while loading")  # queued, as the placeholder says
        loader.gate.set()
        await ready(pilot)
        await wait_for(pilot, lambda: len(loader.backends[0].calls) == 1)
        assert str(prompt.placeholder).startswith("Ask something")
        assert [m.text for m in app.query(UserMessage)] == ["hello while loading"]


async def test_the_whole_loading_placeholder_shows_in_a_narrow_box(make_app: Callable[..., SpecChatApp],
                                                                   loader: FakeLoader) -> None:
    """A loading placeholder wider than the box wraps to two lines (at 80 columns "pocket"'s
    does): the empty box grows to show both (a one-line box cut it off before "ready"), also
    once a queued prompt empties it, and goes back to one line with the short ready placeholder."""
    async with first_load_held(make_app, loader, size=(70, 24)) as (app, pilot):
        prompt = app.conversation.prompt
        await pilot.pause()
        assert prompt.content_size.height == 2 and "ready" in prompt.render_line(1).text
        await send(pilot, "hello while loading")
        await pilot.pause()
        assert not prompt.text and prompt.content_size.height == 2
        loader.gate.set()
        await ready(pilot)
        await pilot.pause()
        assert prompt.content_size.height == 1 and prompt.render_line(0).text.startswith("Ask something")


async def test_a_failed_load_says_no_model_is_loaded(make_app: Callable[..., SpecChatApp],
                                                     loader: FakeLoader) -> None:
    loader.error = ModelSourceError("no such model")
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: not app.engine.loading and app.engine.backend is None
                       and "No model" in str(app.conversation.prompt.placeholder))
        assert app.conversation.prompt.placeholder == "No model is loaded: F2 picks a profile"


async def test_esc_stops_the_first_load_and_says_nothing_is_loaded(make_app: Callable[..., SpecChatApp],
                                                                 loader: FakeLoader) -> None:
    """A first start that downloads gigabytes must not hold the user: Esc stops it, and a prompt
    queued for it comes back to the box, said to."""
    async with first_load_held(make_app, loader, size=(80, 24)) as (app, pilot):
        assert "Esc stops loading" in str(app.conversation.prompt.placeholder)
        await send(pilot, "hello while loading")
        await pilot.pause()
        assert "Stop" in footer_keys(app)  # the footer says Esc stops the load...
        await pilot.press("escape")
        await wait_for(pilot, lambda: not app.engine.loading)
        await pilot.pause()
        assert app.engine.backend is None and not loader.backends
        assert app.conversation.prompt.text == "hello while loading"
        notes = {n.title: n.message for n in app._notifications}
        assert notes["Loading stopped"].startswith("Stopped loading fast.")
        assert any("back in the box, not sent" in n.message for n in app._notifications)
        assert str(app.conversation.prompt.placeholder).startswith("No model is loaded")
        assert "Stop" not in footer_keys(app)  # ...and no longer once nothing loads (it stayed after a load)
        await pilot.press("f2")  # nothing is loaded: no profile is marked current (fast was, after the stop)
        await wait_for(pilot, lambda: len(app.screen_stack) == 2)
        listed = app.screen.query_one(OptionList)
        assert not any("current" in str(listed.get_option_at_index(i).prompt) for i in range(listed.option_count))


async def test_after_a_stopped_load_f2_starts_on_the_profile_that_was_stopped(
        make_app: Callable[..., SpecChatApp], loader: FakeLoader) -> None:
    """F2 started on the first profile, not the one just stopped: a hostile tester stopped pocket's
    load, pressed F2 and Enter, and coder (first in the list, 1.6 GB) began to load."""
    async with first_load_held(lambda **kw: make_app(profile="lookup", **kw), loader, size=(80, 24)) as (app, pilot):
        await pilot.press("escape")
        await wait_for(pilot, lambda: not app.engine.loading)
        await pilot.press("f2")
        await wait_for(pilot, lambda: len(app.screen_stack) == 2)
        listed = app.screen.query_one(OptionList)
        assert listed.highlighted is not None and listed.get_option_at_index(listed.highlighted).id == "lookup"
        assert listed.get_option_at_index(0).id == "fast"  # not simply the first row


def footer_keys(app: SpecChatApp) -> str:
    """The footer's keys as shown."""
    from textual.widgets import Footer

    return " ".join(str(key.render()) for key in app.query_one(Footer).query("FooterKey"))


async def test_the_footer_offers_esc_only_while_something_can_be_stopped(make_app: Callable[..., SpecChatApp],
                                                                        loader: FakeLoader) -> None:
    async with first_load_held(make_app, loader, size=(160, 24)) as (app, pilot):
        await pilot.pause()
        assert "Stop" in footer_keys(app)
        loader.gate.set()
        await ready(pilot)
        await pilot.pause()
        assert "Stop" not in footer_keys(app)  # the first load ended: Esc had been offered still
