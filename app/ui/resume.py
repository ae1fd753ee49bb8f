"""Reopening the last chat on start, as a chat app's users expect after a restart.

The chat to reopen is the one used last: the chat open when the app last closed (or
last opened from F3), remembered in the state file (:func:`app.store.state.remember_chat`)
with the time it was left, unless a chat was written after that time (the app was
killed before it could remember a newer chat). A private chat is never saved, so it is
never remembered nor reopened, and a chat another specchat window shows is not taken over
(:mod:`app.store.open_chats`): the app starts on a new chat and says why. ctrl+n still
starts a new chat.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, NamedTuple

from app.store.history import ChatRecord, History
from app.store.state import last_chat, remember_chat
from app.ui.labels import shown_title

if TYPE_CHECKING:
    from app.ui.engine_host import EngineHost
    from app.ui.widgets.conversation import Conversation
    from engine.config.profiles import ModelProfile


class Start(NamedTuple):
    """How the app starts: the profile to load (None: none can be), the reopened chat's
    title for the header (None: a new chat) and a notice to show (or None)."""

    profile: "ModelProfile | None"
    title: str | None
    notice: str | None


async def reopen_last(conversation: "Conversation", first: "ModelProfile | None") -> Start:
    """Show the chat used last in ``conversation`` (see :func:`start_with`); ``first`` is the
    profile that would load anyway."""
    history = conversation.archive.history
    last = conversation.archive.db(chat_to_reopen, history) if history is not None else None
    if last is not None and conversation.archive.open_chats.elsewhere(last.id):
        return Start(first, None, f"A new chat: the chat used last, “{shown_title(last.title)}”, is open in another specchat "
                                  "window (F3 opens it here too).")
    profile, last, said = start_with(last, conversation.host, first)
    if last is not None and await conversation.open_chat(last.id) is None:
        last = None
    return Start(profile, last.title if last is not None else None, said)


def chat_to_reopen(history: History) -> ChatRecord | None:
    """The chat used last (None: there is none); may raise :class:`HistoryError`."""
    chats = history.list_chats()  # most recently written first
    if not chats:
        return None
    remembered = last_chat()
    if remembered is not None:
        chat_id, at = remembered
        chat = next((c for c in chats if c.id == chat_id), None)
        if chat is not None and at >= chats[0].updated:
            return chat
    return chats[0]


def start_with(chat: ChatRecord | None, engine: "EngineHost", first: "ModelProfile | None",
               ) -> "tuple[ModelProfile | None, ChatRecord | None, str | None]":
    """The profile to load first, the chat to reopen and what to tell the user, given the chat
    used last and ``first``, the profile that would load anyway. With no profile asked for on
    the command line the chat continues with its own profile (when it is one of the profiles;
    else with ``first``, which is said). A profile asked for (``--profile``, ``--target``,
    ``--server``) is what the user wants to talk to: the chat is reopened only if it was with it."""
    if chat is None or first is None:
        return first, chat, None
    choice, profiles = engine.choice, engine.profiles
    if choice.name or choice.target or choice.server_profile:
        if chat.profile == first.name:
            return first, chat, None
        return first, None, (f"A new chat with {first.name}: the chat used last, “{shown_title(chat.title)}”, was with "
                             f"{chat.profile or 'another profile'} (F3 opens it).")
    if not chat.profile or chat.profile == first.name:
        return first, chat, None
    if profiles is not None and chat.profile in profiles.names():
        return profiles.get(chat.profile), chat, None
    return first, chat, (f"This chat was with {chat.profile}, which is not available; it continues with "
                         f"{first.name} (F2 switches).")


def remember_open_chat(conversation: "Conversation") -> None:
    """Remember the open chat as used now: nothing for a private chat, one not saved yet,
    or one in a history kept in memory (its id means nothing in the file next time)."""
    history = conversation.archive.history
    if (conversation.chat_id is not None and not conversation.private
            and history is not None and history.path is not None):
        remember_chat(conversation.chat_id, time.time())
