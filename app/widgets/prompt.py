"""The prompt box: a TextArea where Enter sends and ctrl+j inserts a newline.

ctrl+j is a plain line feed byte, so it works in every terminal (and inside
tmux/screen); shift+enter and alt+enter are bound too for terminals that report
them distinctly (kitty keyboard protocol, most terminals for alt+enter).
"""
from __future__ import annotations

from textual.binding import Binding
from textual.message import Message
from textual.widgets import TextArea


class PromptArea(TextArea):
    """Multi-line prompt input that grows with its text."""

    BINDINGS = [
        Binding("enter", "submit", "Send", show=False, priority=True),
        Binding("ctrl+j,shift+enter,alt+enter", "newline", "Newline", key_display="ctrl+j", priority=True),
    ]

    class Submitted(Message):
        """The user pressed Enter with ``text`` in the box."""

        def __init__(self, prompt: "PromptArea", text: str) -> None:
            super().__init__()
            self.prompt = prompt
            self.text = text

        @property
        def control(self) -> "PromptArea":
            return self.prompt

    def __init__(self, *, id: str | None = None, placeholder: str = "") -> None:
        super().__init__(
            id=id,
            soft_wrap=True,
            show_line_numbers=False,
            tab_behavior="focus",
            compact=True,
            highlight_cursor_line=False,
            placeholder=placeholder,
        )

    def action_submit(self) -> None:
        """Send the text (if any) to whoever listens; the app clears the box."""
        text = self.text
        if text.strip():
            self.post_message(self.Submitted(self, text))

    def action_newline(self) -> None:
        """Insert a line break at the cursor."""
        self.insert("\n")
