"""Esc stops a reply from the terminal's input thread (app.ui.early_stop)."""
from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from textual import events
from textual.driver import Driver
from textual.message import Message

from app.ui.app import SpecChatApp
from app.ui.early_stop import early_stop_driver, split_esc_prefix
from app.ui.screens.help import HelpScreen
from app.ui.widgets.chat_view import AssistantMessage
from tests.app.fakes import FakeLoader
from tests.app.helpers import ready, send, wait_for


class RecordingDriver(Driver):
    """A driver stand-in: records what it would queue for the app."""

    def __init__(self) -> None:  # no app, no terminal
        self.sent: list[Message] = []

    def process_message(self, message: Message) -> None:
        self.sent.append(message)

    def write(self, data: str) -> None: ...
    def start_application_mode(self) -> None: ...
    def disable_input(self) -> None: ...
    def stop_application_mode(self) -> None: ...


def test_the_driver_tells_of_esc_at_once_and_still_queues_every_key() -> None:
    seen: list[str] = []
    driver = early_stop_driver(RecordingDriver, lambda: seen.append("stop"))()
    keys = [events.Key("a", "a"), events.Key("escape", None), events.Key("enter", "\r")]
    for key in keys:
        driver.process_message(key)
    assert seen == ["stop"] and driver.sent == keys


def test_a_failing_hook_never_loses_the_key() -> None:
    def broken() -> None:
        raise RuntimeError("boom")

    driver = early_stop_driver(RecordingDriver, broken)()
    key = events.Key("escape", None)
    driver.process_message(key)
    assert driver.sent == [key]


def test_alt_and_a_character_is_read_as_esc_then_the_character() -> None:
    """The terminal sends Esc-then-t and Alt+t as the same bytes; Textual names them alt+t."""
    assert [(k.key, k.character) for k in split_esc_prefix(events.Key("alt+t", "t"))] == [("escape", "\x1b"), ("t", "t")]
    assert [(k.key, k.character) for k in split_esc_prefix(events.Key("alt+shift+t", "T"))] == [("escape", "\x1b"), ("T", "T")]
    assert [(k.key, k.character) for k in split_esc_prefix(events.Key("alt+full_stop", "."))] == [("escape", "\x1b"), ("full_stop", ".")]
    for kept in (events.Key("alt+enter", "\r"), events.Key("alt+left", None), events.Key("t", "t"), events.Key("escape", "\x1b")):
        assert split_esc_prefix(kept) == [kept]


def test_the_driver_reads_esc_before_a_character_as_esc_only_when_asked_to() -> None:
    """In a dialog Esc-then-n is Esc, n; elsewhere alt+b stays itself (Option+Left on a Mac)."""
    seen: list[str] = []
    in_dialog = [True]
    driver = early_stop_driver(RecordingDriver, lambda: seen.append("stop"), esc_prefix=lambda: in_dialog[0])()
    driver.process_message(events.Key("alt+n", "n"))
    assert seen == ["stop"] and [key.key for key in driver.sent] == ["escape", "n"]  # type: ignore[attr-defined]
    in_dialog[0] = False
    driver.process_message(events.Key("alt+b", "b"))
    assert seen == ["stop"] and [key.key for key in driver.sent][-1] == "alt+b"  # type: ignore[attr-defined]


def test_a_failing_question_never_loses_the_key() -> None:
    def broken() -> bool:
        raise RuntimeError("boom")

    driver = early_stop_driver(RecordingDriver, lambda: None, esc_prefix=broken)()
    key = events.Key("alt+t", "t")
    driver.process_message(key)
    assert driver.sent == [key]


def test_the_app_reads_keys_through_the_early_stop_driver(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    assert issubclass(app.driver_class, Driver) and app.driver_class.__name__.startswith("EarlyStop")


@pytest.mark.anyio
async def test_the_app_asks_for_esc_then_a_letter_only_while_a_dialog_is_open(
        make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        assert not app.dialog_open()
        app.push_screen(HelpScreen([]))
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
        assert app.dialog_open()


@pytest.mark.anyio
async def test_alt_b_and_alt_f_move_a_word_in_the_prompt_box(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        app.conversation.prompt.insert("hello big world")
        await pilot.press("alt+b")
        assert app.conversation.prompt.cursor_location == (0, 10)
        await pilot.press("alt+b", "alt+f")
        assert app.conversation.prompt.cursor_location == (0, 9) and app.conversation.prompt.text == "hello big world"


@pytest.mark.anyio
async def test_esc_from_the_input_thread_stops_the_reply_unless_a_dialog_is_open(
        make_app: Callable[..., SpecChatApp]) -> None:
    loader = FakeLoader(hold_after=1)
    app = make_app(loader=loader)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "first")
        await wait_for(pilot, loader.backends[0].held.is_set)
        app.push_screen(HelpScreen([]))
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
        from_input_thread(app._stop_early)  # Esc closes the dialog: the reply goes on
        assert app.conversation.stream.cancel is not None and not app.conversation.stream.cancel.is_set()
        app.pop_screen()
        await wait_for(pilot, lambda: len(app.screen_stack) == 1)
        interrupted: list[str] = []
        loader.backends[0].interrupt = lambda: interrupted.append(threading.current_thread().name)  # type: ignore[attr-defined]
        from_input_thread(app._stop_early)
        assert app.conversation.stream.cancel.is_set()  # at once, before the UI's queue sees the key
        assert interrupted == ["keys"]  # and the engine itself is told, from the key's own thread
        await wait_for(pilot, lambda: not app.conversation.generating)
        assert app.query_one(AssistantMessage).finish_reason == "cancelled"
        from_input_thread(app._stop_early)  # nothing streams: nothing to stop, no error


def from_input_thread(fn: Callable[[], None]) -> None:
    thread = threading.Thread(target=fn, name="keys")
    thread.start()
    thread.join(5)


def test_every_other_key_click_or_scroll_asks_the_engine_for_a_core() -> None:
    seen: list[str] = []
    driver = early_stop_driver(RecordingDriver, lambda: seen.append("stop"), on_input=lambda: seen.append("input"))()
    for message in (events.Key("a", "a"), events.Key("escape", None), events.MouseScrollDown(None, 0, 0, 0, 0, 0, False, False, False)):
        driver.process_message(message)
    assert seen == ["input", "stop", "input"] and len(driver.sent) == 3  # type: ignore[attr-defined]


@pytest.mark.anyio
async def test_the_app_asks_the_loaded_engine_to_yield_from_the_input_thread(
        make_app: Callable[..., SpecChatApp], loader: FakeLoader) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        asked: list[str] = []
        loader.backends[0].yield_to_ui = lambda: asked.append(threading.current_thread().name)  # type: ignore[attr-defined]
        driver_class = app.get_driver_class()
        assert driver_class.__name__.startswith("EarlyStop")
        from_input_thread(app.engine.yield_to_ui)  # what the driver's on_input is
        assert asked == ["keys"]
