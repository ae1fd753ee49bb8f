"""Acting on the last exchange and on the layout: copy, regenerate, edit the last prompt, fold the HUD.

Mixed into :class:`app.ui.app.SpecChatApp`. A regenerated (or re-asked) reply does
not replace the earlier one: that stays on screen, dimmed, and in the history;
only the newest answer goes to the model as context.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from textual import events

from app.ui.screens.copy import CopyChoice, CopyScreen, code_blocks, copy_choices
from app.ui.screens.edit import EditScreen
from app.ui.widgets.chat_view import AssistantMessage, UserMessage
from app.ui.widgets.hud_line import HUD_MIN_WIDTH

if TYPE_CHECKING:
    from app.ui.app import SpecChatApp


class TurnsMixin:
    """Copy, regenerate, edit the last prompt, and the HUD's fold."""

    hud_folded: bool | None = None
    """None: folded to one line below HUD_MIN_WIDTH columns; True/False: the user's choice (F6)."""

    # -- layout ---------------------------------------------------------------------

    def fit_hud(self: "SpecChatApp", width: int | None = None) -> None:
        """Show the side HUD or its one-line form, for ``width`` columns (default: the screen's)."""
        width = self.size.width if width is None else width
        folded = width < HUD_MIN_WIDTH if self.hud_folded is None else self.hud_folded
        self.hud.set_class(folded, "-line")

    def on_resize(self: "SpecChatApp", event: events.Resize) -> None:
        self.fit_hud(event.size.width)

    def action_toggle_hud(self: "SpecChatApp") -> None:
        self.hud_folded = not self.hud.has_class("-line")
        self.fit_hud()

    # -- copy -----------------------------------------------------------------------

    def _messages(self: "SpecChatApp") -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for widget in self.chat_log.children:
            if isinstance(widget, UserMessage):
                out.append(("user", widget.text))
            elif isinstance(widget, AssistantMessage):
                out.append(("assistant", widget.text))
        return out

    def copy_text(self: "SpecChatApp", text: str, what: str) -> None:
        """Put ``text`` on the clipboard (OSC 52) and say what was copied."""
        self.copy_to_clipboard(text)
        lines = text.count("\n") + 1
        self.notice(f"Copied {what}: {len(text):,} characters, {lines} line{'s' if lines != 1 else ''}.",
                    title="Copied")

    def action_copy(self: "SpecChatApp") -> None:
        """Pick a message or code block to copy."""
        choices = copy_choices(self._messages())
        if not choices:
            self.notice("Nothing to copy yet.", severity="warning")
            return

        def picked(choice: CopyChoice | None) -> None:
            if choice is not None:
                self.copy_text(choice.text, choice.label.split(" · ")[0].lower())

        self.push_screen(CopyScreen(choices), picked)

    def action_copy_last_reply(self: "SpecChatApp") -> None:
        replies = [text for role, text in self._messages() if role == "assistant" and text]
        if not replies:
            self.notice("No reply to copy yet.", severity="warning")
            return
        self.copy_text(replies[-1], "the last reply")

    def action_copy_last_code(self: "SpecChatApp") -> None:
        for role, text in reversed(self._messages()):
            blocks = code_blocks(text) if role == "assistant" else []
            if blocks:
                self.copy_text(blocks[-1][1], "the last code block")
                return
        self.notice("No code block in the replies yet.", severity="warning")

    # -- regenerate / edit ------------------------------------------------------------

    def _last_exchange(self: "SpecChatApp") -> tuple[UserMessage, AssistantMessage | None] | None:
        """The last prompt on screen and its reply (None: no prompt, or one still waiting)."""
        if self.generating or self.queued:
            self.notice("Wait for the reply to finish (or press Esc to stop it).", severity="warning")
            return None
        children = list(self.chat_log.children)
        for i in range(len(children) - 1, -1, -1):
            if isinstance(children[i], UserMessage):
                reply = next((w for w in reversed(children[i + 1:]) if isinstance(w, AssistantMessage)), None)
                return children[i], reply  # type: ignore[return-value]
        self.notice("No prompt yet.", severity="warning")
        return None

    def _drop_last_turns(self: "SpecChatApp", prompt: str) -> None:
        """Take the last exchange out of what the model sees (it stays on screen and saved)."""
        if self.turns and self.turns[-1].role == "assistant":
            self.turns.pop()
        if self.turns and self.turns[-1].role == "user" and self.turns[-1].content == prompt:
            self.turns.pop()

    def action_regenerate(self: "SpecChatApp") -> None:
        """Answer the last prompt again; the earlier reply stays (dimmed) and in the history."""
        last = self._last_exchange()
        if last is None:
            return
        if self.backend is None:
            self.notice("No model is loaded yet.", severity="warning")
            return
        user, reply = last
        self._drop_last_turns(user.text)
        if reply is not None:
            reply.set_superseded()
        self.send_prompt(user.text, shown=reply or user, answers=user)

    def action_edit_last_prompt(self: "SpecChatApp") -> None:
        """Edit the last prompt and ask it again; the earlier exchange stays (dimmed)."""
        last = self._last_exchange()
        if last is None:
            return
        user, reply = last

        def done(text: str | None) -> None:
            if text is None or not text.strip():
                return
            if self.generating or self.backend is None:
                self.prompt.restore(text)
                self.notice("The model is busy: your edited prompt is back in the box.", severity="warning")
                return
            self._drop_last_turns(user.text)
            user.set_superseded()
            if reply is not None:
                reply.set_superseded()
            self.send_prompt(text.strip("\n"), supersedes=user)

        self.push_screen(EditScreen("Edit the last prompt", user.text, multiline=True,
                                    hint="ctrl+s asks it again (the earlier answer stays, dimmed) · Esc cancels"),
                         done)
