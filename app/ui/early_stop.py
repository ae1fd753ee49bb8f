"""Esc reaches the engine from the terminal's input thread, not after the UI's queue.

Textual reads keys on a thread of its own and queues them for the UI's event
loop. While a reply streams, the loop may be in the middle of a paint (a layout
of the whole screen): Esc waited behind it, and behind every paint queued
before it when the UI runs at a lower priority than the engine (SPECCHAT_UI_NICE),
where a paint can take ten times its CPU time. Here the driver that reads the
keys also sets the reply's cancel flag the moment Esc arrives (when the key would
stop the reply: a reply streams and no dialog is open). The key then goes on
through the queue as before, where the Stop action finds the flag already set.

The same driver undoes one guess of the terminal's key parser. Alt+letter and
Esc-then-letter are the same bytes (``ESC t``) on most terminals; Textual reads
an Esc followed within ``ESCDELAY`` (100 ms) by a letter as Alt+letter. So Esc
typed quickly before a word, or arriving in one read with it (a loaded machine,
SSH, a script), was lost: the dialog stayed open and the word went into it, or
the reply went on. The app binds no Alt+character, so such a key is passed on as
what the user most likely typed: Esc, then the character.
"""
from __future__ import annotations

from collections.abc import Callable

from textual import events
from textual.driver import Driver
from textual.message import Message


def split_esc_prefix(key: events.Key) -> list[events.Key]:
    """``[key]``, or ``[Esc, the character]`` for an Alt+printable character (see above)."""
    character = key.character
    if not key.key.startswith("alt+") or character is None or len(character) != 1 or not character.isprintable():
        return [key]
    name = key.key.removeprefix("alt+")
    if name.startswith("shift+") and character.isupper():
        name = character  # Textual names a plain "T" by its character, alt+T "alt+shift+t"
    return [events.Key("escape", "\x1b"), events.Key(name, character)]


def early_stop_driver(base: type[Driver], on_escape: Callable[[], None]) -> type[Driver]:
    """``base`` (the platform's driver) that calls ``on_escape`` on its input thread for each Esc,
    and reads Alt+character as Esc then the character."""

    class EarlyStopDriver(base):  # type: ignore[valid-type,misc]
        def process_message(self, message: Message) -> None:
            if not isinstance(message, events.Key):
                super().process_message(message)
                return
            for key in split_esc_prefix(message):
                if key.key == "escape":
                    try:
                        on_escape()
                    except Exception:  # the key still goes through the queue; never break input
                        pass
                super().process_message(key)

    EarlyStopDriver.__name__ = EarlyStopDriver.__qualname__ = f"EarlyStop{base.__name__}"
    return EarlyStopDriver
