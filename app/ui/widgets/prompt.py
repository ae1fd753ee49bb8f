"""The prompt box: a TextArea where Enter sends and ctrl+j inserts a newline.

ctrl+j is a plain line feed byte, so it works in every terminal (and inside
tmux/screen); shift+enter and alt+enter are handled too for terminals that
report them distinctly (kitty keyboard protocol, most terminals for alt+enter).

Every key the box acts on is handled in the box's own key handler, in the
order the keys arrived. An app-level (priority) binding would run as soon as
the key reaches the app, before the box has inserted the characters queued
ahead of it: "text" + Enter sent in one burst then went out cut off, or empty.
The box takes its text out at the moment it sees Enter and posts it in
:class:`PromptArea.Submitted`; whoever listens decides what to do with it.

In an empty box, Up and Down walk through earlier prompts (like a shell);
PageUp and PageDown scroll the transcript (``scroll_target``).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

from textual import events
from textual.binding import Binding
from textual.content import Content
from textual.geometry import Size
from textual.message import Message
from textual.widget import Widget
from textual.widgets import TextArea

from app.ui.key_order import run_own_binding
from engine.text_safety import inert

NEWLINE_KEYS = ("ctrl+j", "shift+enter", "alt+enter")

PLACEHOLDER = "Ask something · Enter sends · ctrl+j newline · F1 help"
LOADING_PLACEHOLDER = "Loading {name}… you can type: Enter queues it, sent when the model is ready · Esc stops loading"
NO_MODEL_PLACEHOLDER = "No model is loaded: F2 picks a profile"
"""What the empty box says: ready, while a profile loads, when no model could be loaded."""


class PromptArea(TextArea):
    """Multi-line prompt input that grows with its text."""

    BINDINGS = [
        # Listed for the help page; the keys themselves are handled in _on_key, in arrival order.
        Binding("enter", "submit", "Send", show=False),
        Binding("ctrl+j,shift+enter,alt+enter", "newline", "Newline", key_display="ctrl+j", show=False),
        Binding("pageup,pagedown", "scroll_chat", "Scroll the chat", show=False),
        # readline's word moves; macOS terminals send Option+Left/Right as these
        Binding("alt+b", "cursor_word_left", "Word left", show=False),
        Binding("alt+f", "cursor_word_right", "Word right", show=False),
    ]
    HELP_ONLY = [Binding("up,down", "recall", "Earlier prompts (in an empty box)")]
    """Keys the box handles only sometimes: listed in help, never bound (a binding would always fire)."""

    class Submitted(Message):
        """The user pressed Enter with ``text`` in the box (the box is already empty)."""

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
            tab_behavior="indent",  # "focus" sent Tab to the chat log, where what was typed next (Enter too) was lost
            compact=True,
            highlight_cursor_line=False,
            placeholder=placeholder,
        )
        self.prompts: list[str] = []
        """Earlier prompts, oldest first (Up recalls the newest first)."""
        self._recall: int | None = None
        """Index into ``prompts`` of the prompt now shown, while browsing."""
        self.scroll_target: Callable[[], Widget | None] = lambda: None
        """The widget PageUp/PageDown scroll (the transcript)."""

    def validate_placeholder(self, placeholder: str | Content) -> Content:
        """The placeholder as plain, inert text: Textual reads a str as markup, and one that names a
        profile called ``pk[/x]`` (a user's models.toml) ended the app at start; a profile's name
        holding an escape (OSC 0, OSC 52) set the terminal's title and clipboard while it loaded."""
        return Content(inert(placeholder.plain if isinstance(placeholder, Content) else placeholder))

    # -- height ----------------------------------------------------------------------

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        """The text's height, or the whole placeholder's while the box is empty: at 80 columns the
        loading placeholder wraps to two lines, and a one-line box cut it off before "ready"."""
        height = super().get_content_height(container, viewport, width)
        if not self.text and self.placeholder and width > 0:  # a terminal shrunk to a few cells leaves none
            height = max(height, len(Content.from_text(self.placeholder).wrap(width)))
        return height

    def watch_placeholder(self) -> None:
        """A new placeholder may need another height (loading, then ready)."""
        self.refresh(layout=True)

    # -- keys ----------------------------------------------------------------------

    async def _on_key(self, event: events.Key) -> None:
        """Enter, newline, history and page keys, and the box's own editing keys (Home, ctrl+w,
        arrows…), in the order they arrived (:mod:`app.ui.key_order`)."""
        key = event.key
        if key == "escape":  # the app's Esc (stop a reply or a load): TextArea's indent mode took it to move the focus
            event.prevent_default()  # not TextArea's handler; the key still goes up to the app's binding
            return
        handled = True
        if key == "enter":
            self.action_submit()
        elif key in NEWLINE_KEYS:
            self.action_newline()
        elif key in ("up", "down") and self._browsing():
            self.action_recall(-1 if key == "up" else 1)
        elif key in ("pageup", "pagedown"):
            self.action_scroll_chat(-1 if key == "pageup" else 1)
        else:
            handled = False
        if handled:
            event.stop()
            event.prevent_default()
            return
        if self._recall is not None and (event.is_printable or key in ("backspace", "delete")):
            self._recall = None  # editing a recalled prompt makes it a new one
        if await run_own_binding(self, event):  # the box's editing keys: now (app.ui.key_order)
            return
        await super()._on_key(event)

    def _browsing(self) -> bool:
        """Up/Down recall prompts when the box is empty or shows an unedited recalled prompt."""
        if not self.prompts:
            return False
        if not self.text:
            return True
        return self._recall is not None and self.text == self.prompts[self._recall]

    def action_submit(self) -> None:
        """Take the text out of the box and post it (whitespace-only text stays)."""
        text = self.text
        if not text.strip():
            return
        self.clear()
        self._recall = None
        self.post_message(self.Submitted(self, text))

    def action_newline(self) -> None:
        """Insert a line break at the cursor."""
        self.insert("\n")

    def action_recall(self, step: int = -1) -> None:
        """Show the previous (``step=-1``) or next earlier prompt; past the newest, an empty box."""
        if not self.prompts:
            return
        if self._recall is None:
            index = len(self.prompts) - 1 if step < 0 else None
        else:
            index = self._recall + step
            if index < 0:
                index = 0
            elif index >= len(self.prompts):
                index = None
        self._recall = index
        self.load_text(self.prompts[index] if index is not None else "")
        self.move_cursor(self.document.end)

    def action_scroll_chat(self, pages: int = 1) -> None:
        """Scroll the transcript by whole pages without leaving the box, at once: Textual's
        page scroll waits for the next refresh, so two pages in one read scrolled one (and
        PageDown presses then stopped short of a streaming reply's end)."""
        target = self.scroll_target()
        if target is None:
            return
        page = target.scrollable_content_region.height
        target.scroll_to(y=target.scroll_y + pages * page, animate=False, immediate=True)

    # -- prompt history --------------------------------------------------------------

    def remember(self, text: str) -> None:
        """Add a sent prompt to the history (a repeat of the newest is kept once)."""
        if text.strip() and (not self.prompts or self.prompts[-1] != text):
            self.prompts.append(text)
        self._recall = None

    def set_history(self, prompts: Iterable[str]) -> None:
        """Replace the history (a reopened chat brings its own prompts)."""
        self.prompts = []
        for text in prompts:
            self.remember(text)

    def load_text(self, text: str) -> None:
        """Show ``text`` (a recalled prompt from the history, refused text put back) with its
        control characters made visible: the box draws its text as it is."""
        super().load_text(inert(text))

    def restore(self, text: str) -> None:
        """Put refused text back, ahead of anything typed since."""
        current = self.text
        self.load_text(text if not current else f"{text}\n{current}")
        self.move_cursor(self.document.end)
