"""Asked at quit when the chat on screen is not in the history: export it, discard it, or stay."""
from __future__ import annotations

from typing import Literal

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Static

from app.ui.screens.dialog import Dialog

QuitAnswer = Literal["export", "discard"]
"""``export``: write the chat to a Markdown file, then quit; ``discard``: quit anyway.
Cancelled (Esc, c): None, the app goes on."""


class QuitScreen(Dialog["QuitAnswer | None"]):
    """Quit with unsaved text: e exports it as Markdown and quits, d quits without it,
    Esc or c stays (the default: Enter on the focused Cancel button)."""

    BINDINGS = [
        Binding("e", "reply('export')", "Export and quit", priority=True),
        Binding("d", "reply('discard')", "Discard and quit", priority=True),
        Binding("c", "cancel", "Cancel", priority=True),
    ]

    def __init__(self, why: str) -> None:
        super().__init__()
        self._why = why

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog confirm-dialog quit-dialog"):
            yield Static(self._why, classes="dialog-title", markup=False)  # Static wraps; a Label would not
            yield Static("e exports it to a Markdown file and quits · d quits without it · Esc stays",
                         classes="dialog-hint", markup=False)
            with Horizontal(classes="dialog-buttons"):
                yield Button("Export and quit", variant="primary", id="export")
                yield Button("Discard", variant="error", id="discard")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()

    def pressed(self, button_id: str | None) -> None:
        self.dismiss(button_id if button_id in ("export", "discard") else None)  # type: ignore[arg-type]

    def action_reply(self, answer: QuitAnswer) -> None:
        self.dismiss(answer)
