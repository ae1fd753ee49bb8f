"""The profile picker: each profile's name, badges, pair, K and description; unavailable ones say why."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
from textual.widgets import OptionList

from app.ui.app import SpecChatApp
from app.ui.labels import profile_pair
from app.ui.screens.profiles import ProfilePicker, profile_option
from engine.config.profiles import Profiles, profile_from_server
from tests.app.fakes import make_profiles
from tests.app.helpers import ready, wait_for

pytestmark = pytest.mark.anyio


def test_picker_lists_server_profiles() -> None:
    server = profile_from_server("http://127.0.0.1:8080/v1", "smol")
    base = make_profiles()
    profiles = Profiles({**base.profiles, "remote": server}, default=base.default, files=())
    assert profile_pair(server) == "smol @ http://127.0.0.1:8080 (server)"
    option = profile_option(profiles.get("remote"), current=False, default=False)
    text = str(option.prompt)
    assert "smol @ http://127.0.0.1:8080" in text and "set by the server" in text


def test_an_option_reads_name_badges_pair_drafter_k_and_description() -> None:
    fast = make_profiles().get("fast")
    option = profile_option(fast, current=True, default=True)
    assert str(option.prompt) == ("fast  ● current  default\n  Target-1.7B (nf4) ← Draft-135M  · model · adaptive K\n"
                                  "  Target with a small draft")
    assert option.id == "fast" and not option.disabled
    lookup = profile_option(make_profiles().get("lookup"), current=False, default=False)
    assert str(lookup.prompt) == "lookup\n  Target-360M ← n-gram lookup  · ngram · K=4\n  Prompt-lookup drafting"


def test_an_unavailable_profile_says_why_and_cannot_be_picked() -> None:
    plain = replace(make_profiles().get("lookup"), description="")
    option = profile_option(plain, current=False, default=False, unavailable="needs a CUDA GPU")
    assert str(option.prompt).endswith("· ngram · K=4\n  unavailable: needs a CUDA GPU") and option.disabled


async def test_the_picker_starts_on_the_current_profile_and_enter_picks(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        answers: list[object] = []
        app.push_screen(ProfilePicker(make_profiles(), "lookup"), answers.append)
        await wait_for(pilot, lambda: isinstance(app.screen, ProfilePicker))
        options = app.screen.query_one(OptionList)
        assert options.highlighted == 1 and app.focused is options
        await pilot.press("up", "enter")
        await wait_for(pilot, lambda: answers == ["fast"])


async def test_enter_on_an_unavailable_profile_does_nothing(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        answers: list[object] = []
        picker = ProfilePicker(make_profiles(), None, {"fast": "needs a CUDA GPU"})
        app.push_screen(picker, answers.append)
        await wait_for(pilot, lambda: app.screen is picker)
        options = picker.query_one(OptionList)
        options.highlighted = 0
        assert options.highlighted_option is not None and options.highlighted_option.id == "fast"
        await pilot.press("enter")
        await pilot.pause(0.1)
        assert answers == [] and app.screen is picker
        await pilot.press("escape")
        await wait_for(pilot, lambda: answers == [None])


async def test_at_80x24_the_current_profile_and_the_hint_are_shown_whole() -> None:
    """A reviewer's F2 at 80x24 opened on other profiles' descriptions, the current one cut at the
    bottom, and the hint cut before "Esc cancels"."""
    from textual.app import App

    from engine.config.models_file import load_profiles

    profiles = load_profiles(None)  # the shipped ones: eight, most with two-line descriptions
    current = profiles.names()[-3]

    class Host(App[None]):
        def on_mount(self) -> None:
            self.push_screen(ProfilePicker(profiles, current))

    app = Host()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.2)
        option_list = app.screen.query_one(OptionList)
        assert option_list.highlighted == profiles.names().index(current)
        rows = [strip.text.rstrip() for strip in app.screen._compositor.render_strips()]
        assert any(row.endswith("· Esc cancels") for row in rows)
        at = next(i for i, row in enumerate(rows) if f" {current} " in row and "current" in row)
        assert at + 3 < len(rows) - 1  # its own lines below it are on screen too
        assert " ".join(profiles.get(current).description.split()[:2]) in " ".join(rows[at + 1:at + 6])
