"""Quitting never loses a chat silently: with history writes failing, ctrl+q asks first."""
from __future__ import annotations

from collections.abc import Callable
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from app.ui.app import SpecChatApp
from app.ui.screens.quit import QuitScreen
from app.ui.widgets.prompt import PromptArea
from tests.app.fakes import FakeLoader
from tests.app.helpers import ready, send, wait_for

pytestmark = pytest.mark.anyio


def _make_history_read_only(app: SpecChatApp) -> None:
    """From now on every history write fails as SQLite fails on a read-only file (not a lock)."""
    history = app.archive.history
    assert history is not None and history.path is not None
    with history._lock:
        history._conn.close()
        history._conn = sqlite3.connect(f"file:{history.path}?mode=ro", uri=True, check_same_thread=False)


async def _unsaved_reply(pilot, app: SpecChatApp) -> None:  # type: ignore[no-untyped-def]
    await send(pilot, "hi")
    await wait_for(pilot, lambda: not app.conversation.generating and app.archive.saver.unsaved() == 0)
    _make_history_read_only(app)
    await send(pilot, "my unsaved question " + "x" * 5000)
    await wait_for(pilot, lambda: len(app.conversation.messages()) == 4 and not app.conversation.generating)
    await wait_for(pilot, lambda: app.archive.saver.lagging and app.archive.saver.unsaved() == 1)
    await wait_for(pilot, lambda: any("readonly database" in n.message and "quitting first asks" in n.message
                                      for n in app._notifications))
    assert not any("lock is released" in n.message for n in app._notifications)


async def test_ctrl_q_with_writes_failing_asks_and_export_keeps_the_chat(
    make_app: Callable[..., SpecChatApp], specchat_dirs: Path
) -> None:
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        await _unsaved_reply(pilot, app)
        app.query_one(PromptArea).insert("typed, not sent")
        await pilot.press("ctrl+q")
        await wait_for(pilot, lambda: isinstance(app.screen, QuitScreen))
        assert app.return_code is None  # still running
        await pilot.press("escape")  # stay
        await wait_for(pilot, lambda: not isinstance(app.screen, QuitScreen))
        assert app.return_code is None
        await pilot.press("ctrl+q")
        await wait_for(pilot, lambda: isinstance(app.screen, QuitScreen))
        await pilot.press("e")
        await wait_for(pilot, lambda: app.return_code is not None)
    (exported,) = (specchat_dirs / "exports").glob("unsaved-chat-*.md")
    text = exported.read_text()
    assert "## User\n\nmy unsaved question " + "x" * 5000 in text
    assert "## Assistant\n\nHello there!" in text and "## Unsent prompt\n\ntyped, not sent" in text
    assert exported.stat().st_mode & 0o777 == 0o600


async def test_ctrl_q_with_writes_failing_can_discard(make_app: Callable[..., SpecChatApp],
                                                      specchat_dirs: Path) -> None:
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        await _unsaved_reply(pilot, app)
        await pilot.press("ctrl+q")
        await wait_for(pilot, lambda: isinstance(app.screen, QuitScreen))
        await pilot.press("d")
        await wait_for(pilot, lambda: app.return_code is not None)
    assert not (specchat_dirs / "exports").exists()


async def test_ctrl_q_quits_at_once_when_everything_is_saved(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "hi")
        await wait_for(pilot, lambda: not app.conversation.generating and app.archive.saver.unsaved() == 0)
        app.query_one(PromptArea).insert("typed, not sent")  # alone, it does not stop ctrl+q
        await pilot.press("ctrl+q")
        await wait_for(pilot, lambda: app.return_code is not None)


async def test_ctrl_q_keeps_an_edit_of_the_last_prompt_and_asks_over_other_edited_dialogs(
        make_app: Callable[..., SpecChatApp]) -> None:
    """ctrl+q in ctrl+g's dialog quit at once and the edit was gone; in F8's, the system prompt typed
    (a hostile tester's). The prompt's edit comes back in the box at the next start; F8's asks."""
    from app.store.state import take_draft
    from app.ui.screens.edit import ConfirmScreen, EditScreen

    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "hi")
        await wait_for(pilot, lambda: not app.conversation.generating)
        await pilot.press("f8")
        await wait_for(pilot, lambda: isinstance(app.screen, EditScreen))
        await pilot.press(*"Be formal.")
        await pilot.press("ctrl+q")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("ctrl+q")  # a second ctrl+q waits for the answer
        await pilot.press("n")
        await wait_for(pilot, lambda: isinstance(app.screen, EditScreen) and app.screen.text.endswith("Be formal."))
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, EditScreen))
        await pilot.press("ctrl+g")
        await wait_for(pilot, lambda: isinstance(app.screen, EditScreen))
        await pilot.press(*" plus a long careful edit")
        await pilot.press("ctrl+q")
        await wait_for(pilot, lambda: app.return_code is not None)
    assert take_draft() == "hi plus a long careful edit"


def test_the_unsaved_export_goes_to_the_next_folder_that_works(specchat_dirs: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from app.ui.export import export_unsaved

    specchat_dirs.mkdir(parents=True)
    (specchat_dirs / "exports").write_text("a file where the folder should be")
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    (home / "chat.md").write_text("mine")
    written = export_unsaved("# kept\n", "chat.md")
    assert written == home / "chat-2.md" and written.read_text() == "# kept\n"
    assert (home / "chat.md").read_text() == "mine"


def test_a_history_kept_in_memory_is_at_risk_once_the_chat_has_messages(specchat_dirs: Path) -> None:
    from app.store.history import History
    from app.ui.archive import Archive

    archive = Archive(lambda text: None)
    assert archive.at_risk(on_screen=True) is None  # not open yet: nothing to lose
    archive.history = History._in_memory("the history database could not be used")
    assert archive.at_risk(on_screen=False) is None
    assert "not saved" in (archive.at_risk(on_screen=True) or "")
    archive.close()


async def test_sigterm_with_writes_failing_exports_what_would_be_lost(
    make_app: Callable[..., SpecChatApp], specchat_dirs: Path
) -> None:
    import signal

    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        await _unsaved_reply(pilot, app)
        app.signals.on_signal(signal.SIGTERM)  # what the loop's handler calls
        await wait_for(pilot, lambda: app.return_code is not None)
    assert app.return_code == 128 + signal.SIGTERM
    (exported,) = (specchat_dirs / "exports").glob("unsaved-chat-*.md")
    assert "my unsaved question" in exported.read_text()


async def test_an_unsaved_chat_that_never_got_an_id_is_exported_once(
    make_app: Callable[..., SpecChatApp], specchat_dirs: Path
) -> None:
    """Writes failing from the first message: the chat on screen was also taken for another
    chat's pending reply (its id never set) and exported twice, once as "(title) prompt"."""
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        _make_history_read_only(app)
        await send(pilot, "secret question")
        await wait_for(pilot, lambda: not app.conversation.generating and app.archive.saver.lagging)
        assert app.conversation.chat_id is None
        await pilot.press("ctrl+q")
        await wait_for(pilot, lambda: isinstance(app.screen, QuitScreen))
        await pilot.press("e")
        await wait_for(pilot, lambda: app.return_code is not None)
    (exported,) = (specchat_dirs / "exports").glob("unsaved-chat-*.md")
    text = exported.read_text()
    assert text.startswith("# secret question\n")  # the header's title: the chat's, as saved
    body = text.split("\n", 1)[1]
    assert body.count("secret question") == 1 and body.count("## Assistant") == 1


def test_after_a_signal_a_stuck_exit_ends_the_process_once_the_saver_had_its_wait(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The last resort behind a terminal closed under the app: if the normal exit never ends
    (Textual's output queue, before HungUpSafe), the process ends with 128 + the signal after
    the saver's wait and EXIT_ANYWAY_S, the saver flushed once more; never under run_test."""
    import signal
    import threading

    from app.ui import quitting

    slept: list[float] = []
    ended = threading.Event()
    codes: list[int] = []
    real_sleep = quitting.time.sleep  # the time module's own: other threads of this process sleep through it

    def sleep(seconds: float) -> None:
        if threading.current_thread().name == "exit-anyway":
            slept.append(seconds)
        else:
            real_sleep(seconds)

    monkeypatch.setattr(quitting.time, "sleep", sleep)
    monkeypatch.setattr(quitting.os, "_exit", lambda code: (codes.append(code), ended.set()))

    class Saver:
        flushed: list[float] = []

        def flush(self, timeout: float) -> bool:
            self.flushed.append(timeout)
            return True

    class Archive:
        exit_wait_s = 10.0
        saver = Saver()

        def at_risk(self, on_screen: bool) -> None:
            return None

    class App:
        def __init__(self, headless: bool) -> None:
            self.is_headless = headless
            self.exits: list[int] = []

        def exit(self, return_code: int = 0, message: object = None) -> None:
            self.exits.append(return_code)

    class Conversation:
        private = False

        def messages(self) -> list[object]:
            return []

    headless = App(headless=True)
    quitting.ExitOnSignals(headless, Conversation(), Archive()).on_signal(signal.SIGHUP)  # type: ignore[arg-type]
    assert headless.exits == [128 + signal.SIGHUP] and not ended.wait(0.5)  # a test's process is left alone
    real = App(headless=False)
    quitting.ExitOnSignals(real, Conversation(), Archive()).on_signal(signal.SIGHUP)  # type: ignore[arg-type]
    assert ended.wait(5)
    assert real.exits == [128 + signal.SIGHUP] and codes == [128 + signal.SIGHUP]
    assert slept == [Archive.exit_wait_s + quitting.EXIT_ANYWAY_S] and Saver.flushed == [quitting.QUIT_ANSWERED_WAIT_S]


def test_a_signal_arms_the_last_resort_while_the_apps_loop_is_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    """asyncio's handler ran only once the loop was free: a loop kept busy for minutes left the app
    running after its terminal closed. Python's handler arms the exit at once; the loop exits later."""
    import asyncio
    import os
    import signal
    import threading

    from app.ui import quitting

    armed = threading.Event()
    monkeypatch.setattr(quitting.ExitOnSignals, "_exit_anyway", lambda self, sig: armed.set())

    class App:
        is_headless = False
        exits: list[int] = []

        def exit(self, return_code: int = 0, message: object = None) -> None:
            self.exits.append(return_code)

    class Archive:
        def at_risk(self, on_screen: bool) -> None:
            return None

    class Conversation:
        private = False

        def messages(self) -> list[object]:
            return []

    app = App()
    handler = quitting.ExitOnSignals(app, Conversation(), Archive())  # type: ignore[arg-type]
    seen_while_busy: list[bool] = []

    async def busy() -> None:
        handler.install()
        try:
            threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGHUP)).start()
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline and not armed.is_set():
                sum(range(10_000))  # the loop's thread busy in Python, never yielding to the loop
            seen_while_busy.append(armed.is_set() and app.exits == [])
            await asyncio.sleep(0.05)  # the loop runs the exit it was asked for
        finally:
            handler.remove()

    asyncio.run(busy())
    assert seen_while_busy == [True] and app.exits == [128 + signal.SIGHUP]
    assert signal.getsignal(signal.SIGHUP) is not handler._caught  # put back


async def test_ctrl_q_during_a_switch_stops_the_load_and_closes_both_pairs(make_app: Callable[..., SpecChatApp],
                                                                         loader: FakeLoader) -> None:
    """Quitting waited for the whole load on a blank screen (the host's close waited on the lock the
    load held; a hostile reviewer's 22-27 s): the load is stopped, and the pair it replaced closed."""
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        old = app.engine.backend
        loader.gate = threading.Event()  # never set: a load that would take its whole 10 s
        app.switch_profile("lookup")
        await wait_for(pilot, lambda: app.engine.loading)
        t0 = time.monotonic()
        await pilot.press("ctrl+q")
        await wait_for(pilot, lambda: app.return_code is not None)
    assert time.monotonic() - t0 < 5
    assert old.closed and len(loader.backends) == 1


async def test_a_panic_ends_the_app_with_status_1_not_0(make_app: Callable[..., SpecChatApp]) -> None:
    """An error in Textual's input thread (a byte that was not UTF-8, before it was read as U+FFFD)
    ends the app through ``panic``: it exited 0, as if the user had quit."""
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        app.panic("the input thread failed")  # as Textual's input thread does, through call_later
    assert app.return_code == 1


async def test_ctrl_q_under_a_lock_taken_before_any_write_failed_exports_what_it_could_not_save(
        make_app: Callable[..., SpecChatApp], specchat_dirs: Path) -> None:
    """A lock taken just before ctrl+q: no write had failed yet, so nothing was asked, and once the
    saver's wait ran out the reply was lost without a word."""
    from tests.app.store.locking import hold_lock

    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "hi")
        await wait_for(pilot, lambda: not app.conversation.generating and app.archive.saver.unsaved() == 0)
        assert app.archive.history is not None and app.archive.history.path is not None
        thread, _ = hold_lock(app.archive.history.path, 8, exclusive=False)
        await send(pilot, "asked under the lock")
        await wait_for(pilot, lambda: len(app.conversation.messages()) == 4 and not app.conversation.generating)
        assert not app.archive.saver.lagging  # its write still waits on the lock: nothing failed yet
        app.conversation.set_system_prompt("Be brief.")  # a setting the lock keeps out too (it was dropped)
        app.archive.exit_wait_s = 0.5
        await pilot.press("ctrl+q")
        await wait_for(pilot, lambda: app.return_code is not None)
    assert app.exit_note is not None and "they were exported to" in app.exit_note
    (exported,) = (specchat_dirs / "exports").glob("unsaved-chat-*.md")
    assert "asked under the lock" in exported.read_text() and "Hello there!" in exported.read_text()
    assert ": System prompt: Be brief." in exported.read_text()
    thread.join()


async def test_unsent_text_the_state_folder_cannot_keep_is_exported_at_quit(
        make_app: Callable[..., SpecChatApp], specchat_dirs: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With the state folder a file (or read-only), the text left in the box was dropped without a word."""
    blocker = tmp_path / "state-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("SPECCHAT_STATE_DIR", str(blocker))
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        app.query_one(PromptArea).insert("half a question worth keeping")
        await pilot.press("ctrl+q")
        await wait_for(pilot, lambda: app.return_code is not None)
    assert app.exit_note is not None and str(blocker) in app.exit_note and "unsent text was exported to" in app.exit_note
    (exported,) = (specchat_dirs / "exports").glob("unsent-text-*.md")
    assert "## Unsent prompt\n\nhalf a question worth keeping" in exported.read_text()


async def test_an_engine_without_a_log_is_said_once_it_is_ready(make_app: Callable[..., SpecChatApp],
                                                                loader: FakeLoader) -> None:
    """The child's log cannot be written (engine.child.backend.writable_log): the app says why and where."""
    note = "the engine's log cannot be written to /state/engine.log (Permission denied): it runs without one."

    def noting(profile, budget, progress, stop=None):  # type: ignore[no-untyped-def]
        backend = loader(profile, budget, progress, stop)
        backend.log_note = note  # type: ignore[attr-defined]
        return backend

    app = make_app(loader=noting)
    async with app.run_test() as pilot:
        await ready(pilot)
        await wait_for(pilot, lambda: any(n.message == note and n.title == "Engine log" for n in app._notifications))
        app.switch_profile("lookup")  # loaded again: said once a session, not at every load (a review's)
        await wait_for(pilot, lambda: app.engine.profile.name == "lookup" and not app.engine.loading)
        await pilot.pause()
        assert sum(n.message == note for n in app._notifications) == 1


def test_a_signal_while_the_app_closes_arms_the_last_resort_and_exits_nothing_twice(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The handlers were unhooked as the close began: a SIGHUP while the close waited on a lock was
    Python's default, and the process died at once with nothing exported (a review's)."""
    import signal

    from app.ui import quitting

    armed: list[int] = []

    class App:
        is_headless = False
        exits: list[int] = []

        def exit(self, return_code: int = 0, message: object = None) -> None:
            self.exits.append(return_code)

    class Archive:
        def at_risk(self, on_screen: bool) -> str:
            raise AssertionError("nothing is exported again while the app closes")

    app = App()
    signals = quitting.ExitOnSignals(app, object(), Archive())  # type: ignore[arg-type]
    monkeypatch.setattr(signals, "_arm", armed.append)
    signals.closing()
    signals.on_signal(signal.SIGHUP)
    assert armed == [signal.SIGHUP] and app.exits == []
