"""F3's search box: chats filtered by title and message text, wildcards literal, Enter opens."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from textual.widgets import Input, OptionList

from app.store.history import History
from app.ui.app import SpecChatApp
from app.ui.screens.chats import ChatsScreen, snippet
from tests.app.helpers import ready, wait_for

pytestmark = pytest.mark.anyio

CHATS = {
    "Tea plans": ["what tea is best?", "Green tea, brewed at 80 degrees."],
    "Rust lifetimes": ["explain 'a in fn f<'a>", "A lifetime names how long a borrow lives."],
    "Discounts": ["is 50% off a good deal", "It depends on the price."],
    "snake_case": ["rename my_var", "Use snake_case for Python variables."],
    "Paths": ["where is C:\\Users", "In the root of the drive."],
}


def fill(history: History) -> dict[str, int]:
    ids = {}
    for title, (prompt, reply) in CHATS.items():
        ids[title] = history.create_chat(title, "fast")
        history.add_message(ids[title], "user", prompt)
        history.add_message(ids[title], "assistant", reply, profile="fast", finish_reason="eos")
    return ids


def titles(found: list[tuple[object, str | None]]) -> set[str]:
    return {chat.title for chat, _ in found}  # type: ignore[attr-defined]


def test_search_matches_titles_and_messages_with_wildcards_taken_literally(tmp_path: Path) -> None:
    history = History.open(tmp_path / "h.db")
    try:
        fill(history)
        assert titles(history.search_chats("TEA")) == {"Tea plans"}
        assert titles(history.search_chats("borrow")) == {"Rust lifetimes"}  # a reply's words
        assert titles(history.search_chats("%")) == {"Discounts"}
        assert titles(history.search_chats("50%")) == {"Discounts"}
        assert titles(history.search_chats("_")) == {"snake_case"}  # not "any one character"
        assert titles(history.search_chats("my_v")) == {"snake_case"}
        assert titles(history.search_chats("\\")) == {"Paths"}
        assert history.search_chats("e_a") == [] and history.search_chats("nothing like it") == []
        found = dict((c.title, text) for c, text in history.search_chats("brewed"))
        assert found == {"Tea plans": "Green tea, brewed at 80 degrees."}
        assert dict((c.title, text) for c, text in history.search_chats("plans")) == {"Tea plans": None}
    finally:
        history.close()


def test_search_ignores_case_in_any_script(tmp_path: Path) -> None:
    """SQLite's LIKE folds ASCII only: "привет" found no "Привет", and F3 said no chat contains it."""
    history = History.open(tmp_path / "h.db")
    try:
        greeting = history.create_chat("Привет мир", "fast")
        school = history.create_chat("Schools", "fast")
        history.add_message(school, "user", "École de Paris, STRASSE 5")
        assert titles(history.search_chats("привет")) == {"Привет мир"}
        assert titles(history.search_chats("école")) == {"Schools"} == titles(history.search_chats("ÉCOLE"))
        assert titles(history.search_chats("straße")) == {"Schools"}  # casefold: ß is ss
        assert [c.id for c, _ in history.search_chats("МИР")] == [greeting]
    finally:
        history.close()


def test_a_snippet_is_the_words_around_the_match_on_one_line() -> None:
    text = "word " * 40 + "needle\nin the\thay " + "more " * 40
    cut = snippet(text, "NEEDLE in the", width=30)
    assert cut.startswith("…") and cut.endswith("…") and "needle in the hay" in cut and "\n" not in cut
    assert snippet("short needle", "needle") == "short needle"
    # found as the search finds it: "straße" in "STRASSE", "привет" in "Привет" (the snippet showed the start)
    long = "word " * 40 + "Große STRASSE 5, Привет " + "more " * 40
    assert "STRASSE" in snippet(long, "straße", width=30) and "Привет" in snippet(long, "привет", width=30)


def rows(screen: ChatsScreen) -> list[str]:
    options = screen.query_one(OptionList)
    return [str(options.get_option_at_index(i).prompt).split("\n")[0] for i in range(options.option_count)]


async def test_typing_in_the_search_box_filters_and_enter_opens(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        assert app.archive.history is not None
        ids = fill(app.archive.history)
        await pilot.press("f3")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatsScreen))
        screen = app.screen
        assert isinstance(screen, ChatsScreen) and len(rows(screen)) == len(CHATS)
        await pilot.press("slash", *"tea")  # "/" goes to the box; then letters are text, not n/r/d/e
        await wait_for(pilot, lambda: rows(screen) == ["Tea plans"])
        assert screen.query_one(Input).value == "tea" and app.screen is screen
        await pilot.press("backspace", "backspace", "backspace", *"50%")  # a wildcard in LIKE: literal here
        await wait_for(pilot, lambda: rows(screen) == ["Discounts"])
        option = screen.query_one(OptionList).get_option_at_index(0)
        assert "is 50% off a good deal" in str(option.prompt)  # the matching words are shown
        screen.query_one(Input).value = ""
        await pilot.press(*"zzz")
        await wait_for(pilot, lambda: rows(screen) == ["No chat contains “zzz”."])
        await pilot.press("enter")  # nothing to open
        await pilot.pause(0.1)
        assert app.screen is screen
        screen.query_one(Input).value = ""
        await pilot.press(*"lifetime", "enter")
        await wait_for(pilot, lambda: app.screen is not screen and app.conversation.chat_id == ids["Rust lifetimes"])
        assert app.sub_title == "Rust lifetimes"


async def test_down_from_the_box_picks_among_the_matches(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        assert app.archive.history is not None
        ids = fill(app.archive.history)
        await pilot.press("f3")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatsScreen))
        screen = app.screen
        assert isinstance(screen, ChatsScreen)
        await pilot.press("ctrl+f", *"is")  # in three chats, newest first
        await wait_for(pilot, lambda: rows(screen) == ["Paths", "Discounts", "Tea plans"])
        await pilot.press("down")
        await wait_for(pilot, lambda: app.focused is screen.query_one(OptionList))
        await pilot.press("down", "enter")
        await wait_for(pilot, lambda: app.conversation.chat_id == ids["Discounts"])


async def test_titles_and_messages_found_are_shown_inert(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        history = app.archive.history
        assert history is not None
        chat = history.create_chat("[b]bold[/b] \x1b]0;pwned\x07", "fast")
        history.add_message(chat, "user", "find \x1b[31mred[/] me")
        await pilot.press("f3")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatsScreen))
        screen = app.screen
        assert isinstance(screen, ChatsScreen)
        await pilot.press("slash", *"find")
        await wait_for(pilot, lambda: len(rows(screen)) == 1 and "find" in str(
            screen.query_one(OptionList).get_option_at_index(0).prompt))
        text = str(screen.query_one(OptionList).get_option_at_index(0).prompt)
        assert "\x1b" not in text and "\x07" not in text and "[b]bold[/b]" in text


async def test_a_title_of_100k_characters_is_one_cut_line_in_the_list_the_header_and_dialogs(
        make_app: Callable[..., SpecChatApp]) -> None:
    """Such a title (renamed by hand, or a history file edited) wrapped into 1,400 rows of the list and
    was wrapped again at each key typed into the search: the app froze for minutes."""
    from app.ui.screens.edit import ConfirmScreen

    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        history = app.archive.history
        assert history is not None
        huge = history.create_chat("T" * 100_000 + " END\nsecond line", "fast")
        history.add_message(huge, "user", "hello")
        await pilot.press("f3")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatsScreen))
        screen = app.screen
        title = rows(screen)[0]  # type: ignore[arg-type]
        assert len(title) <= 100 and title.endswith("…") and title.startswith("TTTT")
        await pilot.press("slash", *"TTTTTTTT")
        await wait_for(pilot, lambda: len(rows(screen)) == 1)  # type: ignore[arg-type]
        screen.query_one(OptionList).focus()
        await pilot.press("d")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert len(app.screen._question) < 300  # type: ignore[attr-defined]
        await pilot.press("n")
        await wait_for(pilot, lambda: app.screen is screen)
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.conversation.chat_id == huge)
        assert len(app.sub_title) <= 160 and "\n" not in app.sub_title


async def test_slash_and_the_letters_after_it_in_one_read_are_the_search_not_commands(
        make_app: Callable[..., SpecChatApp]) -> None:
    """`/ d y e` in one read: d opened the delete question and y confirmed it, deleting the open
    chat (a hostile reviewer's); `/ n o t e s` started a new chat. The letters are the search."""
    from textual import events

    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        assert app.archive.history is not None
        fill(app.archive.history)
        await pilot.press("f3")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatsScreen))
        screen = app.screen
        await pilot.pause(0.2)
        for name, ch in [("slash", "/"), *[(c, c) for c in "dye"]]:
            app.post_message(events.Key(name, ch))
        await wait_for(pilot, lambda: screen.query_one(Input).value == "dye")
        await pilot.pause(0.2)
        assert app.screen is screen and len(app.archive.history.list_chats()) == len(CHATS)
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, ChatsScreen))
        for name, ch in [("f3", None), ("slash", "/"), *[(c, c) for c in "notes"]]:  # F3 too, in the same read
            app.post_message(events.Key(name, ch))
        await wait_for(pilot, lambda: isinstance(app.screen, ChatsScreen)
                       and app.screen.query_one(Input).value == "notes")
        assert app.conversation.prompt.text == ""


def test_a_search_too_long_for_sqlite_says_so_not_that_the_history_failed(specchat_dirs) -> None:  # type: ignore[no-untyped-def]
    """A pasted 30,000 "%" (escaped to 60,000) gave "Reading chat history failed: LIKE or GLOB
    pattern too complex", as if the history were damaged (a tester)."""
    from app.store.history import History, HistoryError

    history = History.open()
    chat = history.create_chat("percent", None)
    history.add_message(chat, "user", "100% sure")
    assert [c.id for c, _ in history.search_chats("%" * 100)] == []
    assert [c.id for c, _ in history.search_chats("%")] == [chat]
    assert history.search_chats("%" * 30_000) == []  # no LIKE pattern since search folds case itself
    with pytest.raises(HistoryError, match=r"^The search is too long \(50,001 characters\): search for a shorter"):
        history.search_chats("a" * 50_001)
    history.close()


async def test_many_chats_list_the_newest_and_a_search_runs_once_typing_pauses(
        make_app: Callable[..., SpecChatApp], monkeypatch: pytest.MonkeyPatch) -> None:
    """5,000 chats: F3 took a second to open and each key typed into the search froze the dialog
    0.7 s (every chat's row built again, the search run on the UI's thread at every key)."""
    from app.ui.screens import chats as chats_module

    monkeypatch.setattr(chats_module, "SEARCH_PAUSE_S", 1.0)  # a loaded machine's keys, too, come within it
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        history = app.archive.history
        assert history is not None
        for i in range(chats_module.ROWS_SHOWN + 50):
            history.create_chat(f"chat {i} keeper", "fast")
        searches: list[str] = []
        real = history.search_chats
        monkeypatch.setattr(history, "search_chats", lambda text: searches.append(text) or real(text))
        await pilot.press("f3")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatsScreen))
        screen = app.screen
        shown = rows(screen)  # type: ignore[arg-type]
        assert len(shown) == chats_module.ROWS_SHOWN + 1 and shown[0].startswith(f"chat {chats_module.ROWS_SHOWN + 49} ")
        assert shown[-1] == "… 50 older chats: / searches them"
        await pilot.press("slash", *"keeper")
        await wait_for(pilot, lambda: searches == ["keeper"])  # once, as typing paused: not at each key
        await wait_for(pilot, lambda: rows(screen)[-1] == "… 50 older matches: type more to narrow the search")  # type: ignore[arg-type]
        await pilot.press(*["backspace"] * 6, *"chat 3 k")
        await wait_for(pilot, lambda: rows(screen) == ["chat 3 keeper"])  # type: ignore[arg-type]
        assert searches == ["keeper", "chat 3 k"]
        await pilot.press(*["backspace"] * 8, *"chat 1 k", "down", "enter")  # at once: no pause for the search
        await wait_for(pilot, lambda: app.screen is not screen)
        assert app.conversation.title == "chat 1 keeper"  # the match, not a row of the list before it


async def test_a_search_shown_at_down_keeps_the_highlight_when_its_worker_answers_late(
        make_app: Callable[..., SpecChatApp], monkeypatch: pytest.MonkeyPatch) -> None:
    """Down showed the search at once; the worker's answer for the same search then showed it
    again, its first row highlighted: the row the user had moved to was lost (and Enter opened another)."""
    import threading

    from app.ui.screens import chats as chats_module

    monkeypatch.setattr(chats_module, "SEARCH_PAUSE_S", 0.05)
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        history = app.archive.history
        assert history is not None
        for i in range(3):
            history.create_chat(f"plan {i}", "fast")
        await pilot.press("f3")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatsScreen))
        screen = app.screen
        assert isinstance(screen, ChatsScreen)
        release, asked = threading.Event(), threading.Event()
        real = screen._find

        def slow(query: str):  # type: ignore[no-untyped-def]
            if threading.current_thread() is not threading.main_thread():  # the worker's: held back
                asked.set()
                release.wait(10)
            return real(query)

        monkeypatch.setattr(screen, "_find", slow)
        await pilot.press("slash", *"plan")
        await wait_for(pilot, asked.is_set)  # the worker is searching
        await pilot.press("down")  # shown now, by the UI's thread
        await wait_for(pilot, lambda: rows(screen) == ["plan 2", "plan 1", "plan 0"])
        await pilot.press("down")
        assert screen.query_one(OptionList).highlighted == 1
        release.set()
        await pilot.pause(0.3)
        assert screen.query_one(OptionList).highlighted == 1
