"""Small state kept between runs, in the user state dir: the last profile used, the
last chat open (with when it was left, to weigh against chats written since), the
text left unsent in the prompt box at the last quit and the theme chosen last.

A missing or unreadable file means "nothing remembered"; a failed write is
ignored (remembering is a convenience, never a reason to stop the app).
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from engine.paths import state_dir


def state_file() -> Path:
    """``state_dir()/state.json``."""
    return state_dir() / "state.json"


def _read() -> dict[str, Any]:
    try:
        data = json.loads(state_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
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
    data = _read()
    if data.get(key) != name:  # unchanged: the file is left as it is
        data[key] = name
        _write(data)


def last_chat() -> tuple[int, float] | None:
    """``(chat id, when it was last open)`` of the chat remembered by :func:`remember_chat`."""
    entry = _read().get("last_chat")
    if not isinstance(entry, dict):
        return None
    chat_id, at = entry.get("id"), entry.get("at")
    if (not isinstance(chat_id, int) or isinstance(chat_id, bool) or not isinstance(at, (int, float))
            or isinstance(at, bool) or not math.isfinite(at)):
        return None
    return chat_id, float(at)


def remember_chat(chat_id: int, at: float) -> None:
    """Remember saved chat ``chat_id`` as open at time ``at`` (the app reopens it next time
    unless another chat was written after ``at``). A private chat is never passed here."""
    data = _read()
    data["last_chat"] = {"id": int(chat_id), "at": float(at)}
    _write(data)


def remember_draft(text: str | None) -> None:
    """Keep ``text``, left unsent in the prompt box as the app closes, for the next start
    (None or blank: nothing kept). A private chat's is never passed here."""
    data = _read()
    if text and text.strip():
        data["draft"] = text
    elif "draft" in data:
        del data["draft"]
    else:
        return  # nothing kept, nothing to forget: the file is left as it is
    _write(data)


def take_draft() -> str | None:
    """The text :func:`remember_draft` kept, forgotten as it is taken (None: there is none)."""
    data = _read()
    if "draft" not in data:
        return None
    text = data.pop("draft")
    _write(data)
    return text if isinstance(text, str) and text.strip() else None


def _write(data: dict[str, Any]) -> None:
    path = state_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass
