"""The sampling dialog: a chat's temperature, top-p, top-k and seed (F10, or "Sampling…" in ctrl+p)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Input, Label

from app.ui.key_order import OrderedInput
from app.ui.sampling import ChatSampling, exact, parse_sampling
from app.ui.screens.dialog import Dialog
from engine.text_safety import inert

if TYPE_CHECKING:
    from engine.events import ReplySettings

FIELDS = (
    ("temperature", "Temperature", "0: greedy, the same every time"),
    ("top_p", "Top-p", "likeliest tokens' share, (0, 1]"),
    ("top_k", "Top-k", "likeliest tokens kept; 0: all"),
    ("seed", "Seed", "blank: replies differ each time"),
)
"""``(field, label, what it does)`` in the dialog's order."""

HINT = "Enter or ctrl+s saves · Tab next field · a blank field follows the profile · Esc cancels"


class SamplingScreen(Dialog["ChatSampling | None"]):
    """Edit ``current`` for this chat; ``profile`` gives the values a blank field follows.
    Dismisses with the new :class:`ChatSampling`, or None when cancelled. A bad value is
    named under the fields and the dialog stays open with everything typed."""

    BINDINGS = [("ctrl+s", "save", "Save")]

    def __init__(self, current: ChatSampling, profile: "ReplySettings | None") -> None:
        super().__init__()
        self._current = current
        self._profile = profile

    def compose(self) -> ComposeResult:
        profile = self._profile
        defaults = {"temperature": exact(profile.temperature), "top_p": exact(profile.top_p),
                    "top_k": str(profile.top_k)} if profile is not None else {}
        with Vertical(classes="dialog sampling-dialog"):
            yield Label("Sampling for this chat", classes="dialog-title")
            yield Label(HINT, classes="dialog-hint")
            # the error under the hint, beside the fields it names: below them it was cut off on
            # a short terminal (100x16: Enter on "nan" seemed to do nothing)
            yield Label("", id="sampling-error", markup=False)
            for name, label, help_text in FIELDS:
                value = getattr(self._current, name)
                placeholder = f"profile: {defaults[name]}" if name in defaults else "none"
                with Horizontal(classes="sampling-row"):
                    yield Label(label, classes="sampling-label")
                    yield OrderedInput("" if value is None else exact(value) if isinstance(value, float) else str(value),
                                placeholder=placeholder, id=f"sampling-{name}", compact=True)
                    yield Label(help_text, classes="sampling-help")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Save", variant="primary", id="save")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#sampling-temperature", Input).focus()

    def _save(self) -> None:
        values = {name: self.query_one(f"#sampling-{name}", Input).value for name, _, _ in FIELDS}
        parsed = parse_sampling(**values)
        if isinstance(parsed, ChatSampling):
            self.dismiss(parsed)
            return
        error = self.query_one("#sampling-error", Label)
        error.update(inert(parsed.message))
        error.add_class("-shown")
        self.query_one(f"#sampling-{parsed.field}", Input).focus()  # what was typed stays

    def entered(self, value: str) -> None:
        self._save()

    def pressed(self, button_id: str | None) -> None:
        if button_id == "save":
            self._save()
        else:
            self.dismiss(None)

    def action_save(self) -> None:
        self._save()
