"""Command palette entries: the app's keys, extra commands, and one "Switch to profile …" per profile.

Every title appears once: an app binding whose title Textual already offers
(Quit) is left out, and the loaded profile is not offered as a switch.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from functools import partial
from typing import Any, Protocol, cast

from textual.app import SystemCommand
from textual.binding import Binding
from textual.command import DiscoveryHit, Hit, Hits, Provider

from app.ui.engine_host import EngineHost
from app.ui.labels import profile_pair
from engine.text_safety import inert


class CommandsApp(Protocol):
    """What the commands need of the app they run in."""

    engine: EngineHost
    BINDINGS: Any
    EXTRA_COMMANDS: list[tuple[str, str, str]]

    def switch_profile(self, name: str) -> None: ...

    def run_action(self, action: str) -> Any: ...


class ProfileCommands(Provider):
    """Lets ctrl+p switch profiles by name."""

    def _choices(self) -> list[tuple[str, str, str]]:
        engine = cast(CommandsApp, self.app).engine
        if engine.profiles is None:
            return []
        out = []
        current = engine.profile.name if engine.profile is not None and engine.backend is not None else None
        for name in engine.profiles.names():
            if name == current:
                continue
            profile = engine.profiles.get(name)
            out.append((name, inert(f"Switch to profile {name}"), inert(profile_pair(profile))))
        return out

    async def discover(self) -> Hits:
        app = cast(CommandsApp, self.app)
        for name, title, help_text in self._choices():
            yield DiscoveryHit(title, partial(app.switch_profile, name), help=help_text)

    async def search(self, query: str) -> Hits:
        app = cast(CommandsApp, self.app)
        matcher = self.matcher(query)
        for name, title, help_text in self._choices():
            score = max(matcher.match(title), matcher.match(help_text))
            if score > 0:
                yield Hit(score, matcher.highlight(title), partial(app.switch_profile, name), help=help_text)


def unique_commands(app: CommandsApp, textual_commands: Iterable[SystemCommand]) -> Iterator[SystemCommand]:
    """Textual's own system commands, then the app's bindings and extra commands, each title once."""
    seen: set[str] = set()
    for command in textual_commands:
        seen.add(command.title)
        yield command
    entries = [(b.description, b.tooltip or b.description, b.action) for b in app.BINDINGS
               if isinstance(b, Binding) and b.action != "stop"]
    for title, help_text, action in [*entries, *app.EXTRA_COMMANDS]:
        if title in seen:
            continue
        seen.add(title)
        yield SystemCommand(title, help_text, lambda a=action: app.run_action(a))
