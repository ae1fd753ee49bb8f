"""Export a saved chat to a Markdown file, statistics included."""
from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.ui.formatting import fmt_float, fmt_percent, fmt_rate, modes_label, speedup_figure
from app.store.history import History, HistoryError
from app.store.paths import data_dir, ensure_private_dir
from app.ui.screens.edit import EditScreen


def default_export_path(chat_id: int, title: str) -> Path:
    """``data_dir()/exports/<slug>-<id>.md``."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", title).strip("-").lower()[:40] or "chat"
    return data_dir() / "exports" / f"{slug}-{chat_id}.md"


def stats_line(stats: dict[str, Any]) -> str:
    """One line summarising a reply's statistics."""
    parts = [f"mode {modes_label(stats)}", f"drafter {stats.get('drafter', '?')}"]
    k = stats.get("k")
    if k is not None:
        parts.append(f"K {k}{' (adaptive)' if stats.get('adaptive') else ''}")
    parts += [
        f"acceptance rate {fmt_percent(stats.get('alpha'))} (accepted ÷ proposed)",
        f"α per token {fmt_float(stats.get('alpha_per_token'))}",
        f"τ {fmt_float(stats.get('tau'))}",
        f"{fmt_rate(stats.get('tokens_per_s'))} tok/s",
        f"ITL {fmt_float(stats.get('itl_ms'), 1)} ms",
        f"speedup {speedup_figure(stats) or 'none (decoded plainly)'}",
        f"plain estimate {fmt_rate(stats.get('plain_tokens_per_s'))} tok/s"
        + (f" ({stats['plain_rounds']} K=0 rounds: {fmt_rate(stats.get('plain_measured_tokens_per_s'))} tok/s)"
           if stats.get("plain_rounds") else ""),
        f"{stats.get('tokens', 0)} tokens",
    ]
    if stats.get("speculation_off_reason"):
        reason = str(stats["speculation_off_reason"])
        parts.append(reason if reason.startswith("speculation") else f"speculation off: {reason}")
    return " · ".join(parts)


def chat_markdown(history: History, chat_id: int) -> str:
    """The chat as a Markdown document."""
    chat = history.get_chat(chat_id)
    if chat is None:
        raise HistoryError(f"Chat {chat_id} does not exist.")
    lines = [
        f"# {chat.title}",
        "",
        f"- Profile: {chat.profile or '—'}",
        f"- Started: {time.strftime('%Y-%m-%d %H:%M', time.localtime(chat.created))}",
    ]
    if chat.system_prompt:
        lines += ["", "## System prompt", "", chat.system_prompt]
    for msg in history.messages(chat_id):
        lines += ["", f"## {msg.role.capitalize()}" + (f" ({msg.profile})" if msg.role == "assistant" and msg.profile else ""), ""]
        lines.append(msg.content)
        if msg.role == "assistant":
            if msg.finish_reason == "cancelled":
                lines += ["", "*(stopped)*"]
            if msg.stats:
                lines += ["", f"> {stats_line(msg.stats)}"]
    return "\n".join(lines) + "\n"


def export_chat(history: History, chat_id: int, path: Path | None = None) -> Path:
    """Write the chat to ``path`` (default :func:`default_export_path`), mode 0600."""
    if path is None:
        chat = history.get_chat(chat_id)
        path = default_export_path(chat_id, chat.title if chat else "chat")
    path = Path(path).expanduser()
    try:
        if path.parent == data_dir() / "exports":
            ensure_private_dir(path.parent)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HistoryError(f"Could not create {path.parent}: {exc}") from exc
    text = chat_markdown(history, chat_id)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(path, 0o600)
    except OSError as exc:
        raise HistoryError(f"Could not write {path}: {exc}") from exc
    return path


Tell = Callable[[str, str], None]
"""Shows a one-line result: ``(text, severity)``."""


def ask_export(history: History, chat_id: int, title: str,
               tell: Tell) -> tuple[EditScreen, Callable[[str | None], None]]:
    """The dialog that asks where to write chat ``chat_id`` as Markdown, and what to do with
    its answer (write the file, then tell where, or why not). The caller opens it."""
    def done(path: str | None) -> None:
        if not path:
            return
        try:
            written = export_chat(history, chat_id, Path(path))
        except HistoryError as exc:
            tell(str(exc), "error")
            return
        tell(f"Exported to {written}", "information")

    return EditScreen("Export chat to Markdown", str(default_export_path(chat_id, title)),
                      hint="File path (written with mode 0600)"), done
