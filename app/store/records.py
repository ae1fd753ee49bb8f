"""What the history hands out and how it fails: the chat and message records (and how
they are read from their rows), and :class:`HistoryError` (with :class:`ChatDeleted`, a
write refused for good).

Kept apart from :mod:`app.store.history` (which re-exports them) so that module stays
about the database itself.
"""
from __future__ import annotations

import json
import math
import sqlite3
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
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


FULL_BELOW_BYTES = 1 << 20
"""Free space under which a failed write is put down to a full disk (SQLite often says only
"disk I/O error" when a write finds no room)."""


def describe(what: str, exc: sqlite3.Error, path: Path | None = None) -> str:
    """One line for a failed read or write of the history file at ``path``, saying what to fix."""
    if is_lock_error(exc):
        return f"{what}: the history database is locked by another program ({exc})"
    if path is not None and isinstance(exc, sqlite3.OperationalError):
        try:
            free = shutil.disk_usage(path.parent).free
        except OSError:
            free = None
        if "full" in str(exc).lower() or (free is not None and free < FULL_BELOW_BYTES):
            left = f" ({free:,} bytes free)" if free is not None else ""
            return f"{what}: the disk holding {path.parent} is full{left}; free some space ({exc})"
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


# Rows are read leniently: the file is the user's, and another program (a DB browser, a script,
# an older or newer specchat) may have written a value of another type into any column. One odd
# value must not end the app at every start or hide the other chats; it is read as the nearest
# thing that can be shown (bytes as UTF-8 with stand-ins, a time out of range as 0, JSON of the
# wrong shape as none).

LATEST_TIME = 253402300799.0
"""The last second of year 9999: a later time (or a negative one) is read as 0, since the
clock's formatting raises on times the platform cannot hold."""


def decoded(raw: bytes) -> str:
    """Bytes as text, what is not UTF-8 as U+FFFD: the history's text factory (one title that was
    not UTF-8 made every listing of chats fail) and a blob's reading."""
    return raw.decode("utf-8", "replace")


def _text(value: Any, default: str = "") -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return decoded(value)
    return default if value is None else str(value)


def _optional_text(value: Any) -> str | None:
    return None if value is None else _text(value)


def _time(value: Any) -> float:
    try:
        when = float(value)
    except (TypeError, ValueError, OverflowError):
        return 0.0
    return when if 0.0 <= when <= LATEST_TIME else 0.0


def _whole(value: Any) -> int:
    return value if _whole_number(value) else 0


def _json_dict(value: Any) -> dict[str, Any] | None:
    loaded = from_json(value)
    return loaded if isinstance(loaded, dict) else None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _whole_number(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_STAT_CHECKS: dict[str, Callable[[Any], bool]] = {
    **{name: _whole_number for name in ("k", "rounds", "target_passes", "proposed", "accepted", "tokens",
                                        "plain_rounds", "truncated_turns")},
    **{name: (lambda v: v is None or _number(v)) for name in (
        "alpha", "alpha_per_token", "tau", "draft_s", "verify_s", "other_s", "prefill_s", "elapsed_s", "tokens_per_s",
        "itl_ms", "plain_tokens_per_s", "speedup", "speedup_se", "plain_measured_tokens_per_s")},
    **{name: (lambda v: v is None or isinstance(v, str)) for name in (
        "mode", "drafter", "speedup_note", "speculation_off_reason", "speculation_off_detail")},
    "adaptive": lambda v: isinstance(v, bool),
    "per_position": lambda v: isinstance(v, list) and all(_number(f) for f in v),
    "mode_tokens": lambda v: isinstance(v, dict) and all(_whole_number(n) for n in v.values()),
    "by_origin": lambda v: isinstance(v, list) and all(isinstance(o, dict) for o in v),
}
"""What each of :class:`~engine.events.ReplyStats`' fields may hold in its saved (dict) form."""


def _stats(value: Any) -> dict[str, Any] | None:
    """A reply's saved statistics with every value of the wrong type left out (a figure that is
    text, a note that is a number): the views format them and must not meet a list where a
    rate should be. Keys this version does not know are kept as they are."""
    stats = _json_dict(value)
    if stats is None:
        return None
    return {key: item for key, item in stats.items() if key not in _STAT_CHECKS or _STAT_CHECKS[key](item)}


def _pieces(value: Any) -> Pieces | None:
    loaded = from_json(value)
    if not isinstance(loaded, list) or not all(isinstance(p, list) and len(p) == 2 for p in loaded):
        return None
    return [(_text(t), _text(s)) for t, s in loaded] or None


def chat_from_row(row: Sequence[Any]) -> ChatRecord:
    """A chat from :data:`CHAT_COLUMNS`' row, read leniently (above)."""
    cid, title, profile, system_prompt, created, updated, count, sampling = row
    return ChatRecord(_whole(cid), _text(title, "chat"), _optional_text(profile), _optional_text(system_prompt),
                      _time(created), _time(updated), _whole(count), sampling=_json_dict(sampling))


def message_from_row(row: Sequence[Any]) -> MessageRecord:
    """A message from ``id, chat_id, role, content, profile, stats, pieces, finish_reason,
    created, superseded``, read leniently (above): JSON that cannot be read, or of the wrong
    shape, is left out (None)."""
    mid, cid, role, content, profile, stats, pieces, finish, created, superseded = row
    return MessageRecord(_whole(mid), _whole(cid), _text(role), _text(content), _optional_text(profile),
                         _stats(stats), _pieces(pieces), _optional_text(finish), _time(created), bool(superseded))


def to_json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False)


def from_json(text: str | bytes | None) -> Any:
    if not text or not isinstance(text, (str, bytes)):
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None
