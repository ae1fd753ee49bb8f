"""The base of the app's dialogs: Esc closes them before the next key is read.

Textual hands each key to the widget focused at the moment the app reads it,
and a dialog's own Esc binding runs later, when the focused widget has passed the
key up. Keys typed right after Esc (a fast typist, or keys that arrive in one
read) were therefore handed to the dialog's input box as it closed, and lost.
A *priority* binding runs in the app's own key handler, so the dialog is off
the screen stack before the next key is dispatched, and that key reaches the
prompt box.
"""
from __future__ import annotations

from typing import ClassVar, TypeVar

from textual.binding import Binding
from textual.screen import ModalScreen

ResultType = TypeVar("ResultType")


class Dialog(ModalScreen[ResultType]):
    """A modal dialog that Esc dismisses with :attr:`CANCELLED` (at once: see the module)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", priority=True)]
    CANCELLED: ClassVar[object] = None
    """What the dialog returns when cancelled."""

    def __init__(self) -> None:
        super().__init__(classes="dialog-screen")

    def action_cancel(self) -> None:
        self.dismiss(self.CANCELLED)  # type: ignore[arg-type]
