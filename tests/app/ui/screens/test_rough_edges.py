"""Rough edges a new user met at 80×24 (issue 37): rename replaces the title it starts from,
and Enter in delete's confirmation deletes."""
from __future__ import annotations

from collections.abc import Callable

import pytest

from textual import events

from app.ui.app import SpecChatApp
from app.ui.screens.edit import ConfirmScreen, EditScreen
from tests.app.fakes import FakeLoader
from tests.app.helpers import first_load_held, ready, wait_for
from tests.app.ui.screens.test_chats import chats, opened, rows

pytestmark = pytest.mark.anyio


async def test_typing_a_new_name_replaces_the_old_title(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        (chat_id,) = chats(app, "Notes")
        screen, _ = await opened(pilot)
        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, EditScreen))
        await pilot.press(*"Plans", "enter")
        await wait_for(pilot, lambda: rows(screen) == ["Plans"])
        assert app.archive.history.get_chat(chat_id).title == "Plans"  # type: ignore[union-attr]


async def test_a_new_name_typed_right_after_r_replaces_the_title(make_app: Callable[..., SpecChatApp]) -> None:
    """Keys typed at once after r went to the chats list below the rename box (its n started a
    new chat, and the box's answer then crashed the app); they are the box's, replacing the title."""
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        (chat_id,) = chats(app, "Notes")
        screen, answers = await opened(pilot)
        for ch in "rPlans":
            app.post_message(events.Key(ch, ch))
        app.post_message(events.Key("enter", "\r"))
        await wait_for(pilot, lambda: rows(screen) == ["Plans"])
        assert app.screen is screen and answers == []  # the chats list is still open, nothing else happened
        assert app.archive.history.get_chat(chat_id).title == "Plans"  # type: ignore[union-attr]


async def test_enter_in_deletes_confirmation_deletes(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        keep, gone = chats(app, "keep", "gone")
        screen, _ = await opened(pilot)
        await pilot.press("d")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("enter")
        await wait_for(pilot, lambda: rows(screen) == ["keep"])
        assert [c.id for c in app.archive.history.list_chats()] == [keep]  # type: ignore[union-attr]


async def test_a_title_with_square_brackets_is_text_in_every_dialog(make_app: Callable[..., SpecChatApp]) -> None:
    """A hostile tester's first prompt "What does [/INST] mean in Llama 2 prompts?" became the
    chat's title, and d in F3 ended the app (MarkupError: the question was read as markup);
    "[b]T[/b] [reverse]TT[/]" was drawn bold and reversed."""
    from textual.widgets import Label

    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        chats(app, "[b]T[/b] [reverse]TT[/]", "What does [/INST] mean?")
        screen, _ = await opened(pilot)
        await pilot.press("d")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.pause()
        question = app.screen.query_one(".dialog-title", Label)
        assert str(question.render()).startswith("Delete “What does [/INST] mean?”")
        await pilot.press("n")
        await wait_for(pilot, lambda: app.screen is screen)
        await pilot.press("down", "r")
        await wait_for(pilot, lambda: isinstance(app.screen, EditScreen))
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is screen)
        await pilot.press("d")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.pause()
        question = app.screen.query_one(".dialog-title", Label)
        assert str(question.render()).startswith("Delete “[b]T[/b] [reverse]TT[/]”")
        assert not question.render().spans  # drawn as typed: neither bold nor reversed


async def test_a_profile_whose_name_has_square_brackets_starts(make_app: Callable[..., SpecChatApp],
                                                                loader: FakeLoader) -> None:
    """A user's models.toml profile "pk[/x]" ended the app at start: the prompt box's loading
    placeholder, which names it, was read as markup."""
    import dataclasses

    from engine.config.profiles import Profiles
    from tests.app.fakes import make_profiles

    odd = dataclasses.replace(make_profiles().profiles["fast"], name="pk[/x]")

    def odd_app(**kwargs: object) -> SpecChatApp:
        return make_app(profiles_loader=lambda: Profiles({"pk[/x]": odd}, default="pk[/x]", files=()), **kwargs)

    async with first_load_held(odd_app, loader, size=(100, 30)) as (app, pilot):
        await pilot.pause()
        assert str(app.conversation.prompt.placeholder).startswith("Loading pk[/x]… you can type")
        loader.gate.set()
        await ready(pilot)
        assert app.engine.profile is not None and app.engine.profile.name == "pk[/x]"
