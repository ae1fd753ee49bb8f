"""The help page: one table row per described binding, its keys split and quoted, its tooltip after."""
from __future__ import annotations

from collections.abc import Callable

import pytest
from textual.binding import Binding
from textual.widgets import Markdown

from app.ui.app import SpecChatApp
from app.ui.screens.help import INTRO, HelpScreen, help_markdown
from tests.app.helpers import ready, wait_for

pytestmark = pytest.mark.anyio


def test_a_section_is_a_table_of_keys_and_actions() -> None:
    text = help_markdown([("App", [
        Binding("f4,ctrl+t", "toggle", "Colours", tooltip="colour each token"),
        Binding("ctrl+q", "quit", "Quit"),
    ])])
    assert text.startswith(INTRO)
    assert text.endswith("\n## App\n\n| Key | Action |\n|---|---|\n| `f4` `ctrl+t` | Colours: colour each token |\n"
                         "| `ctrl+q` | Quit |\n")


def test_bindings_without_a_description_and_empty_sections_are_left_out() -> None:
    text = help_markdown([
        ("Hidden", [Binding("x", "secret", "")]),
        ("Tuples", [("y", "other", "Other")]),  # only Binding objects are listed
        ("Shown", [Binding("z", "zap", "Zap"), Binding("w", "quiet", "")]),
    ])
    assert "Hidden" not in text and "Tuples" not in text and "Other" not in text
    assert text.count("| `") == 1 and "| `z` | Zap |" in text
    assert help_markdown([]) == INTRO + "\n"


async def test_the_help_screen_shows_the_sections_and_q_closes_it(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        answers: list[object] = []
        app.push_screen(HelpScreen([("Mine", [Binding("f12", "nothing", "Do nothing")])]), answers.append)
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
        source = app.screen.query_one(Markdown).source
        assert "## Mine" in source and "| `f12` | Do nothing |" in source
        await pilot.press("q")
        await wait_for(pilot, lambda: len(app.screen_stack) == 1)
        assert answers == [None]
