"""The app's side of terminal safety: the window title, pastes, the terminal's input and its size.

Each widget that shows text from outside makes it :func:`~engine.text_safety.inert`
itself; :class:`SafeTerminal`, mixed into the App, covers what belongs to the
App: its title and sub-title (a saved chat's title, a profile's name) and every
bracketed paste, whichever widget it goes to (a paste's ESC would otherwise be
shown raw by the prompt box and sent to the model).

Textual's input parser ends a bracketed paste at the first ESC inside it and
sends the rest as key presses *before* the paste: a paste holding an escape
sequence came out reordered. :class:`PasteParser` takes each bracketed paste
whole out of the input before the parser sees it. A read that ends in the first
characters of the start marker (``ESC [``, ``ESC [ 2``, ...) keeps them until the
next read or the next tick (a tenth of a second); a lone ESC goes on at once, as
the Esc key must, so a start marker split right after its ESC still goes the
parser's own way.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from textual import events
from textual._xterm_parser import XTermParser
from textual.driver import Driver
from textual.message import Message

from app.ui.key_reader import WakingEvent, read_keys
from engine.text_safety import inert

PASTE_START = "\x1b[200~"
PASTE_END = "\x1b[201~"


def pasted_text(text: str) -> str:
    """A paste as the app takes it: line breaks as ``\\n`` (terminals send ``\\r``), every other
    control character shown, never obeyed."""
    return inert(text.replace("\r\n", "\n").replace("\r", "\n"))


class PasteParser(XTermParser):
    """Textual's input parser, with each bracketed paste taken out whole and in its place."""

    def __init__(self, debug: bool = False) -> None:
        super().__init__(debug)
        self._paste: str | None = None
        """The paste read so far while inside one, else None."""
        self._held = ""
        """The end of the last read, when it may be the start of a paste's start marker."""

    def feed(self, data: str) -> Iterable[Message]:
        if not data:  # the end of input
            held, self._held = self._held, ""
            return [*(super().feed(held) if held else ()), *super().feed(data)]
        data, self._held = self._held + data, ""
        out: list[Message] = []
        while data:
            if self._paste is None:
                start = data.find(PASTE_START)
                if start < 0:
                    keep = next((n for n in range(len(PASTE_START) - 1, 1, -1)
                                 if data.endswith(PASTE_START[:n])), 0)
                    if keep:
                        data, self._held = data[:-keep], data[-keep:]
                    if data:
                        out.extend(super().feed(data))
                    break
                if start:
                    out.extend(super().feed(data[:start]))
                self._paste, data = "", data[start + len(PASTE_START):]
            else:
                text = self._paste + data
                end = text.find(PASTE_END, max(0, len(self._paste) - len(PASTE_END) + 1))  # only the new part
                if end < 0:
                    self._paste = text
                    break
                out.append(events.Paste(text[:end].replace("\x00", "")))
                self._paste, data = None, text[end + len(PASTE_END):]
        return out

    def tick(self) -> Iterable[Message]:
        held, self._held = self._held, ""
        return [*(super().feed(held) if held else ()), *super().tick()]

    def _sequence_to_key_events(self, sequence: str, alt: bool = False) -> Iterable[events.Key]:
        """ESC CR, what terminals send for Alt+Enter, is ``alt+enter`` (a new line in the prompt
        box, as README's key table says). Textual reads a modifier only on a one-letter key name,
        so it read Enter, and the prompt went out half typed."""
        if alt and sequence == "\r":
            yield events.Key("alt+enter", None)
            return
        yield from super()._sequence_to_key_events(sequence, alt)


def safe_driver_class(base: type[Driver]) -> type[Driver]:
    """``base`` (Textual's driver for this platform), reading input with :class:`PasteParser`
    and :func:`~app.ui.key_reader.read_keys` where it is Textual's Linux driver; any other
    driver as it is."""
    from textual.drivers import linux_driver

    if base is not linux_driver.LinuxDriver:
        return base

    class PasteSafeLinuxDriver(linux_driver.LinuxDriver):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._file = HungUpSafe(terminal_output(self._file))  # what Textual's output thread writes to
            self.exit_event = WakingEvent()  # wakes the input loop at once (app.ui.key_reader)

        def run_input_thread(self) -> None:
            # Textual's loop, with this parser, and Esc read as Esc after 30 ms (app.ui.key_reader)
            read_keys(self, PasteParser(getattr(self, "_debug", False)))

        def _get_terminal_size(self) -> tuple[int, int]:
            return terminal_size(self._file, super()._get_terminal_size)

    return PasteSafeLinuxDriver


def terminal_output(file: Any) -> Any:
    """``file`` (stderr, where Textual draws), or the controlling terminal where stderr is
    not one: ``specchat 2>/dev/null`` (a common way to hide library warnings) or
    ``2>errors.log`` drew the whole app into the file and left the terminal blank. Errors
    printed after the app closes still go where stderr was sent."""
    try:
        if file.isatty():
            return file
        # open for the app's life: Textual's output thread writes to it until the process ends
        return open("/dev/tty", "w", encoding="utf-8", errors="backslashreplace")
    except (AttributeError, ValueError, OSError):  # no controlling terminal: as before
        return file


def terminal_size(file: Any, fallback: Callable[[], tuple[int, int]]) -> tuple[int, int]:
    """(columns, lines) of the terminal ``file`` writes to, asked of the terminal itself.

    Textual asks :func:`shutil.get_terminal_size`, which believes ``COLUMNS`` and ``LINES``
    in the environment before the terminal, and asks stdout, not the stderr the app draws
    on: a shell that exports them (a snapshot of the size when it started), or stdout sent
    to a file (80x24 then), had the app drawn at that size in a corner, deaf to every
    resize. ``fallback`` (Textual's way) where the file is no terminal."""
    try:
        size = os.get_terminal_size(file.fileno())
    except (AttributeError, ValueError, OSError):
        return fallback()
    return size.columns or 80, size.lines or 25


class HungUpSafe:
    """The terminal's output file, whose writes are dropped once the terminal has gone.

    A terminal closed under the app (tmux killed, an SSH link dropped) fails every write
    with EIO. Textual's output thread died on the first, its queue filled, and the app's
    next write, or its exit, waited on that queue for ever: the app stayed behind with
    its engine loaded (:data:`app.ui.quitting.EXIT_ANYWAY_S` is the last resort)."""

    def __init__(self, file: Any) -> None:
        self._file = file
        self.gone = False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                return self._file.write(text)
            except OSError:
                self.gone = True
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self._file.flush()
            except OSError:
                self.gone = True

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding, ...
        return getattr(self._file, name)


SUB_TITLE_SHOWN = 160
"""The most characters of the header's second part (a chat's title, or a profile and its models)."""


class SafeTerminal:
    """Mixed into the App: its titles made inert, pastes whole and inert, the paste-safe driver,
    the terminal's own size."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # COLUMNS and LINES exported by a shell are a snapshot that Rich's console (the App's
        # first size, read as the App is made) and shutil believe before the terminal: the app
        # was laid out at that size, then resized (:func:`terminal_size` covers the driver).
        for name in ("COLUMNS", "LINES"):
            os.environ.pop(name, None)
        super().__init__(*args, **kwargs)

    def validate_title(self, title: str) -> str:
        return inert(str(title))

    def validate_sub_title(self, sub_title: str) -> str:
        """One line, cut (a chat's title is its usual sub-title: app.ui.labels.shown_title), made inert."""
        from app.ui.labels import shown_title

        return inert(shown_title(str(sub_title), SUB_TITLE_SHOWN))

    def get_driver_class(self) -> type[Driver]:
        return safe_driver_class(super().get_driver_class())  # type: ignore[misc]

    async def on_event(self, event: events.Event) -> None:
        if isinstance(event, events.Paste) and not event.is_forwarded:
            event.text = pasted_text(event.text)
        await super().on_event(event)  # type: ignore[misc]

