"""The input loop's wait: Esc becomes a key after ESC_WAIT_S, not after Textual's 100-200 ms."""
from __future__ import annotations

import os
import threading
import time

from textual import events
from textual._xterm_parser import XTermParser

from app.ui.key_reader import ESC_WAIT_S, IDLE_WAIT_S, escape_wait, input_wait, read_keys


def test_the_wait_is_the_users_escdelay_else_ours() -> None:
    assert escape_wait({}) == ESC_WAIT_S
    assert escape_wait({"ESCDELAY": "25"}) == 0.025
    assert escape_wait({"ESCDELAY": "0"}) == 0.001  # as Textual: at least a millisecond
    assert escape_wait({"ESCDELAY": "soon"}) == ESC_WAIT_S


def test_select_waits_only_until_a_pending_esc_is_due() -> None:
    from textual import constants

    constants.ESCAPE_DELAY = ESC_WAIT_S  # as read_keys sets it
    parser = XTermParser()
    assert input_wait(parser, time.monotonic()) == IDLE_WAIT_S  # nothing pending
    before = time.monotonic()
    list(parser.feed("\x1b"))  # a lone ESC: the parser waits for more
    after = time.monotonic()
    due = parser._timeout_time
    assert due is not None
    assert abs(input_wait(parser, due - 0.01) - 0.01) < 1e-9
    assert before + ESC_WAIT_S <= due <= after + ESC_WAIT_S  # our wait, not Textual's 100 ms
    assert input_wait(parser, due + 1) == 0.0


class PipeDriver:
    """What read_keys needs of a driver: a file descriptor, an exit flag, process_message."""

    def __init__(self, fileno: int) -> None:
        self.fileno = fileno
        self.exit_event = threading.Event()
        self.keys: list[str] = []

    def process_message(self, message: object) -> None:
        if isinstance(message, events.Key):
            self.keys.append(message.key)


def test_a_lone_esc_is_read_as_esc_within_the_wait_and_a_sequence_stays_one_key() -> None:
    read_end, write_end = os.pipe()
    driver = PipeDriver(read_end)
    thread = threading.Thread(target=read_keys, args=(driver, XTermParser()), daemon=True)
    thread.start()
    try:
        os.write(write_end, b"\x1b[A")  # an arrow: one key, not Esc then "[A"
        os.write(write_end, b"\x1b")
        deadline = time.monotonic() + 5
        while len(driver.keys) < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
    finally:
        driver.exit_event.set()
        thread.join(5)
        os.close(write_end)
        os.close(read_end)
    assert driver.keys == ["up", "escape"]


def test_a_waking_exit_flag_ends_the_loop_at_once_though_it_waits_long_for_keys() -> None:
    """The app's driver wakes its input loop through a pipe: the loop waits WOKEN_WAIT_S for keys
    (not IDLE_WAIT_S), and still ends within a few milliseconds of the flag being set."""
    from app.ui.key_reader import WOKEN_WAIT_S, WakingEvent

    class CountingParser(XTermParser):
        ticks = 0

        def tick(self):  # type: ignore[no-untyped-def]
            CountingParser.ticks += 1  # once a pass of the loop
            return super().tick()

    read_end, write_end = os.pipe()
    driver = PipeDriver(read_end)
    driver.exit_event = WakingEvent()
    thread = threading.Thread(target=read_keys, args=(driver, CountingParser()), daemon=True)
    thread.start()
    try:
        time.sleep(0.6)  # the loop is blocked in select now, for up to WOKEN_WAIT_S
        assert CountingParser.ticks <= 1, f"the idle loop woke {CountingParser.ticks} times in 0.6 s"
        os.write(write_end, b"q")
        deadline = time.monotonic() + 5
        while not driver.keys and time.monotonic() < deadline:
            time.sleep(0.001)
        assert driver.keys == ["q"]  # keys still arrive while it waits long
        set_at = time.monotonic()
        driver.exit_event.set()
        thread.join(WOKEN_WAIT_S / 2)
        assert not thread.is_alive(), "the loop waited out its backstop instead of waking"
        assert time.monotonic() - set_at < WOKEN_WAIT_S / 4
        driver.exit_event.clear()  # Textual clears it after the join: the pipe is drained
        assert not driver.exit_event.is_set()
        import select

        assert select.select([driver.exit_event.fileno()], [], [], 0)[0] == []
    finally:
        os.close(write_end)
        os.close(read_end)


def test_an_input_that_ends_leaves_the_loop_waiting_not_spinning() -> None:
    """A closed pipe reads ready at once, forever: the loop stops watching it, keeps the keys read
    before its end, and then wakes only as an idle loop does (it spun a core at 99% before)."""
    from app.ui.key_reader import WakingEvent

    class CountingParser(XTermParser):
        ticks = 0

        def tick(self):  # type: ignore[no-untyped-def]
            type(self).ticks += 1  # once a pass of the loop
            return super().tick()

    for waking in (False, True):
        read_end, write_end = os.pipe()
        driver = PipeDriver(read_end)
        if waking:
            driver.exit_event = WakingEvent()
        parser = type("Parser", (CountingParser,), {"ticks": 0})()
        thread = threading.Thread(target=read_keys, args=(driver, parser), daemon=True)
        thread.start()
        try:
            os.write(write_end, b"q")
            os.close(write_end)  # the input ends
            time.sleep(0.5)
            assert driver.keys == ["q"]
            assert type(parser).ticks <= 8, f"the loop passed {type(parser).ticks} times in 0.5 s after its input ended"
            driver.exit_event.set()
            thread.join(5)
            assert not thread.is_alive()
        finally:
            os.close(read_end)


def test_bytes_that_are_not_utf8_read_as_a_replacement_and_a_split_character_waits_for_its_rest() -> None:
    """One 0x9b or 0xf8 byte (xterm's 8-bit Alt+letter, a Latin-1 terminal, a binary paste) ended the
    input thread with a UnicodeDecodeError, and the app with it (a hostile tester's); the first byte
    of "é" read alone looked like the input's end."""
    read_end, write_end = os.pipe()
    driver = PipeDriver(read_end)
    thread = threading.Thread(target=read_keys, args=(driver, XTermParser()), daemon=True)
    thread.start()
    try:
        os.write(write_end, b"a\xf8b")
        os.write(write_end, "é".encode()[:1])
        time.sleep(0.05)
        os.write(write_end, "é".encode()[1:] + b"c")
        deadline = time.monotonic() + 5
        while len(driver.keys) < 5 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert thread.is_alive()
    finally:
        driver.exit_event.set()
        thread.join(5)
        os.close(write_end)
        os.close(read_end)
    assert driver.keys == ["a", "replacement_character", "b", "é", "c"]  # U+FFFD's key name
