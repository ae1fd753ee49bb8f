"""Bracketed pastes holding escape sequences come in whole and in order (Textual's parser
ended them at the first ESC and sent the rest as key presses ahead of the paste)."""
from __future__ import annotations

import time

from textual import events
from textual._xterm_parser import XTermParser
from textual.drivers.linux_driver import LinuxDriver
from textual.drivers.headless_driver import HeadlessDriver

from app.ui.terminal_safety import PASTE_END, PASTE_START, PasteParser, pasted_text, safe_driver_class
from tests.hostile import ALL, raw_in

PASTE = "first\rsecond" + ALL + "last"


def summary(messages: list[object]) -> list[str]:
    return [f"paste:{m.text}" if isinstance(m, events.Paste) else f"key:{m.key}"  # type: ignore[attr-defined]
            for m in messages]


def feed(parser: XTermParser, *chunks: str) -> list[str]:
    out: list[object] = []
    for chunk in chunks:
        out.extend(parser.feed(chunk))
    return summary(out)


def test_a_paste_with_escapes_comes_whole_between_the_keys_around_it() -> None:
    data = "a" + PASTE_START + PASTE + PASTE_END + "b"
    assert feed(PasteParser(), data) == ["key:a", f"paste:{PASTE}", "key:b"]


def test_textuals_own_parser_reorders_it() -> None:  # the reason for PasteParser
    assert feed(XTermParser(), "a" + PASTE_START + PASTE + PASTE_END + "b")[:2] != ["key:a", f"paste:{PASTE}"]


def test_a_paste_across_several_reads_is_joined() -> None:
    data = PASTE_START + PASTE + PASTE_END + "z"
    cuts = [0, 3, 9, len(PASTE_START) + 20, len(data) - 4, len(data)]  # the end marker split too
    chunks = [data[a:b] for a, b in zip(cuts, cuts[1:])]
    assert feed(PasteParser(), *chunks) == [f"paste:{PASTE}", "key:z"]


def test_two_pastes_and_keys_keep_their_order() -> None:
    data = PASTE_START + "one" + PASTE_END + "x" + PASTE_START + "\x1b[2J" + PASTE_END
    assert feed(PasteParser(), data) == ["paste:one", "key:x", "paste:\x1b[2J"]


def test_the_app_takes_a_paste_with_new_lines_and_visible_controls() -> None:
    text = pasted_text(PASTE)
    assert text.startswith("first\nsecond<osc0-title>␛]0;pwned␇") and raw_in(text) == []


def test_the_linux_driver_reads_with_the_paste_parser() -> None:
    driver = safe_driver_class(LinuxDriver)
    assert issubclass(driver, LinuxDriver) and driver is not LinuxDriver
    assert safe_driver_class(HeadlessDriver) is HeadlessDriver


def test_the_start_of_a_start_marker_waits_for_the_next_read() -> None:
    parser = PasteParser()
    assert feed(parser, "x\x1b[2") == ["key:x"]
    assert feed(parser, "00~one\x1b[2J" + PASTE_END + "y") == ["paste:one\x1b[2J", "key:y"]


def test_what_only_looked_like_a_paste_starting_goes_on_at_the_next_tick() -> None:
    parser = PasteParser()
    assert feed(parser, "\x1b[") == []
    keys = summary(list(parser.tick()))
    deadline = time.monotonic() + 2.0
    while not keys and time.monotonic() < deadline:  # the parser's own wait for the rest of a sequence
        time.sleep(0.05)
        keys = summary(list(parser.tick()))
    assert keys != []


def test_esc_cr_is_alt_enter_and_other_alt_keys_are_as_textual_reads_them() -> None:
    """Alt+Enter arrives as ESC CR; Textual's parser read it as a bare Enter (the prompt was sent)."""
    def read(parser: XTermParser, data: str) -> list[str]:
        out = list(parser.feed(data))
        time.sleep(0.15)  # past the wait for the rest of an escape sequence
        return summary([*out, *parser.tick()])

    assert read(PasteParser(), "a\x1b\rb") == ["key:a", "key:alt+enter", "key:b"]
    assert read(XTermParser(), "a\x1b\rb") == ["key:a", "key:enter", "key:b"]  # the reason
    assert read(PasteParser(), "\r") == ["key:enter"]
    assert read(PasteParser(), "\x1ba") == ["key:alt+a"] and read(PasteParser(), "\x1b[A") == ["key:up"]
