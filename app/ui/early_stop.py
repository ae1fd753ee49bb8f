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
SSH, a script), was lost: the dialog stayed open and the word went into it.
While a dialog is open, such a key is passed on as what the user most likely
typed: Esc, then the character (the dialogs bind no Alt+character). Elsewhere it
stays Alt+character: macOS terminals send Option+Left/Right as Alt+b/f, which
the prompt box reads as a word left/right, and must not stop a streaming reply.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from textual import events
from textual.driver import Driver
from textual.message import Message

T = TypeVar("T")


def split_esc_prefix(key: events.Key) -> list[events.Key]:
    """``[key]``, or ``[Esc, the character]`` for an Alt+printable character (see above)."""
    character = key.character
    if not key.key.startswith("alt+") or character is None or len(character) != 1 or not character.isprintable():
        return [key]
    name = key.key.removeprefix("alt+")
    if name.startswith("shift+") and character.isupper():
        name = character  # Textual names a plain "T" by its character, alt+T "alt+shift+t"
    return [events.Key("escape", "\x1b"), events.Key(name, character)]


def _quietly(hook: Callable[[], T]) -> T | None:
    """``hook()``, or None if it raised: a failing hook must never break the keyboard."""
    try:
        return hook()
    except Exception:
        return None


def _no_input() -> None:
    return None


def early_stop_driver(base: type[Driver], on_escape: Callable[[], None],
                      esc_prefix: Callable[[], bool] = lambda: False,
                      on_input: Callable[[], None] = _no_input) -> type[Driver]:
    """``base`` (the platform's driver) that calls ``on_escape`` on its input thread for each Esc,
    ``on_input`` for every other key, click or scroll (the engine then leaves the UI a core for a
    moment, to show it: :meth:`app.ui.engine_host.EngineHost.yield_to_ui`), and reads Alt+character
    as Esc then the character while ``esc_prefix()`` says so."""

    class EarlyStopDriver(base):  # type: ignore[valid-type,misc]
        def process_message(self, message: Message) -> None:
            keys: list[Message] = [message]
            if isinstance(message, events.Key) and message.key.startswith("alt+") and _quietly(esc_prefix):
                keys = list(split_esc_prefix(message))
            for key in keys:
                if isinstance(key, events.Key) and key.key == "escape":
                    _quietly(on_escape)  # the key still goes through the queue
                elif isinstance(key, (events.Key, events.MouseDown, events.MouseScrollUp, events.MouseScrollDown)):
                    _quietly(on_input)
                super().process_message(key)

    EarlyStopDriver.__name__ = EarlyStopDriver.__qualname__ = f"EarlyStop{base.__name__}"
    return EarlyStopDriver
