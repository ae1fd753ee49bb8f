"""Small dialogs that ask for a piece of text (rename, system prompt, export path)."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Input, Label, TextArea

from app.ui.key_order import OrderedInput, OrderedTextArea
from app.ui.screens.dialog import Dialog
from engine.text_safety import inert


class EditScreen(Dialog["str | None"]):
    """Ask for text; dismisses with the text, or None when cancelled. The title and the text
    to edit (a saved title, a system prompt, a message) are shown inert: visible, never obeyed.

    ``unsent``: the text is a prompt to send (ctrl+g's edit), which quitting keeps as unsent text
    for the next start, as the prompt box's; any other edit changed here makes ctrl+q ask first
    (:func:`app.ui.quitting.ask_before_quit`). Both lost the edit without a word (a hostile tester's)."""

    BINDINGS = [Binding("ctrl+s", "save", "Save", priority=True)]

    def __init__(self, title: str, value: str = "", *, multiline: bool = False, hint: str = "",
                 save_label: str = "Save", unsent: bool = False) -> None:
        super().__init__()
        self._title = inert(title)
        self._value = inert(value)
        self._multiline = multiline
        self._hint = hint
        self._save_label = save_label
        self.unsent = unsent
        self.text = self._value
        """The text as it stands (kept as it changes: readable after the dialog is gone)."""

    @property
    def title_text(self) -> str:
        """The dialog's title, as shown."""
        return self._title

    @property
    def changed(self) -> bool:
        """Whether the text was edited here."""
        return self.text != self._value

    def on_text_area_changed(self, event: TextArea.Changed) -> None:
        self.text = event.text_area.text

    def on_input_changed(self, event: Input.Changed) -> None:
        self.text = event.value

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog edit-dialog"):
            yield Label(self._title, classes="dialog-title", markup=False)  # a chat's title: "[/INST]" is text
            if self._hint:
                yield Label(self._hint, classes="dialog-hint", markup=False)
            if self._multiline:
                yield OrderedTextArea(self._value, id="edit-value", soft_wrap=True)
            else:
                yield OrderedInput(self._value, id="edit-value")
            with Horizontal(classes="dialog-buttons"):
                yield Button(self._save_label, variant="primary", id="save")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        """A text box's cursor at the end of its text, where one adds to it (it sat at the start:
        " Keep it short." typed after ctrl+g went in front of the prompt). A one-line box keeps its
        text selected, so that a new name typed replaces the old."""
        widget = self.query_one("#edit-value")
        if isinstance(widget, TextArea):
            widget.move_cursor(widget.document.end)

    def _value_now(self) -> str:
        widget = self.query_one("#edit-value")
        return widget.text if isinstance(widget, TextArea) else widget.value  # type: ignore[attr-defined]

    def entered(self, value: str) -> None:
        self.dismiss(value)

    def pressed(self, button_id: str | None) -> None:
        self.dismiss(self._value_now() if button_id == "save" else None)

    def action_save(self) -> None:
        self.dismiss(self._value_now())


class ConfirmScreen(Dialog[bool]):
    """A yes/no question: y confirms, Escape or n declines, and Enter presses the focused
    button: No, unless ``enter_confirms`` (then the hint under the question says so)."""

    BINDINGS = [
        Binding("y", "reply(True)", "Yes", priority=True),  # priority: see app.ui.screens.dialog
        Binding("n", "reply(False)", "No", priority=True),
    ]

    CANCELLED = False

    def __init__(self, question: str, *, enter_confirms: bool = False, hint: str = "",
                 asks_to_quit: bool = False) -> None:
        super().__init__()
        self.asks_to_quit = asks_to_quit
        """The question is whether to quit (a second ctrl+q waits for its answer)."""
        self._question = inert(question)
        self._enter_confirms = enter_confirms
        self._hint = hint

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog confirm-dialog"):
            yield Label(self._question, classes="dialog-title", markup=False)  # "Delete “[/INST] …”" ended the app
            if self._hint:
                yield Label(self._hint, classes="dialog-hint", markup=False)
            with Horizontal(classes="dialog-buttons"):
                yield Button("Yes", variant="error", id="yes")
                yield Button("No", id="no")

    def on_mount(self) -> None:
        self.query_one("#yes" if self._enter_confirms else "#no", Button).focus()

    def pressed(self, button_id: str | None) -> None:
        self.dismiss(button_id == "yes")

    def action_reply(self, yes: bool) -> None:
        self.dismiss(yes)
