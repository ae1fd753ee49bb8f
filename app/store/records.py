"""What the history hands out and how it fails: the chat and message records (and how
they are read from their rows), and :class:`HistoryError` (with :class:`ChatDeleted`, a
write refused for good).

Kept apart from :mod:`app.store.history` (which re-exports them) so that module stays
about the database itself.
"""
from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.errors import SpecChatError

from app.store.pieces import Pieces
from app.store.schema import is_lock_error


class HistoryError(SpecChatError):
    """Reading or writing the history database failed."""

    def __init__(self, message: str, *, locked: bool = False) -> None:
        super().__init__(message)
        self.locked = locked
        """True when another program's lock was the cause: trying again later may work."""


class ChatDeleted(HistoryError):
    """The chat was deleted (in this window or another): a write to it is refused for good.

    Ids are never reused (``AUTOINCREMENT``), so nothing else can take its place; trying
    again cannot work, and the saver moves what was unsaved to a new chat instead."""

    def __init__(self, chat_id: int) -> None:
        super().__init__(f"Saving chat history failed: chat {chat_id} was deleted (in another window?)")
        self.chat_id = chat_id


def is_missing_parent(exc: sqlite3.Error) -> bool:
    """A FOREIGN KEY failure: the row's chat is gone (a constraint, not a lock: never retried)."""
    return isinstance(exc, sqlite3.IntegrityError) and "foreign key" in str(exc).lower()


def describe(what: str, exc: sqlite3.Error) -> str:
    if is_lock_error(exc):
        return f"{what}: the history database is locked by another program ({exc}); will retry"
    return f"{what}: {exc}"


@dataclass(frozen=True)
class ChatRecord:
    """One saved conversation."""

    id: int
    title: str
    profile: str | None
    system_prompt: str | None
    created: float
    updated: float
    message_count: int = 0
    sampling: dict[str, Any] | None = None
    """The chat's own sampling (app.ui.sampling.ChatSampling.to_dict); None follows the profile."""


@dataclass(frozen=True)
class MessageRecord:
    """One saved message of a conversation."""

    id: int
    chat_id: int
    role: str
    content: str
    profile: str | None
    stats: dict[str, Any] | None
    pieces: Pieces | None
    finish_reason: str | None
    created: float
    superseded: bool = False
    """Replaced by an edited prompt: shown dimmed, left out of what the model reads."""


def answered_again(records: Sequence[MessageRecord], i: int) -> bool:
    """Whether ``records[i]`` is an earlier version: marked superseded (an edited prompt's exchange),
    or a reply whose prompt was answered again (ctrl+r: the next record is a reply too). The screen
    and the export both read a saved chat so."""
    rec = records[i]
    return rec.superseded or (rec.role == "assistant" and i + 1 < len(records) and records[i + 1].role == "assistant")


CHAT_COLUMNS = ("c.id, c.title, c.profile, c.system_prompt, c.created, c.updated,"
                " (SELECT count(*) FROM messages m WHERE m.chat_id = c.id), c.sampling")
"""A :class:`ChatRecord`'s fields, in order, from ``chats c`` (read by :func:`chat_from_row`)."""


def chat_from_row(row: Sequence[Any]) -> ChatRecord:
    sampling = from_json(row[7])
    return ChatRecord(*row[:7], sampling=sampling if isinstance(sampling, dict) else None)


def message_from_row(row: Sequence[Any]) -> MessageRecord:
    """A message from ``id, chat_id, role, content, profile, stats, pieces, finish_reason,
    created, superseded``; JSON that cannot be read is left out (None)."""
    mid, cid, role, content, profile, stats, pieces, finish, created, superseded = row
    loaded = from_json(pieces)
    return MessageRecord(mid, cid, role, content, profile, from_json(stats),
                         [(str(t), str(s)) for t, s in loaded] if loaded else None, finish, created, bool(superseded))


def to_json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False)


def from_json(text: str | None) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None
