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


def list_fits(screen: object) -> bool:
    """The dialog's option list lies inside its dialog (so the row it highlights is on screen)."""
    from textual.widgets import OptionList

    option_list = screen.query_one(OptionList)  # type: ignore[attr-defined]
    return option_list.region.bottom <= option_list.parent.content_region.bottom and option_list.region.height > 0


@pytest.mark.parametrize("size", [(80, 24), (100, 18), (120, 36)])
async def test_a_dialogs_list_stays_inside_the_dialog_so_its_highlight_is_seen(
        make_app: Callable[..., SpecChatApp], size: tuple[int, int]) -> None:
    """A hostile tester: F3 at 80x24 with six chats showed five, and after five Downs nothing was
    highlighted, then d asked to delete the chat no one could see (the dialog cut the list's
    bottom off); F7 at 100x18 copied a reply from a row cut off. Through a resize and a search
    that brings every chat back, the list keeps to its dialog."""
    from textual.widgets import OptionList

    from app.ui.screens.copy import CopyChoice, CopyScreen

    app = make_app()
    async with app.run_test(size=size) as pilot:
        await ready(pilot)
        ids = chats(app, *(f"chat {n}" for n in range(20)))
        screen, _ = await opened(pilot)
        await pilot.pause()
        assert list_fits(screen)
        for _ in range(15):
            await pilot.press("down")
        await pilot.pause()
        assert list_fits(screen) and screen.query_one(OptionList).highlighted == 15
        await pilot.resize_terminal(size[0], size[1] - 4)
        await pilot.pause(0.1)
        assert list_fits(screen)
        await pilot.press("slash", "1", "5")
        await wait_for(pilot, lambda: rows(screen) == ["chat 15"])
        await pilot.press("backspace", "backspace")
        await wait_for(pilot, lambda: len(rows(screen)) == len(ids))
        await pilot.pause(0.1)
        assert list_fits(screen)
        await pilot.resize_terminal(*size)
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is not screen)
        copy = CopyScreen([CopyChoice(f"Reply · {n}", f"text {n}") for n in range(18)])
        app.push_screen(copy)
        await wait_for(pilot, lambda: app.screen is copy)
        await pilot.pause(0.1)
        assert list_fits(copy)
