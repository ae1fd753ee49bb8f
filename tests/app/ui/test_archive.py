"""The archive in the app: replies saved as they stream, locks reported, chats reopened, renamed, deleted."""
from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from app.store.history import HistoryError
from app.ui.app import SpecChatApp
from app.ui.sampling import ChatSampling
from app.ui.screens.chats import ChatsScreen
from app.ui.widgets.chat_view import AssistantMessage, UserMessage
from engine.config.profiles import Profiles
from tests.app.fakes import FakeLoader, make_profiles
from tests.app.helpers import ready, send, wait_for
from tests.app.store.locking import hold_lock


pytestmark_async = pytest.mark.anyio


@pytestmark_async
async def test_reply_is_saved_while_streaming(make_app: Callable[..., SpecChatApp], specchat_dirs: Path) -> None:
    loader = FakeLoader(hold_after=2)
    app = make_app(loader=loader)
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "hi")
        await wait_for(pilot, loader.backends[0].held.is_set)

        def rows() -> list[tuple[object, ...]]:
            probe = sqlite3.connect(specchat_dirs / "history.db")
            try:
                return probe.execute("SELECT role, content, finish_reason FROM messages ORDER BY id").fetchall()
            finally:
                probe.close()

        await wait_for(pilot, lambda: rows() == [("user", "hi", None), ("assistant", "Hello there! Here is code", None)],
                       timeout=20)
        loader.backends[0].release.set()
        await wait_for(pilot, lambda: not app.conversation.generating)


@pytestmark_async
async def test_lock_during_reply_shows_notice_and_saves_everything_after(
    make_app: Callable[..., SpecChatApp], specchat_dirs: Path, short_busy: None
) -> None:
    loader = FakeLoader(hold_after=1)
    app = make_app(loader=loader)
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "hi")
        await wait_for(pilot, loader.backends[0].held.is_set)
        assert app.archive.saver is not None
        await wait_for(pilot, lambda: app.archive.saver.unsaved() == 1 and app.conversation.chat_id is not None)
        thread, _ = hold_lock(specchat_dirs / "history.db", 1.5, exclusive=False)
        loader.backends[0].release.set()
        await wait_for(pilot, lambda: not app.conversation.generating)
        await wait_for(pilot, lambda: any("saved when the lock is released" in n.message
                                          for n in app._notifications))
        assert app.archive.saver.unsaved() == 1
        thread.join()
        await wait_for(pilot, lambda: app.archive.saver.unsaved() == 0)
        assert any("everything is saved" in n.message for n in app._notifications)
        (user, reply) = app.archive.history.messages(app.conversation.chat_id)
        assert reply.content == "Hello there! Here is code:\n\n```python\nprint('hi')\n```\nDone."
        assert reply.finish_reason == "eos" and reply.stats is not None and reply.stats["rounds"] == 5


@pytestmark_async
async def test_chat_settings_set_while_locked_are_saved_once_it_is_free(
    make_app: Callable[..., SpecChatApp], specchat_dirs: Path, short_busy: None
) -> None:
    """F10's sampling, F8's system prompt and a profile switch, set while another program holds the
    database: the UI goes on at once, quitting would ask, and all three are written after (a hostile
    tester's F10 sampling was lost, behind a toast that said it would be retried)."""
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "hi")
        await wait_for(pilot, lambda: not app.conversation.generating and app.conversation.chat_id is not None)
        saver, chat_id = app.archive.saver, app.conversation.chat_id
        assert saver is not None and saver.flush(5)
        thread, _ = hold_lock(specchat_dirs / "history.db", 1.5, exclusive=False)
        began = time.monotonic()
        app.conversation.set_sampling(ChatSampling(0.5, seed=3))
        app.conversation.set_system_prompt("Be brief.")
        app.conversation.profile_changed("lookup")
        assert time.monotonic() - began < 0.3  # nothing waited on the lock on the UI's thread (three waits of 0.2 s did)
        await wait_for(pilot, lambda: saver.lagging)
        assert (app.archive.at_risk(True) or "").startswith("3 chat settings are not saved: ")
        from app.ui.quitting import write_unsaved  # ctrl+q's "export" then keeps them too

        exported = write_unsaved(app, app.conversation, app.archive)
        assert exported is not None
        assert "- Sampling: T 0.5 · seed 3\n- System prompt: Be brief.\n" in exported.read_text()
        thread.join()
        await wait_for(pilot, lambda: saver.unsaved_settings() == 0 and not saver.lagging, timeout=10)
        chat = app.archive.history.get_chat(chat_id)  # type: ignore[union-attr]
        assert chat is not None and (chat.sampling, chat.system_prompt, chat.profile) == (
            {"temperature": 0.5, "seed": 3}, "Be brief.", "lookup")
        assert not any("will retry" in n.message for n in app._notifications)


@pytestmark_async
async def test_reopen_chat_after_restart(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "remember me")
        await wait_for(pilot, lambda: not app.conversation.generating)
        await pilot.press("f4")  # the colour view must survive the restart too
    loader = FakeLoader()
    again = make_app(loader=loader)
    async with again.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        assert [m.text for m in again.query(UserMessage)] == ["remember me"]  # the last chat, reopened
        await pilot.press("f3")  # and opening it from F3 shows it the same
        await wait_for(pilot, lambda: isinstance(again.screen, ChatsScreen))
        await pilot.press("enter")
        await wait_for(pilot, lambda: not isinstance(again.screen, ChatsScreen) and bool(again.query(UserMessage)))
        assert again.query_one(UserMessage).text == "remember me"
        reply = again.query_one(AssistantMessage)
        assert reply.text.startswith("Hello there!") and reply.finish_reason == "eos"
        assert ("Hello there", "draft") in reply.pieces
        await send(pilot, "and again")
        await wait_for(pilot, lambda: not again.conversation.generating and len(again.query(UserMessage)) == 2)
        sent = [(m.role, m.content) for m in loader.backends[0].calls[0]]
        assert sent[1] == ("user", "remember me") and sent[2][0] == "assistant" and sent[3] == ("user", "and again")
        assert len(again.archive.history.list_chats()) == 1


@pytestmark_async
async def test_chats_screen_rename_and_delete(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "first chat")
        await wait_for(pilot, lambda: not app.conversation.generating)
        await pilot.press("f3")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatsScreen))
        await pilot.press("r")
        await pilot.press(*"Renamed", "enter")
        await wait_for(pilot, lambda: app.archive.history.list_chats()[0].title == "Renamed")
        await pilot.press("d")
        await pilot.press("y")
        await wait_for(pilot, lambda: app.archive.history.list_chats() == [])
        await pilot.press("escape")
        assert app.conversation.chat_id is None


@pytestmark_async
async def test_a_rename_or_delete_refused_by_a_lock_changes_nothing_on_screen_either(
        make_app: Callable[..., SpecChatApp], specchat_dirs: Path, short_busy: None) -> None:
    """The toast said "nothing was changed", yet the open chat was replaced by a new one (delete) or
    its header renamed (a review's)."""
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "first chat")
        await wait_for(pilot, lambda: not app.conversation.generating and app.conversation.chat_id is not None)
        chat_id = app.conversation.chat_id
        assert app.archive.saver is not None and app.archive.saver.flush(5)
        await pilot.press("f3")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatsScreen))
        thread, _ = hold_lock(specchat_dirs / "history.db", 3.0, exclusive=False)
        await pilot.press("r")
        await pilot.press(*"Renamed", "enter")
        await wait_for(pilot, lambda: any("nothing was changed" in n.message for n in app._notifications))
        await pilot.press("d")
        await pilot.press("y")
        await wait_for(pilot, lambda: sum("nothing was changed" in n.message for n in app._notifications) == 2)
        await pilot.pause()
        assert app.conversation.chat_id == chat_id and app.conversation.title == "first chat"
        assert app.conversation.messages()  # still the chat on screen
        thread.join()


@pytestmark_async
async def test_a_rename_waiting_for_another_programs_lock_leaves_the_dialog_answering_keys(
        make_app: Callable[..., SpecChatApp], specchat_dirs: Path) -> None:
    """F3's rename and delete wrote on the UI's thread: one waiting out a lock (5 s) froze the dialog."""
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "first chat")
        await wait_for(pilot, lambda: not app.conversation.generating and app.conversation.chat_id is not None)
        assert app.archive.saver is not None and app.archive.saver.flush(5)
        await pilot.press("f3")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatsScreen))
        thread, _ = hold_lock(specchat_dirs / "history.db", 2.0, exclusive=False)  # the app's wait: 5 s
        await pilot.press("r")
        await pilot.press(*"Renamed", "enter")
        await pilot.press("slash", *"zz")
        await wait_for(pilot, lambda: app.screen.query_one("#chat-search").value == "zz")
        assert thread.is_alive(), "the keys after the rename waited for the lock"
        assert app.conversation.title == "first chat"  # not renamed yet
        thread.join()
        await wait_for(pilot, lambda: app.conversation.title == "Renamed")  # written once the lock was let go
        assert [c.title for c in app.archive.history.list_chats()] == ["Renamed"]


@pytestmark_async
async def test_deleting_a_chat_another_window_shows_says_so_before_it_deletes(
        make_app: Callable[..., SpecChatApp], specchat_dirs: Path) -> None:
    from app.store.open_chats import OpenChats
    from app.ui.screens.edit import ConfirmScreen

    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "first chat")
        await wait_for(pilot, lambda: not app.conversation.generating)
        chat_id = app.conversation.chat_id
        await app.action_new_chat()
        other = OpenChats(specchat_dirs / "history.db")  # another window opens it
        assert chat_id is not None and other.show(chat_id)
        await pilot.press("f3")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatsScreen))
        from textual.widgets import OptionList
        row = str(app.screen.query_one(OptionList).get_option_at_index(0).prompt)
        assert "◐ open in another window" in row.split("\n")[0]  # the list says so too
        await pilot.press("d")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert "It is open in another specchat window" in app.screen._question  # type: ignore[attr-defined]
        await pilot.press("n")
        other.release()


def with_suffix_profile() -> Profiles:
    base = make_profiles()
    suffix = replace(base.get("lookup"), name="suffix", drafter="suffix")
    return Profiles({**base.profiles, "suffix": suffix}, default="suffix", files=())


@pytestmark_async
async def test_the_suffix_drafter_is_given_the_history_and_forgets_a_deleted_chat(
    make_app: Callable[..., SpecChatApp], loader: FakeLoader
) -> None:
    app = make_app(profiles_loader=with_suffix_profile)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        backend = loader.backends[0]
        await wait_for(pilot, lambda: backend.learned == [[]])  # an empty history, on load
        await send(pilot, "remember this")
        await wait_for(pilot, lambda: not app.conversation.generating)
        assert app.archive.saver is not None and app.archive.saver.flush(5)
        await pilot.press("f3")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatsScreen))
        await pilot.press("d", "y")
        await wait_for(pilot, lambda: len(backend.learned) == 2)
        assert backend.learned[1] == []  # the deleted chat's prompt and reply are gone
        await pilot.press("escape")
        await send(pilot, "a new one")
        await wait_for(pilot, lambda: not app.conversation.generating)
        assert app.archive.saver.flush(5)
        texts = app.archive.history.drafting_texts(1000)  # type: ignore[union-attr]
        assert texts[0] == "a new one" and texts[1].startswith("Hello there!")


@pytestmark_async
async def test_a_chat_deleted_in_another_window_is_taken_from_the_drafter_before_the_next_prompt(
    make_app: Callable[..., SpecChatApp], loader: FakeLoader
) -> None:
    """Window B's drafter kept proposing a chat window A had deleted, marked "from earlier chats",
    until B loaded again (a hostile tester's)."""
    app = make_app(profiles_loader=with_suffix_profile)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        history = app.archive.history
        assert history is not None
        elsewhere = history.create_chat("from window A", "suffix")
        history.add_message(elsewhere, "user", "a secret of A")
        backend = loader.backends[0]
        app._teach_drafter()  # as at load: the history with A's chat
        await wait_for(pilot, lambda: backend.learned and backend.learned[-1] == ["a secret of A"])
        taught = len(backend.learned)
        await send(pilot, "nothing deleted yet")
        await wait_for(pilot, lambda: not app.conversation.generating)
        assert len(backend.learned) == taught  # nothing deleted: no lesson again
        history.delete_chat(elsewhere)  # window A deletes it (the same file)
        await send(pilot, "and now?")
        await wait_for(pilot, lambda: len(backend.learned) == taught + 1)
        assert "a secret of A" not in backend.learned[-1]


@pytestmark_async
async def test_the_suffix_drafter_reads_the_history_off_the_ui_thread_and_says_when_it_cannot(
    make_app: Callable[..., SpecChatApp], loader: FakeLoader, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read on the UI's thread, a history another program held locked froze the app for the lock's
    5 s at every load of a suffix profile."""
    app = make_app(profiles_loader=with_suffix_profile)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        history = app.archive.history
        assert history is not None
        backend = loader.backends[0]
        await wait_for(pilot, lambda: backend.learned == [[]])
        readers: list[int] = []

        def locked(limit: int) -> list[str]:
            readers.append(threading.get_ident())
            raise HistoryError("the history is locked by another program", locked=True)

        monkeypatch.setattr(history, "drafting_texts", locked)
        app._teach_drafter()
        await wait_for(pilot, lambda: len(backend.learned) == 2)
        assert readers and threading.main_thread().ident not in readers
        assert backend.learned[1] == []
        await wait_for(pilot, lambda: any("could not be read" in n.message for n in app._notifications))


@pytestmark_async
async def test_damaged_database_in_app_is_reported_and_app_works(
    make_app: Callable[..., SpecChatApp], specchat_dirs: Path
) -> None:
    specchat_dirs.mkdir(parents=True)
    (specchat_dirs / "history.db").write_bytes(b"\x00garbage" * 64)
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        assert any("corrupt-" in n.message for n in app._notifications)
        await send(pilot, "works anyway")
        await wait_for(pilot, lambda: not app.conversation.generating)
        assert [c.title for c in app.archive.history.list_chats()] == ["works anyway"]
    assert len(list(specchat_dirs.glob("history.db.corrupt-*"))) == 1


def test_a_failing_history_call_is_reported_and_answers_none() -> None:
    from app.store.history import HistoryError
    from app.ui.archive import Archive

    reported: list[str] = []
    archive = Archive(reported.append)

    def locked() -> int:
        raise HistoryError("history.db is locked by another program")

    assert archive.db(locked) is None and reported == ["history.db is locked by another program"]
    assert archive.db(lambda a, b=0: a + b, 2, b=3) == 5


def test_open_and_close_go_together(specchat_dirs: Path) -> None:
    from app.ui.archive import Archive

    archive = Archive(lambda text: None)
    assert archive.open(lambda notice: None) is None
    assert archive.history is not None and archive.saver is not None
    chat = archive.history.create_chat("kept", "fast")
    archive.close()
    from app.store.history import History

    again = History.open()
    assert [c.title for c in again.list_chats()] == ["kept"] and chat
    again.close()


@pytestmark_async
async def test_a_chat_deleted_in_another_window_keeps_the_next_exchange_in_a_new_chat(
    make_app: Callable[..., SpecChatApp], specchat_dirs: Path
) -> None:
    from app.store.history import History

    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "hi")
        await wait_for(pilot, lambda: not app.conversation.generating and app.archive.saver.unsaved() == 0)
        deleted = app.conversation.chat_id
        other = History.open(specchat_dirs / "history.db")  # another specchat, same file
        other.delete_chat(deleted)
        others_new = other.create_chat("the other window's chat", "fast")
        await send(pilot, "my bank PIN is 1234")
        await wait_for(pilot, lambda: any("deleted in another window" in n.message for n in app._notifications))
        await wait_for(pilot, lambda: not app.conversation.generating and app.archive.saver.unsaved() == 0)
        rescued = app.conversation.chat_id
        assert rescued not in (None, deleted, others_new)
        assert other.messages(others_new) == []
        assert [m.content for m in other.messages(rescued)][0] == "my bank PIN is 1234"
        assert app.sub_title.endswith("(recovered)")
        assert not any("lock is released" in n.message for n in app._notifications)
        other.close()


@pytestmark_async
async def test_opening_a_chat_mid_reply_says_the_reply_stopped_and_the_open_one_is_left_streaming(
        make_app: Callable[..., SpecChatApp]) -> None:
    """F3 on the open chat mid-reply stopped the reply without a word and showed it as "unfinished: its
    end was never saved" (the saver had not written it yet); another chat stopped it silently too."""
    long = [[(f"w{i} ", "target")] for i in range(400)]
    loader = FakeLoader(delay=0.02, script=long)
    app = make_app(loader=loader)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        history = app.archive.history
        assert history is not None
        other = history.create_chat("another chat", "fast")
        history.add_message(other, "user", "an earlier question")
        await send(pilot, "count for me")
        await wait_for(pilot, lambda: app.conversation.chat_id is not None and "w3" in app.query(AssistantMessage).last().text)
        await app.open_chat(app.conversation.chat_id)  # the chat already open
        await wait_for(pilot, lambda: any("the one open" in n.message for n in app._notifications))
        assert app.conversation.generating
        await app.open_chat(other)
        await wait_for(pilot, lambda: any("Stopped the reply to leave the chat" in n.message for n in app._notifications))
        assert [m.text for m in app.query(UserMessage)] == ["an earlier question"]


@pytestmark_async
async def test_deleting_the_open_chat_mid_reply_does_not_say_the_reply_was_saved(
        make_app: Callable[..., SpecChatApp]) -> None:
    """"Stopped the reply to leave the chat; it is saved as far as it got" was said for a chat being
    deleted, its reply with it (a review's)."""
    long = [[(f"w{i} ", "target")] for i in range(400)]
    app = make_app(loader=FakeLoader(delay=0.02, script=long))
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "count for me")
        await wait_for(pilot, lambda: app.conversation.chat_id is not None and app.conversation.generating)
        assert await app.conversation.chat_deleted(app.conversation.chat_id)
        await wait_for(pilot, lambda: any(n.message == "Stopped the reply." for n in app._notifications))
        assert not any("saved as far as it got" in n.message for n in app._notifications)
