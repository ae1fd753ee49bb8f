"""The dialogs that change the open chat: its last prompt, its system prompt, its sampling.

Each function answers the dialog and what to do with its answer, for the App to open
(``app.push_screen(*ask_…(…))``), as :func:`app.ui.export.ask_export` does.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from app.ui.notices import notice
from app.ui.sampling import ChatSampling
from app.ui.screens.edit import EditScreen
from app.ui.screens.sampling import SamplingScreen

if TYPE_CHECKING:
    from app.ui.widgets.chat_view import AssistantMessage, UserMessage
    from app.ui.widgets.conversation import Conversation


def ask_edited_prompt(conversation: "Conversation", user: "UserMessage", reply: "AssistantMessage | None",
                      ) -> tuple[EditScreen, Callable[[str | None], None]]:
    """Edit the last prompt and ask it again; the earlier exchange stays (dimmed). While the dialog
    is open its text counts as unsent (:meth:`Conversation.unsent_text`): quitting keeps it."""
    screen = EditScreen("Edit the last prompt", user.text, multiline=True, save_label="Ask again", unsent=True,
                        hint="ctrl+s asks it again (the earlier answer stays, dimmed) · Esc cancels")
    conversation.editing_prompt = screen

    def done(text: str | None) -> None:
        conversation.editing_prompt = None
        if text is not None and text.strip():
            conversation.ask_edited(user, reply, text)

    return screen, done


def ask_system_prompt(conversation: "Conversation") -> tuple[EditScreen, Callable[[str | None], None]]:
    """The chat's system prompt."""
    def done(value: str | None) -> None:
        if value is not None:
            conversation.set_system_prompt(value)

    return EditScreen(
        "System prompt for this chat", conversation.system_prompt or "", multiline=True,
        hint="ctrl+s saves · Esc cancels · leave the profile's text to follow the profile, clear it for none",
    ), done


def ask_sampling(conversation: "Conversation") -> tuple[SamplingScreen, Callable[[ChatSampling | None], None]]:
    """The chat's temperature, top-p, top-k and seed; saved with the chat, used from the next reply."""
    profile = conversation.host.profile

    def done(sampling: ChatSampling | None) -> None:
        if sampling is not None:
            conversation.set_sampling(sampling)
            label = sampling.label(conversation.host.profile)
            notice(conversation, f"Sampling for this chat: {label or 'greedy, as the profile says'}.",
                   title="Sampling")

    return SamplingScreen(conversation.sampling, profile), done
