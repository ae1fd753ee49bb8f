"""Small state kept between runs, in the user state dir: the last profile used, the
last chat open (with when it was left, to weigh against chats written since), the
text left unsent in the prompt box at the last quit and the theme chosen last.

A missing or unreadable file means "nothing remembered"; a failed write is
ignored (remembering is a convenience, never a reason to stop the app).

Several windows share the file. Each change is a read-modify-write under an exclusive
``flock`` on ``state.lock`` (where ``fcntl`` exists), written to a temporary file of its own
and renamed over ``state.json``, so a reader never sees half a file and no window's change
is lost to another's. Unsent text is a short stack, one entry a window that closed with
text in its box: a window closing with an empty box takes nothing away from another's.
The file is readable by its owner only, since unsent text is in it.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.paths import state_dir

try:
    import fcntl
except ImportError:  # not Linux or macOS: changes are not serialized between windows
    fcntl = None  # type: ignore[assignment]

DRAFTS_KEPT = 8  # unsent texts kept at most (windows closed with text, newest last)


def state_file() -> Path:
    """``state_dir()/state.json``."""
    return state_dir() / "state.json"


def _read() -> dict[str, Any]:
    try:
        data = json.loads(state_file().read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # RecursionError: nested beyond the parser's depth
        return {}
    return data if isinstance(data, dict) else {}


def last_profile() -> str | None:
    """The name of the profile loaded last, if one was remembered."""
    return _name("last_profile")


def remember_profile(name: str) -> None:
    """Remember ``name`` as the profile to start with next time (written atomically)."""
    _keep_name("last_profile", name)


def last_theme() -> str | None:
    """The name of the theme chosen last (ctrl+p, "Change theme"), if one was remembered."""
    return _name("theme")


def remember_theme(name: str) -> None:
    """Remember ``name`` as the theme to start with next time."""
    _keep_name("theme", name)


def _name(key: str) -> str | None:
    name = _read().get(key)
    return name if isinstance(name, str) and name else None


def _keep_name(key: str, name: str) -> None:
    def change(data: dict[str, Any]) -> bool:
        if data.get(key) == name:  # unchanged: the file is left as it is
            return False
        data[key] = name
        return True

    _update(change)


def last_chat() -> tuple[int, float] | None:
    """``(chat id, when it was last open)`` of the chat remembered by :func:`remember_chat`."""
    entry = _read().get("last_chat")
    if not isinstance(entry, dict):
        return None
    chat_id, at = entry.get("id"), entry.get("at")
    if not isinstance(chat_id, int) or isinstance(chat_id, bool) or not isinstance(at, (int, float)) or isinstance(at, bool):
        return None
    try:
        when = float(at)  # an integer beyond a float's range is OverflowError
    except OverflowError:
        return None
    return (chat_id, when) if math.isfinite(when) else None


def remember_chat(chat_id: int, at: float) -> None:
    """Remember saved chat ``chat_id`` as open at time ``at`` (the app reopens it next time
    unless another chat was written after ``at``). A private chat is never passed here."""
    def change(data: dict[str, Any]) -> bool:
        data["last_chat"] = {"id": int(chat_id), "at": float(at)}
        return True

    _update(change)


@dataclass(frozen=True)
class Draft:
    """Text left unsent as a window closed, and the saved chat it was typed in (None: a new chat)."""

    text: str
    chat_id: int | None = None
    title: str | None = None

    def to_json(self) -> str | dict[str, Any]:
        return self.text if self.chat_id is None else {"text": self.text, "chat": self.chat_id, "title": self.title}


def _draft(entry: object) -> Draft | None:
    if isinstance(entry, str):  # as kept before drafts named their chat
        return Draft(entry) if entry.strip() else None
    if not isinstance(entry, dict) or not isinstance(entry.get("text"), str) or not entry["text"].strip():
        return None
    chat, title = entry.get("chat"), entry.get("title")
    return Draft(entry["text"], chat if isinstance(chat, int) and not isinstance(chat, bool) else None,
                 title if isinstance(title, str) else None)


def _drafts(data: dict[str, Any]) -> list[Draft]:
    """The kept unsent texts, oldest first (``draft``, one string, is how 0.x kept one)."""
    kept = data.get("drafts")
    drafts = [d for d in map(_draft, kept if isinstance(kept, list) else []) if d is not None]
    old = _draft(data.get("draft")) if isinstance(data.get("draft"), str) else None
    return ([old] if old is not None else []) + drafts


def remember_draft(text: str | None, chat_id: int | None = None, title: str | None = None) -> str | None:
    """Keep ``text``, left unsent in the prompt box as the app closes, for the next start, with the
    saved chat it was typed in (``chat_id``, ``title``; None: a new chat). None or blank: nothing is
    kept, and nothing another window kept is forgotten. A private chat's is never passed here.
    Answers why it could not be kept (None: kept, or nothing to keep): the app then exports it
    rather than lose it."""
    if not text or not text.strip():
        return None
    kept = Draft(text, chat_id, title)

    def change(data: dict[str, Any]) -> bool:
        drafts = [d for d in _drafts(data) if d.text != text] + [kept]
        data.pop("draft", None)
        data["drafts"] = [d.to_json() for d in drafts[-DRAFTS_KEPT:]]
        return True

    return _update(change)


def take_draft(chat_id: int | None = None) -> str | None:
    """The text of :func:`take_draft_for`."""
    draft = take_draft_for(chat_id)
    return draft.text if draft is not None else None


def take_draft_for(chat_id: int | None) -> Draft | None:
    """The newest text :func:`remember_draft` kept in chat ``chat_id`` (the chat the app opens),
    else the newest of all, forgotten as it is taken (None: there is none); another, kept by
    another window, waits for the start after. Two windows closed with text: the one chat's text
    came back in the other's box (a hostile tester's)."""
    taken: list[Draft] = []

    def change(data: dict[str, Any]) -> bool:
        if "draft" not in data and "drafts" not in data:
            return False
        drafts = _drafts(data)
        if drafts:
            mine = [i for i, d in enumerate(drafts) if chat_id is not None and d.chat_id == chat_id]
            taken.append(drafts.pop(mine[-1] if mine else -1))
        data.pop("draft", None)
        data.pop("drafts", None)
        if drafts:
            data["drafts"] = [d.to_json() for d in drafts]
        return True

    _update(change)
    return taken[0] if taken else None


def _update(change: Callable[[dict[str, Any]], bool]) -> str | None:
    """Read the file, let ``change`` edit its contents (True: it did) and write them back,
    all under the lock. A failed write is answered (why, naming the folder), not raised: what the
    file keeps is a convenience, but for the unsent text (:func:`remember_draft`)."""
    try:
        with _locked():
            data = _read()
            if change(data):
                _write(data)
    except OSError as exc:
        return f"the state folder {state_file().parent} cannot be written ({exc.strerror or exc})"
    return None


@contextmanager
def _locked() -> Iterator[None]:
    """An exclusive lock on ``state.lock`` beside the file, held for the block (the folder made
    first); without ``fcntl``, no lock."""
    folder = state_file().parent
    folder.mkdir(parents=True, exist_ok=True)
    if fcntl is None:
        yield
        return
    fd = os.open(folder / "state.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing lets the lock go


def _write(data: dict[str, Any]) -> None:
    """``data`` into a temporary file of this call's own (mode 0600), renamed over the file."""
    path = state_file()
    fd, tmp = tempfile.mkstemp(prefix="state.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(json.dumps(data, indent=1))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
