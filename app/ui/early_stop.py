"""Esc reaches the engine from the terminal's input thread, not after the UI's queue.

Textual reads keys on a thread of its own and queues them for the UI's event
loop. While a reply streams, the loop may be in the middle of a paint (a layout
of the whole screen): Esc waited behind it, and behind every paint queued
before it when the UI runs at a lower priority than the engine (SPECCHAT_UI_NICE),
where a paint can take ten times its CPU time. Here the driver that reads the
keys also sets the reply's cancel flag the moment Esc arrives (when the key would
stop the reply: a reply streams and no dialog is open). The key then goes on
through the queue as before, where the Stop action finds the flag already set.
"""
from __future__ import annotations

from collections.abc import Callable

from textual import events
from textual.driver import Driver
from textual.message import Message


def early_stop_driver(base: type[Driver], on_escape: Callable[[], None]) -> type[Driver]:
    """``base`` (the platform's driver) that calls ``on_escape`` on its input thread for each Esc."""

    class EarlyStopDriver(base):  # type: ignore[valid-type,misc]
        def process_message(self, message: Message) -> None:
            if isinstance(message, events.Key) and message.key == "escape":
                try:
                    on_escape()
                except Exception:  # the key still goes through the queue; never break input
                    pass
            super().process_message(message)

    EarlyStopDriver.__name__ = EarlyStopDriver.__qualname__ = f"EarlyStop{base.__name__}"
    return EarlyStopDriver
