"""The terminal's input loop, with Esc read as Esc after 30 ms instead of Textual's 100-200 ms.

A lone ESC byte is either the Esc key or the start of a longer sequence (an
arrow, Alt+letter); a reader can only tell by waiting a moment for more bytes.
Textual waits ``ESCDELAY`` (100 ms by default) and, because its input thread
looks at the clock only when its 100 ms ``select`` times out, Esc became a key
100-200 ms after it was typed: most of the time Esc took to stop a reply
(``scripts/app_speed.py``: 110-118 ms from the Esc sent to the key read, of
280-350 ms to "■ stopped").

Here the loop is the same (read, feed Textual's own parser, tick it), but its
``select`` waits only until the parser's pending Esc times out, and that wait is
:data:`ESC_WAIT_S` unless the user set ``ESCDELAY`` (milliseconds, as for
ncurses and Textual). A terminal writes a key's sequence in one go, so the rest
of an arrow or Alt+letter arrives well within it, also over SSH; people do not
type two keys 30 ms apart (neovim's ``ttimeoutlen`` is 50 ms, tmux's
``escape-time`` 10 ms).

Nothing else wakes the loop: where the driver's exit flag is a :class:`WakingEvent` (the
app's driver), setting it wakes ``select`` through a pipe, so the loop does not look at
the flag ten times a second (on 2 cores each wake-up takes a moment from one of the
engine's threads while the other waits for it).
"""
from __future__ import annotations

import os
import selectors
import threading
from codecs import getincrementaldecoder
from typing import Any

from textual import constants
from textual._parser import ParseError
from textual._time import get_time
from textual._xterm_parser import XTermParser

ESC_WAIT_S = 0.03
"""How long a lone ESC waits for the rest of a sequence before it is the Esc key (seconds)."""

IDLE_WAIT_S = 0.1
"""How long the loop waits for input when nothing is pending (the exit flag is read as often)."""

WOKEN_WAIT_S = 2.0
"""The same where setting the exit flag wakes the loop (:class:`WakingEvent`): a backstop only."""


class WakingEvent(threading.Event):
    """A driver's exit flag whose :meth:`set` also writes a byte to a pipe that the input loop's
    ``select`` watches (:meth:`fileno`); :meth:`clear` drains it."""

    def __init__(self) -> None:
        super().__init__()
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)

    def fileno(self) -> int:
        return self._read

    def set(self) -> None:
        super().set()
        try:
            os.write(self._write, b"\0")
        except (BlockingIOError, OSError):  # full (already woken) or closed
            pass

    def clear(self) -> None:
        super().clear()
        try:
            while os.read(self._read, 64):
                pass
        except (BlockingIOError, OSError):
            pass


def escape_wait(environ: "os._Environ[str] | dict[str, str]" = os.environ) -> float:
    """:data:`ESC_WAIT_S`, or the user's ``ESCDELAY`` in milliseconds (as Textual reads it)."""
    try:
        return max(1, int(environ["ESCDELAY"])) / 1000.0
    except (KeyError, ValueError):
        return ESC_WAIT_S


def input_wait(parser: Any, now: float, idle: float = IDLE_WAIT_S) -> float:
    """Seconds the loop may block in ``select``: until the parser's pending timeout (a lone
    ESC's) is due, at most ``idle``."""
    due = getattr(parser, "_timeout_time", None)  # Textual's Parser; None when nothing is pending
    if due is None:
        return idle
    return min(idle, max(0.0, due - now))


def read_keys(driver: Any, parser: XTermParser) -> None:
    """The body of a Linux driver's input thread: read ``driver.fileno``, feed ``parser``
    (Textual's, or one derived from it), hand each event to ``driver.process_message``,
    until ``driver.exit_event`` is set."""
    constants.ESCAPE_DELAY = escape_wait()  # type: ignore[misc]  # Textual's parser reads it at each ESC
    selector = selectors.SelectSelector()
    selector.register(driver.fileno, selectors.EVENT_READ)
    woken = isinstance(driver.exit_event, WakingEvent)
    if woken:
        selector.register(driver.exit_event.fileno(), selectors.EVENT_READ)
    idle = WOKEN_WAIT_S if woken else IDLE_WAIT_S
    # A byte that is not UTF-8 (xterm's 8-bit Alt+letter, a Latin-1 terminal, a binary paste) reads
    # as U+FFFD: a strict decoder's error ended this thread, and with it the app.
    decode = getincrementaldecoder("utf-8")(errors="replace").decode

    watching = True  # driver.fileno is registered: until its input ends

    def take(ready: list[tuple[selectors.SelectorKey, int]], final: bool = False) -> None:
        nonlocal watching
        for key, mask in ready:
            if mask & selectors.EVENT_READ and key.fd == driver.fileno:
                raw = os.read(driver.fileno, 4096)
                if not raw:  # the input ended (a pipe closed): at its end it reads ready at once, forever
                    selector.unregister(driver.fileno)
                    watching = False
                    break
                data = decode(raw, final=final)  # "" while a character's bytes are still arriving
                for event in parser.feed(data) if data else ():
                    driver.process_message(event)
        for event in parser.tick():
            driver.process_message(event)

    try:
        while not driver.exit_event.is_set():
            if not watching and not woken:  # nothing to select on: only the flag, looked at as before
                driver.exit_event.wait(idle)
                continue
            take(selector.select(input_wait(parser, get_time(), idle)))
        if watching:
            selector.unregister(driver.fileno)
            take(selector.select(IDLE_WAIT_S), final=True)
    finally:
        selector.close()
        try:
            for _event in parser.feed(""):
                pass
        except (EOFError, ParseError):
            pass
