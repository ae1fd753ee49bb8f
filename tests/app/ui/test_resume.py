"""After a restart the app reopens the chat used last, with its own profile; never a private one."""
from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from app.store.history import History
from app.store.state import last_chat, last_theme, remember_chat, remember_theme
from app.ui.app import SpecChatApp
from app.ui.resume import chat_to_reopen
from app.ui.widgets.chat_view import AssistantMessage, UserMessage
from tests.app.fakes import FakeLoader
from tests.app.helpers import ready, send, wait_for

pytestmark = pytest.mark.anyio


def shown(app: SpecChatApp) -> list[str]:
    return [m.text for m in app.query(UserMessage)]


async def chat_once(app: SpecChatApp, *prompts: str, private: bool = False, size: tuple[int, int] = (120, 40)) -> None:
    """Run ``app``, send ``prompts`` (in a new private chat if asked), and quit."""
    async with app.run_test(size=size) as pilot:
        await ready(pilot)
        if private:
            await app.action_new_chat(private=True)
        for prompt in prompts:
            await send(pilot, prompt)
            await wait_for(pilot, lambda: not app.conversation.generating and len(app.query(AssistantMessage)) > 0)
        await wait_for(pilot, lambda: not app.conversation.generating)


async def test_a_restart_reopens_the_last_chat_and_continues_it(make_app: Callable[..., SpecChatApp],
                                                                loader: FakeLoader) -> None:
    await chat_once(make_app(), "first question")
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        assert shown(app) == ["first question"]
        assert app.query_one(AssistantMessage).text.startswith("Hello there!")
        assert not app.query("#welcome") and app.sub_title == "first question"
        first_id = app.conversation.chat_id
        assert first_id is not None
        await send(pilot, "second question")  # continues the same chat, which the model sees whole
        await wait_for(pilot, lambda: not app.conversation.generating and len(app.query(AssistantMessage)) == 2)
        sent = [(m.role, m.content) for m in loader.backends[-1].calls[-1]]
        assert [c for r, c in sent if r == "user"] == ["first question", "second question"]
        assert app.conversation.chat_id == first_id
        await app.action_new_chat()  # ctrl+n still gives a blank chat
        await pilot.pause()
        assert shown(app) == [] and app.query("#welcome")


async def test_the_last_chat_reopens_though_another_program_wrote_odd_values_into_its_rows(
        make_app: Callable[..., SpecChatApp], specchat_dirs: Path) -> None:
    """Pieces, statistics and a title of the wrong type in the chat used last ended the app at
    every start (a hostile tester's crash loop, fixed only by editing the file by hand)."""
    await chat_once(make_app(), "first question")
    conn = sqlite3.connect(specchat_dirs / "history.db")
    conn.execute("UPDATE messages SET pieces = '[1,2,3]', stats = '{\"tokens_per_s\": [1], \"tokens\": \"x\"}'")
    conn.execute("UPDATE chats SET title = x'41424344', updated = 1e300")
    conn.commit()
    conn.close()
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        assert shown(app) == ["first question"] and app.sub_title == "ABCD"
        assert app.query_one(AssistantMessage).text.startswith("Hello there!")
        await pilot.press("f3")
        await pilot.pause()
        assert "ABCD" in str(app.screen.query_one("OptionList").get_option_at_index(0).prompt)


async def test_a_reply_whose_app_was_killed_comes_back_unfinished_not_stopped(
        make_app: Callable[..., SpecChatApp]) -> None:
    """kill -9 of the app mid-reply: the partial reply came back "■ stopped", as if Esc had been
    pressed (a tester); its saved row has no finish reason."""
    from textual.widgets import Static

    history = History.open()
    chat = history.create_chat("cut", "fast")
    history.add_message(chat, "user", "a long story")
    history.add_message(chat, "assistant", "Once upon a", profile="fast")  # never finished
    history.close()
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        reply = app.query_one(AssistantMessage)
        assert reply.text == "Once upon a" and reply.has_class("-stopped")
        footer = str(reply.query_one(".reply-footer", Static).render())
        assert footer.startswith("■ unfinished: its end was never saved") and "stopped" not in footer


async def test_a_private_chat_is_never_reopened(make_app: Callable[..., SpecChatApp]) -> None:
    await chat_once(make_app(), "saved one")
    await chat_once(make_app(), "secret", private=True)
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        assert shown(app) == ["saved one"]  # the last saved chat, not the private one
        assert not app.conversation.private


async def test_with_no_history_the_app_starts_blank(make_app: Callable[..., SpecChatApp]) -> None:
    await chat_once(make_app(), "secret", private=True)
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        assert shown(app) == [] and app.query("#welcome") and app.conversation.chat_id is None


async def test_a_chat_opened_from_f3_is_the_one_reopened(make_app: Callable[..., SpecChatApp]) -> None:
    await chat_once(make_app(), "older")
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        older = app.conversation.chat_id
        await app.action_new_chat()
        await send(pilot, "newer")
        await wait_for(pilot, lambda: not app.conversation.generating and len(app.query(AssistantMessage)) == 1)
        await wait_for(pilot, lambda: app.conversation.chat_id is not None)
        assert older is not None
        await app.open_chat(older)
        await pilot.pause()
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        assert shown(app) == ["older"]


async def test_the_reopened_chat_loads_its_own_profile_first(make_app: Callable[..., SpecChatApp],
                                                             loader: FakeLoader) -> None:
    app = make_app(profile="lookup")
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "with lookup")
        await wait_for(pilot, lambda: not app.conversation.generating and len(app.query(AssistantMessage)) == 1)
        await app.action_new_chat()
        app.switch_profile("fast")  # remembered as the last profile; the lookup chat keeps its own
        await wait_for(pilot, lambda: app.engine.backend is not None and app.engine.profile is not None
                       and app.engine.profile.name == "fast")
    loaded_before = len(loader.backends)
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        assert shown(app) == ["with lookup"]
        assert [b.profile.name for b in loader.backends[loaded_before:]] == ["lookup"]  # one load, no switch


async def test_a_profile_named_on_the_command_line_reopens_only_a_chat_with_it(
        make_app: Callable[..., SpecChatApp], loader: FakeLoader) -> None:
    await chat_once(make_app(profile="lookup"), "with lookup")
    app = make_app(profile="fast")  # asked for another model: a new chat with it, the old one kept as it was
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        assert shown(app) == [] and app.conversation.chat_id is None
        assert app.engine.profile is not None and app.engine.profile.name == "fast"
        assert app.archive.history is not None and app.archive.history.list_chats()[0].profile == "lookup"
        assert any("the chat used last, “with lookup”, was with lookup (F3 opens it)" in n.message
                   for n in app._notifications)  # not a blank chat without a word
    app = make_app(profile="lookup")
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        assert shown(app) == ["with lookup"]


async def test_a_chat_whose_profile_is_gone_is_reopened_with_the_one_loaded_and_says_so(
        make_app: Callable[..., SpecChatApp], loader: FakeLoader) -> None:
    history = History.open()
    try:
        chat = history.create_chat("old model", "retired")
        history.add_message(chat, "user", "from before")
        history.add_message(chat, "assistant", "ok", profile="retired", finish_reason="eos")
    finally:
        history.close()
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        assert shown(app) == ["from before"] and app.engine.profile is not None
        assert app.engine.profile.name == "fast"
        assert any("was with retired, which is not available" in n.message for n in app._notifications)


def test_a_chat_written_after_the_remembered_one_is_reopened(specchat_dirs: object) -> None:
    history = History.open()
    try:
        first = history.create_chat("first", "fast")
        remember_chat(first, time.time())
        assert chat_to_reopen(history).id == first  # type: ignore[union-attr]
        time.sleep(0.01)
        second = history.create_chat("second", "fast")  # the app was killed before remembering it
        assert chat_to_reopen(history).id == second  # type: ignore[union-attr]
        remember_chat(first, time.time())
        assert chat_to_reopen(history).id == first  # type: ignore[union-attr]
        history.delete_chat(first)
        assert chat_to_reopen(history).id == second  # type: ignore[union-attr]
    finally:
        history.close()


async def test_a_chat_in_a_history_kept_in_memory_is_not_remembered(make_app: Callable[..., SpecChatApp],
                                                                    specchat_dirs: Path) -> None:
    specchat_dirs.mkdir(parents=True)
    newer = sqlite3.connect(specchat_dirs / "history.db")
    newer.execute("PRAGMA user_version = 99")  # written by a newer specchat: this one keeps chats in memory
    newer.close()
    await chat_once(make_app(), "in memory only")
    assert last_chat() is None


LONG = ("A hash table keeps its keys in buckets; a lookup hashes the key, goes to one bucket and compares "
        "the few keys there, so it takes about the same time however many keys the table holds. ") * 6


@pytest.mark.parametrize("size", [(80, 24), (100, 30), (160, 48)])
async def test_a_reopened_chat_shows_its_last_message(make_app: Callable[..., SpecChatApp], size: tuple[int, int]) -> None:
    """A reviewer's restart at 80x24 stopped short of the end: the last exchange sat below the fold."""
    history = History.open()
    try:
        chat = history.create_chat("long answers", "fast")
        for i in range(6):
            history.add_message(chat, "user", f"question {i}")
            history.add_message(chat, "assistant", f"answer {i}: {LONG}", finish_reason="stop")
        history.add_message(chat, "user", "Thanks.")
        history.add_message(chat, "assistant", "You are welcome: the end.", finish_reason="stop")
        remember_chat(chat, time.time())
    finally:
        history.close()
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await ready(pilot)
        await pilot.pause(0.3)
        log = app.conversation.chat_log
        last = app.query(AssistantMessage).last()
        assert last.text == "You are welcome: the end."
        assert log.scroll_y == log.max_scroll_y > 0
        assert last.region.bottom <= log.region.bottom  # on screen, not below the fold


async def test_text_left_unsent_at_quit_is_back_in_the_box_after_a_restart(make_app: Callable[..., SpecChatApp]) -> None:
    """ctrl+q does not ask about a prompt typed and not sent (the box is not a document), so the
    text is kept instead: a reviewer's eight lines were gone after a restart."""
    from textual.widgets import TextArea

    draft = "line 1\nline 2\nline 8"
    await chat_once(make_app(), "first question")
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        app.query_one(TextArea).text = draft
        await pilot.pause()
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        assert shown(app) == ["first question"]  # the same chat, and its unsent text
        assert app.query_one(TextArea).text == draft
        assert any("back in the prompt box" in n.message for n in app._notifications)
        app.query_one(TextArea).text = ""  # sent or cleared: nothing comes back next time
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        assert app.query_one(TextArea).text == ""
        await app.action_new_chat(private=True)
        app.query_one(TextArea).text = "a private thought"
        await pilot.pause()
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        assert app.query_one(TextArea).text == ""  # a private chat's text is never written down
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await app.action_new_chat(private=True)
        app.query_one(TextArea).text = "private secret hunter5"
        await app.action_new_chat()  # the text stays in the box, now a saved chat's
        await pilot.pause()
        assert app.query_one(TextArea).text == "private secret hunter5"
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        assert app.query_one(TextArea).text == ""  # typed in private and not edited since: not written down
        await app.action_new_chat(private=True)
        app.query_one(TextArea).text = "private words"
        await app.action_new_chat()
        app.query_one(TextArea).text = "private words, and then some for the saved chat"
        await pilot.pause()
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        assert app.query_one(TextArea).text == "private words, and then some for the saved chat"  # edited: kept


async def test_prompts_waiting_behind_a_reply_at_quit_are_back_in_the_box_after_a_restart() -> None:
    """A hostile tester typed a prompt while a reply streamed (shown "waiting for the reply
    above") and pressed ctrl+q: it was neither saved nor kept, unlike the box's own text."""
    from textual.widgets import TextArea

    from tests.app.fakes import make_profiles
    from tests.app.helpers import send_held

    loader = FakeLoader(hold_after=1)
    app = SpecChatApp(loader=loader, profiles_loader=make_profiles)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await send_held(pilot, loader, "first")
        await send(pilot, "queued prompt B")
        await wait_for(pilot, lambda: len(app.conversation.queued) == 1)
        app.query_one(TextArea).text = "and half a third"
        await pilot.press("ctrl+q")
    app = SpecChatApp(loader=FakeLoader(), profiles_loader=make_profiles)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        assert app.query_one(TextArea).text == "queued prompt B\nand half a third"


async def test_a_window_quitting_with_an_empty_box_leaves_the_text_another_window_kept(
        make_app: Callable[..., SpecChatApp]) -> None:
    """A hostile tester's two windows: A quit with text in its box, then B (open all along, its box
    empty) quit and erased A's text from the state file. Two windows' texts both come back."""
    from textual.widgets import TextArea

    from app.store.state import remember_draft

    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:  # window B
        await ready(pilot)
        remember_draft("window A's unsent lines")  # window A quits meanwhile
        await pilot.pause()
    for expected in ("window A's unsent lines", ""):
        app = make_app()
        async with app.run_test(size=(120, 40)) as pilot:
            await ready(pilot)
            assert app.query_one(TextArea).text == expected
            app.query_one(TextArea).text = ""  # sent or cleared: not kept again
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        app.query_one(TextArea).text = "B's text"
        remember_draft("A's text")  # both windows quit with text: each comes back, newest first
    for expected in ("B's text", "A's text", ""):
        app = make_app()
        async with app.run_test(size=(120, 40)) as pilot:
            await ready(pilot)
            assert app.query_one(TextArea).text == expected
            app.query_one(TextArea).text = ""


async def test_the_header_names_the_open_chat_through_a_profile_load_and_a_rename(
        make_app: Callable[..., SpecChatApp]) -> None:
    """It showed the title after a restart, the profile after F3 opened a chat with another profile,
    and the profile for a new chat until the next restart (a reviewer's "Dragons & code")."""
    from app.ui.screens.chats import ChatsScreen

    history = History.open()
    try:
        other = history.create_chat("Dragons & code", "lookup")
        history.add_message(other, "user", "Dragons & code")
        history.add_message(other, "assistant", "Here be dragons.", finish_reason="stop")
    finally:
        history.close()
    app = make_app(profile="fast")
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        assert app.sub_title.startswith("fast · ")  # a new chat, nothing asked yet: the profile
        await send(pilot, "first question")
        await wait_for(pilot, lambda: not app.conversation.generating and app.query(AssistantMessage))
        assert app.sub_title == "first question"
        await app.open_chat(other)  # with lookup: loaded for it, the header keeps the chat's title
        await wait_for(pilot, lambda: app.engine.profile is not None and app.engine.profile.name == "lookup"
                       and not app.engine.loading)
        assert app.sub_title == "Dragons & code"
        app.post_message(ChatsScreen.Renamed(other, "Dragons, renamed"))
        await pilot.pause()
        assert app.sub_title == "Dragons, renamed" and app.conversation.title == "Dragons, renamed"
        app.post_message(ChatsScreen.Renamed(other + 1, "not this one"))
        await pilot.pause()
        assert app.sub_title == "Dragons, renamed"
        await app.action_new_chat()
        assert app.sub_title.startswith("lookup · ")


async def test_a_chat_another_window_shows_is_not_taken_over_at_start(make_app: Callable[..., SpecChatApp],
                                                                       specchat_dirs: Path) -> None:
    """Two windows on one history each wrote into the chat used last: the saved chat interleaved
    turns neither window showed. The second window now starts on a new chat and says why."""
    from app.store.open_chats import OpenChats
    from app.ui.screens.chats import ChatsScreen

    await chat_once(make_app(), "first question")
    other = OpenChats(specchat_dirs / "history.db")  # another specchat window, showing that chat
    chat_id = History.open().list_chats()[0].id
    assert other.show(chat_id)
    app = make_app()
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await ready(pilot)
        assert shown(app) == [] and app.conversation.chat_id is None
        assert any("is open in another specchat window (F3 opens it here too)" in n.message
                   for n in app._notifications)
        await send(pilot, "a question of its own")
        await wait_for(pilot, lambda: not app.conversation.generating and app.conversation.chat_id is not None)
        assert app.conversation.chat_id != chat_id
        assert other.elsewhere(app.conversation.chat_id)  # its new chat, held once saved
        await pilot.press("f3")  # opened anyway from F3: the user is told
        await wait_for(pilot, lambda: isinstance(app.screen, ChatsScreen))
        await app.open_chat(chat_id)
        await wait_for(pilot, lambda: shown(app) == ["first question"])
        assert any("open in another specchat window too" in n.message for n in app._notifications)
    other.release()
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:  # the other window closed: reopened as usual
        await ready(pilot)
        assert shown(app) == ["first question"]


async def test_a_new_chat_is_held_from_its_first_row_not_from_its_first_replys_end(
        specchat_dirs: Path) -> None:
    """A second window started while a new chat's first reply streamed opened that chat (its lock
    was taken only when the reply finished), and both windows then wrote into it, unwarned."""
    from app.store.open_chats import OpenChats
    from tests.app.fakes import make_profiles
    from tests.app.helpers import send_held

    loader = FakeLoader(hold_after=1)
    app = SpecChatApp(loader=loader, profiles_loader=make_profiles)
    other = OpenChats(specchat_dirs / "history.db")  # what a second window asks
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        backend = await send_held(pilot, loader, "first question")
        await wait_for(pilot, lambda: app.conversation.chat_id is not None)
        await wait_for(pilot, lambda: other.elsewhere(app.conversation.chat_id))  # held mid-reply
        assert app.conversation.generating
        backend.release.set()
        await wait_for(pilot, lambda: not app.conversation.generating)
        assert other.elsewhere(app.conversation.chat_id)


async def test_the_theme_chosen_last_is_the_one_a_restart_opens_with(make_app: Callable[..., SpecChatApp]) -> None:
    """oterm's users pick a theme once (here ctrl+p, "Change theme"); it was lost at every restart.
    A remembered theme that is no longer there is passed over."""
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        default = app.theme
        assert default != "nord"
        app.theme = "nord"
        await wait_for(pilot, lambda: last_theme() == "nord")
    again = make_app()
    async with again.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        assert again.theme == "nord"
    remember_theme("a-theme-since-removed")
    third = make_app()
    async with third.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        assert third.theme == default


async def test_text_left_in_another_chat_comes_back_saying_which(make_app: Callable[..., SpecChatApp],
                                                                 specchat_dirs: Path) -> None:
    """Window A's unsent text came back in the chat used last, window B's, as if typed there."""
    from textual.widgets import TextArea

    from app.store.state import remember_draft

    history = History.open()
    planet = history.create_chat("Name a planet.", "fast")
    history.add_message(planet, "user", "Name a planet.")
    time.sleep(0.01)
    mountain = history.create_chat("Name a mountain.", "fast")
    history.add_message(mountain, "user", "Name a mountain.")
    history.close()
    remember_draft("and its moons?", planet, "Name a planet.")
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        assert app.conversation.chat_id == mountain  # the chat written last
        assert app.query_one(TextArea).text == "and its moons?"
        await wait_for(pilot, lambda: any("you had not sent in “Name a planet.” (another chat)" in n.message
                                          for n in app._notifications))
