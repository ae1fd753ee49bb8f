"""Small state kept between runs, in the user state dir: the last profile used.

A missing or unreadable file means "nothing remembered"; a failed write is
ignored (remembering is a convenience, never a reason to stop the app).
"""
from __future__ import annotations

import json
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
    name = _read().get("last_profile")
    return name if isinstance(name, str) and name else None


def remember_profile(name: str) -> None:
    """Remember ``name`` as the profile to start with next time (written atomically)."""
    data = _read()
    if data.get("last_profile") == name:
        return
    data["last_profile"] = name
    path = state_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass
