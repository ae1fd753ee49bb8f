"""The command palette: each title once, the app's keys and extra commands, a switch per other profile."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from textual.app import SystemCommand
from textual.binding import Binding

from app.ui.app import SpecChatApp
from app.ui.commands import ProfileCommands, unique_commands
from engine.errors import ProfileError
from tests.app.fakes import FakeLoader
from tests.app.helpers import first_load_held, ready, wait_for

pytestmark = pytest.mark.anyio


class PaletteApp:
    """Just what ``unique_commands`` reads of the app."""

    BINDINGS: list[Any] = [
        Binding("escape", "stop", "Stop"),
        Binding("f1", "help", "Help"),
        ("f10", "tuple_binding", "Tuple"),
        Binding("ctrl+q", "quit", "Quit"),
        Binding("f7", "copy", "Copy", tooltip="a message or a code block"),
    ]
    EXTRA_COMMANDS = [("Copy", "a second Copy", "other"), ("Copy last reply", "the last reply", "copy_last_reply")]

    def __init__(self) -> None:
        self.ran: list[str] = []

    def run_action(self, action: str) -> None:
        self.ran.append(action)


def test_textual_commands_come_first_and_each_title_once() -> None:
    app = PaletteApp()
    textual = [SystemCommand("Quit", "Quit the application", lambda: None)]
    commands = list(unique_commands(app, textual))  # type: ignore[arg-type]
    assert [c.title for c in commands] == ["Quit", "Help", "Copy", "Copy last reply"]
    assert commands[0] is textual[0]
    assert [c.help for c in commands[1:]] == ["Help", "a message or a code block", "the last reply"]


def test_every_key_of_the_app_says_more_in_the_palette_than_its_name() -> None:
    """The palette showed "Chats / Chats": a key without a tooltip repeats its name as its help."""
    from app.ui.keys import BINDINGS

    class Keys(PaletteApp):
        pass

    Keys.BINDINGS, Keys.EXTRA_COMMANDS = BINDINGS, []
    commands = list(unique_commands(Keys(), []))  # type: ignore[arg-type]
    assert len(commands) == len(BINDINGS) - 1  # every key but Esc
    assert [c.title for c in commands if c.help == c.title] == []


def test_each_command_runs_its_own_action() -> None:
    app = PaletteApp()
    for command in unique_commands(app, []):  # type: ignore[arg-type]
        command.callback()
    assert app.ran == ["help", "quit", "copy", "copy_last_reply"]  # Stop (Esc) is no palette command


async def test_palette_titles_are_unique_and_current_profile_is_not_offered(
    make_app: Callable[..., SpecChatApp]
) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert len(titles) == len(set(titles))
        assert {"Copy last reply", "Regenerate", "Quit"} <= set(titles)
        choices = ProfileCommands(app.screen)._choices()
        assert [name for name, _, _ in choices] == ["lookup"]  # "fast" is loaded


async def test_switch_profile_from_command_palette_provider(make_app: Callable[..., SpecChatApp], loader: FakeLoader) -> None:
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        provider = ProfileCommands(app.screen)
        hits = [hit async for hit in provider.search("lookup")]
        assert len(hits) == 1 and "n-gram" in (hits[0].help or "")
        hits[0].command()
        await wait_for(pilot, lambda: len(loader.backends) == 2 and app.engine.backend is not None)
        assert app.engine.profile is not None and app.engine.profile.name == "lookup"


async def test_discovery_lists_a_switch_per_other_profile_with_its_pair(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        hits = [hit async for hit in ProfileCommands(app.screen).discover()]
        assert [(str(h.display), h.help) for h in hits] == [
            ("Switch to profile lookup", "Target-360M ← n-gram lookup")]
        assert not [hit async for hit in ProfileCommands(app.screen).search("no such thing")]


async def test_the_profile_still_loading_is_offered(make_app: Callable[..., SpecChatApp], loader: FakeLoader) -> None:
    async with first_load_held(make_app, loader, size=(80, 24)) as (app, pilot):
        assert [name for name, _, _ in ProfileCommands(app.screen)._choices()] == ["fast", "lookup"]
        loader.gate.set()
        await ready(pilot)


async def test_no_profiles_file_means_no_switch_commands(make_app: Callable[..., SpecChatApp]) -> None:
    def unreadable() -> Any:
        raise ProfileError("models.toml: TOML syntax error")

    app = make_app(profiles_loader=unreadable)
    async with app.run_test() as pilot:
        await pilot.pause()
        assert app.engine.profiles is None and ProfileCommands(app.screen)._choices() == []
