"""Toasts whose text is shown literally: engine and history messages may contain brackets,
and quote servers and files, so their control characters are made visible (never obeyed)."""
from __future__ import annotations

from typing import Any

from textual.app import App
from textual.widget import Widget

from engine.text_safety import inert


def notice(node: "Widget | App[Any]", message: str, *, severity: str = "information", title: str = "",
           timeout: float | None = None) -> None:
    """A toast from ``node`` (a widget or the App): errors stay 10 s, others 5 s unless ``timeout``."""
    node.notify(inert(message), severity=severity, title=inert(title), markup=False,  # type: ignore[arg-type]
                timeout=timeout if timeout is not None else (10 if severity == "error" else 5))
