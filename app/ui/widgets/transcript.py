"""Reading and rebuilding a transcript: saved records to message widgets, and back to text.

Pure functions over the chat log's children, so the Conversation widget stays about
flow and these rules are tested on their own.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from textual.widget import Widget

from app.store.records import answered_again
from app.ui.widgets.chat_view import UNFINISHED, AssistantMessage, UserMessage

if TYPE_CHECKING:
    from app.store.history import MessageRecord

Message = UserMessage | AssistantMessage


def messages_of(children: Iterable[Widget]) -> list[Message]:
    """The prompts and replies among ``children``, in order."""
    return [w for w in children if isinstance(w, (UserMessage, AssistantMessage))]


def copyable(children: Iterable[Widget]) -> list[tuple[str, str]]:
    """``(role, text)`` of every prompt and reply on screen, for the copy dialog."""
    return [(m.role, m.text) for m in messages_of(children)]


def last_exchange(children: Sequence[Widget]) -> tuple[UserMessage, AssistantMessage | None] | None:
    """The last prompt on screen and the last reply after it (None: no prompt yet)."""
    for i in range(len(children) - 1, -1, -1):
        user = children[i]
        if isinstance(user, UserMessage):
            reply = next((w for w in reversed(children[i + 1:]) if isinstance(w, AssistantMessage)), None)
            return user, reply
    return None


def widgets_for(records: Sequence["MessageRecord"], show_sources: bool) -> list[Message]:
    """The message widgets of a saved chat. An edited prompt's earlier exchange, and a
    reply answered again (the next record is a reply too), come back superseded."""
    widgets: list[Message] = []
    for i, rec in enumerate(records):  # a reply saved with no end (its app was killed) is UNFINISHED
        widget: Message
        if rec.role == "user":
            widget = UserMessage(rec.content, message_id=rec.id)
        elif rec.role == "assistant":
            widget = AssistantMessage(rec.profile, text=rec.content, pieces=rec.pieces,
                                      finish_reason=rec.finish_reason or UNFINISHED, stats=rec.stats,
                                      show_sources=show_sources)
        else:
            continue
        if answered_again(records, i):
            widget.set_superseded()
        widgets.append(widget)
    return widgets
