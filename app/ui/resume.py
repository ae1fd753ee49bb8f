"""Reopening the last chat on start, as a chat app's users expect after a restart.

The chat to reopen is the one used last: the chat open when the app last closed (or
last opened from F3), remembered in the state file (:func:`app.store.state.remember_chat`)
with the time it was left, unless a chat was written after that time (the app was
killed before it could remember a newer chat). A private chat is never saved, so it is
never remembered nor reopened. ctrl+n still starts a new chat.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from app.store.history import ChatRecord, History
from app.store.state import last_chat, remember_chat

if TYPE_CHECKING:
    from app.ui.engine_host import EngineHost
    from engine.config.profiles import ModelProfile


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


def profile_for(chat: ChatRecord | None, engine: "EngineHost", first: "ModelProfile") -> "ModelProfile":
    """The profile to load first: the reopened chat's own, when none was asked for on the
    command line and it is one of the profiles; else ``first`` (what would load anyway)."""
    choice, profiles = engine.choice, engine.profiles
    asked = choice.name or choice.target or choice.server_profile
    if chat is None or not chat.profile or asked or profiles is None or chat.profile not in profiles.names():
        return first
    return profiles.get(chat.profile)


def remember_open_chat(chat_id: int | None, private: bool) -> None:
    """Remember the open chat as used now (nothing for a private or not yet saved chat)."""
    if chat_id is not None and not private:
        remember_chat(chat_id, time.time())
