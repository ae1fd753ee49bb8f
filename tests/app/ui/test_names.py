"""Names agree everywhere: the suffix drafter is "suffix lookup" in the load notice, the
memory plan and the HUD; α is defined in the same words in the README and in F1."""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import pytest

from app.ui.app import SpecChatApp
from app.ui.formatting import plan_lines
from app.ui.screens.help import ALPHA_TERM, HelpScreen
from app.ui.widgets.hud import Hud
from engine.config.profiles import ModelProfile, ModelSpec, Profiles
from engine.model.plan import plan_memory
from tests.app.fakes import FakeBackend
from tests.app.helpers import ready
from tests.conftest import REPO
from tests.tiny import tiny_config

pytestmark = pytest.mark.anyio

SUFFIX = ModelProfile(name="pocket-suffix", target=ModelSpec("org/Target-135M"), drafter="suffix",
                      description="drafting from this chat and earlier ones")


class PlannedBackend(FakeBackend):
    """A fake backend whose memory plan is the real planner's for its profile."""

    @property
    def info(self) -> Any:
        plan = plan_memory(tiny_config(), None, self.profile, free_bytes=2**30).to_dict()
        return dataclasses.replace(super().info, plan=plan, drafter="suffix lookup", mode="ngram")


def test_the_plan_names_the_suffix_drafter_as_the_hud_does() -> None:
    plan = plan_memory(tiny_config(), None, SUFFIX, free_bytes=2**30)
    assert plan.summary().startswith("target+suffix lookup:")
    assert plan_lines(plan.to_dict())[0] == "target + suffix lookup"
    ngram = plan_memory(tiny_config(), None, dataclasses.replace(SUFFIX, drafter="ngram"), free_bytes=2**30)
    assert plan_lines(ngram.to_dict())[0] == "target + n-gram lookup"


async def test_suffix_lookup_in_the_load_notice_the_plan_and_the_hud(make_app: Callable[..., SpecChatApp]) -> None:
    def loader(profile: ModelProfile, budget: int | None, progress: Any, stop: Any) -> PlannedBackend:
        return PlannedBackend(profile)

    app = make_app(loader=loader, profiles_loader=lambda: Profiles({"pocket-suffix": SUFFIX}, "pocket-suffix", ()))
    async with app.run_test(size=(160, 48)) as pilot:
        await ready(pilot)
        loaded = [n.message for n in app._notifications if n.title == "Loaded"]
        assert loaded == ["pocket-suffix ready: target + suffix lookup"]
        hud = app.query_one(Hud)
        hud.flush()
        engine = str(hud.query_one("#hud-engine").render())
        memory = str(hud.query_one("#hud-memory").render())
        assert "draft    suffix lookup" in engine and "n-gram" not in engine + memory
        assert " target + suffix lookup" in memory


def _words(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


async def test_alpha_is_defined_once_in_the_readme_and_in_f1(make_app: Callable[..., SpecChatApp]) -> None:
    readme = _words((REPO / "README.md").read_text())
    assert _words(ALPHA_TERM) in readme
    assert readme.count("**α**") == 1  # one definition, not two
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await ready(pilot)
        await pilot.press("f1")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        assert _words(ALPHA_TERM) in _words(app.screen.markdown)


def test_every_figure_the_hud_shows_is_explained_in_f1() -> None:
    """ITL, the plain row's "est" and K=0, the per-drafter rows and the acceptance by position were
    shown with no word of what they are (a tester's)."""
    from app.ui.screens.help import INTRO as text

    for figure in ("**K**", "**accepted**", "α", "**τ**", "**speedup**", "**plain**", "**ITL**", "K=0",
                   "**acceptance by draft position**", "**chat / model / earlier**", "too short to measure",
                   "too uncertain to measure"):
        assert figure in text, figure
