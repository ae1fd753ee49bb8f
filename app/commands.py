"""Command palette entries: one "Switch to profile …" per profile."""
from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, cast

from textual.command import DiscoveryHit, Hit, Hits, Provider

from app.conversation import profile_pair

if TYPE_CHECKING:
    from app.app import SpecChatApp


class ProfileCommands(Provider):
    """Lets ctrl+p switch profiles by name."""

    def _choices(self) -> list[tuple[str, str, str]]:
        app = cast("SpecChatApp", self.app)
        if app.profiles is None:
            return []
        out = []
        for name in app.profiles.names():
            profile = app.profiles.get(name)
            out.append((name, f"Switch to profile {name}", profile_pair(profile)))
        return out

    async def discover(self) -> Hits:
        app = cast("SpecChatApp", self.app)
        for name, title, help_text in self._choices():
            yield DiscoveryHit(title, partial(app.switch_profile, name), help=help_text)

    async def search(self, query: str) -> Hits:
        app = cast("SpecChatApp", self.app)
        matcher = self.matcher(query)
        for name, title, help_text in self._choices():
            score = max(matcher.match(title), matcher.match(help_text))
            if score > 0:
                yield Hit(score, matcher.highlight(title), partial(app.switch_profile, name), help=help_text)
