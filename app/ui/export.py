"""Export a saved chat to a Markdown file, statistics included."""
from __future__ import annotations

import os
import re
import tempfile
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

from app.ui.formatting import fmt_float, fmt_percent, fmt_rate, modes_label, speedup_figure, split_failure
from app.ui.sampling import ChatSampling
from app.store.history import History, HistoryError
from app.store.records import answered_again
from app.store.paths import data_dir, ensure_private_dir
from app.ui.screens.edit import EditScreen
from engine.text_safety import inert


def default_export_path(chat_id: int | None, title: str) -> Path:
    """``data_dir()/exports/<slug>-<id>.md`` (a chat not saved: ``<slug>-<date>-<time>.md``)."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", title).strip("-").lower()[:40] or "chat"
    return data_dir() / "exports" / f"{slug}-{time.strftime('%Y%m%d-%H%M%S') if chat_id is None else chat_id}.md"


def stats_line(stats: dict[str, Any]) -> str:
    """One line summarising a reply's statistics."""
    parts = [f"mode {modes_label(stats)}", f"drafter {stats.get('drafter', '?')}"]
    k = stats.get("k")
    if stats.get("proposed"):  # the drafting figures, named as the HUD names them; none for a plain reply
        if k is not None:
            parts.append(f"K {k}{' (adaptive)' if stats.get('adaptive') else ''}")
        parts += [f"accepted {fmt_percent(stats.get('alpha'))} of proposed",
                  f"α/token {fmt_float(stats.get('alpha_per_token'))}"]
    parts += [
        f"τ {fmt_float(stats.get('tau'))}",
        f"{fmt_rate(stats.get('tokens_per_s'))} tok/s",
        f"ITL {fmt_float(stats.get('itl_ms'), 1)} ms",
        f"speedup {speedup_figure(stats) or ('none (no tokens)' if not stats.get('tokens') else 'none (decoded plainly)')}",
        *([f"plain estimate {fmt_rate(stats.get('plain_tokens_per_s'))} tok/s"
           + (f" ({stats['plain_rounds']} K=0 rounds: {fmt_rate(stats.get('plain_measured_tokens_per_s'))} tok/s)"
              if stats.get("plain_rounds") else "")] if stats.get("speedup") is not None else []),
        f"{stats.get('tokens', 0)} tokens",
    ]
    if stats.get("speculation_off_reason"):
        reason = str(stats["speculation_off_reason"])
        parts.append(reason if reason.startswith("speculation") else f"speculation off: {reason}")
    return " · ".join(parts)


def chat_markdown(history: History, chat_id: int, writing: Collection[int] = ()) -> str:
    """The chat as a Markdown document, its control characters written as visible stand-ins
    (:func:`~engine.text_safety.inert`): ``cat`` or a pager must not obey a reply's escapes.
    ``writing``: row ids of replies still streaming (said so, not "never saved")."""
    chat = history.get_chat(chat_id)
    if chat is None:
        raise HistoryError(f"Chat {chat_id} does not exist.")
    lines = [
        f"# {chat.title}",
        "",
        f"- Profile: {chat.profile or '—'}",
        f"- Started: {time.strftime('%Y-%m-%d %H:%M', time.localtime(chat.created))}",
    ]
    sampling = ChatSampling.from_dict(chat.sampling).own_label()
    if sampling:
        lines.append(f"- Sampling: {sampling} (what the chat sets; the rest as its profile sets)")
    if chat.system_prompt:
        lines += ["", "## System prompt (the chat's as it is now)", "", chat.system_prompt]
    records = history.messages(chat_id)
    for i, msg in enumerate(records):
        earlier = (" · earlier reply, answered again below" if msg.role == "assistant" else
                   " · edited, asked again below") if answered_again(records, i) else ""
        lines += ["", f"## {msg.role.capitalize()}" + (f" ({msg.profile})" if msg.role == "assistant" and msg.profile else "")
                  + earlier, ""]
        lines.append(msg.content)
        if msg.role == "assistant":
            if msg.finish_reason == "cancelled":
                lines += ["", "*(stopped)*"]
            elif msg.finish_reason is None and msg.id in writing:
                lines += ["", "*(still being written when exported)*"]
            elif msg.finish_reason is None:  # its app ended before the reply did
                lines += ["", "*(unfinished: its end was never saved)*"]
            figures, failure = split_failure(msg.stats)
            if msg.finish_reason == "error":
                lines += ["", f"*(failed: {' '.join(failure.split())})*" if failure else "*(failed)*"]
            if figures:
                lines += ["", f"> {stats_line(figures)}"]
    return inert("\n".join(lines) + "\n")


def create_new_file(path: Path) -> tuple[int, Path]:
    """Create ``path`` for writing (mode 0600), or ``<stem>-2<suffix>``, ``-3``… when it exists.

    Never opens an existing file: ``O_EXCL`` makes the check and the creation one step,
    so an existing file is neither overwritten nor has its mode changed. Returns the
    open descriptor and the path it was created at."""
    for n in range(1, 10_000):
        candidate = path if n == 1 else path.with_name(f"{path.stem}-{n}{path.suffix}")
        try:
            return os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), candidate
        except FileExistsError:
            continue
    raise FileExistsError(f"{path} and 9,998 numbered names next to it exist")


def write_new_file(path: Path, text: str) -> Path:
    """Write ``text`` to a file created by :func:`create_new_file`; returns where. A failed
    write removes the partial file it created (it never touched another)."""
    fd, written = create_new_file(path)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
    except BaseException:
        try:
            written.unlink()
        except OSError:
            pass
        raise
    return written


def export_destination(path: Path | str | None, default: Path) -> Path:
    """Where an export means to write: ``path``, or ``default`` where none is given, or
    ``default``'s name inside ``path`` where that is a folder or ends in a separator (a folder to
    make). :class:`HistoryError` for a path no file can have (a NUL character, a name too long)."""
    if path is None or not str(path):
        return default
    text = str(path)
    if "\0" in text:
        raise HistoryError("Could not export: a file path cannot hold a NUL character.")
    target = Path(text).expanduser()
    try:
        if text.endswith(("/", os.sep)) or target.is_dir():
            return target / default.name
    except OSError as exc:  # ENAMETOOLONG and the like, from asking about the path at all
        raise HistoryError(f"Could not export to {target}: {exc.strerror or exc}") from None
    return target


def write_export(path: Path, text: str) -> Path:
    """Write ``text`` to ``path``, created with mode 0600 (its folder made; the exports folder
    0700); if it exists, to ``<stem>-2<suffix>`` (and so on) instead. Returns the path written;
    a failure is :class:`HistoryError` naming the path and why."""
    try:
        if path.parent == data_dir() / "exports":
            ensure_private_dir(path.parent)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HistoryError(f"Could not create {path.parent}: {exc.strerror or exc}") from exc
    try:
        return write_new_file(path, text)
    except OSError as exc:
        tried = Path(exc.filename) if isinstance(exc.filename, str) else path
        beside = f" ({path} exists and was left as it was)" if tried != path else ""
        raise HistoryError(f"Could not write {tried}{beside}: {exc.strerror or exc}") from exc


def export_chat(history: History, chat_id: int, path: Path | str | None = None) -> Path:
    """Write saved chat ``chat_id`` (:func:`chat_markdown`) to :func:`export_destination`'s
    file, by :func:`write_export`."""
    chat = history.get_chat(chat_id)
    default = default_export_path(chat_id, chat.title if chat else "chat")
    return write_export(export_destination(path, default), chat_markdown(history, chat_id))


def transcript_markdown(title: str, messages: list[tuple[str, str]], unsent: str = "",
                        note: str = "Exported unsaved at quit", settings: Sequence[str] = ()) -> str:
    """A chat as the screen shows it (``(role, text)`` in order) and the prompt box's unsent
    text, as Markdown: what quitting exports when the history could not take it. Made inert
    (:func:`~engine.text_safety.inert`) as :func:`chat_markdown` is. ``settings``: lines about
    the chat's own settings (its sampling, its system prompt), which the history may not have
    taken either."""
    lines = [f"# {title}", "", f"- {note}: {time.strftime('%Y-%m-%d %H:%M')}", *(f"- {s}" for s in settings)]
    for role, text in messages:
        lines += ["", f"## {role.capitalize()}", "", text]
    if unsent.strip():
        lines += ["", "## Unsent prompt", "", unsent]
    return inert("\n".join(lines) + "\n")


def export_unsaved(text: str, name: str = "unsaved-chat.md") -> Path:
    """Write ``text`` to a new file ``name`` in the first folder that takes it: the exports
    folder, then home, the working folder and the temp folder (a full or read-only data
    folder must not lose it). Raises :class:`HistoryError` naming each folder tried."""
    tried: list[str] = []
    for folder in (data_dir() / "exports", Path.home(), Path.cwd(), Path(tempfile.gettempdir())):
        try:
            if folder == data_dir() / "exports":
                ensure_private_dir(folder)
            return write_new_file(folder / name, text)
        except OSError as exc:
            tried.append(f"{folder} ({exc.strerror or exc})")
    raise HistoryError("Could not export the unsaved chat: " + "; ".join(tried))


Tell = Callable[[str, str], None]
"""Shows a one-line result: ``(text, severity)``."""


def ask_export(history: History, chat_id: int, title: str, tell: Tell,
               writing: Callable[[], Collection[int]] = tuple) -> tuple[EditScreen, Callable[[str | None], None]]:
    """The dialog that asks where to write saved chat ``chat_id`` as Markdown, and what to do
    with its answer (write the file, then tell where, or why not). The caller opens it.
    ``writing``: the row ids of replies streaming when the file is written (F9 during a reply
    called it "never saved")."""
    return _ask(default_export_path(chat_id, title),
                lambda path: write_export(path, chat_markdown(history, chat_id, writing())), tell)


def ask_export_screen(title: str, messages: list[tuple[str, str]], note: str,
                      tell: Tell) -> tuple[EditScreen, Callable[[str | None], None]]:
    """:func:`ask_export` for a chat as the screen shows it (``(role, text)`` in order): a
    private chat, never saved, or one whose last replies the history has not taken yet. F9 said
    "Nothing to export yet." in the first case and left the unsaved replies out in the second."""
    return _ask(default_export_path(None, title),
                lambda path: write_export(path, transcript_markdown(title, messages, note=note)), tell)


def _ask(default: Path, write: Callable[[Path], Path],
         tell: Tell) -> tuple[EditScreen, Callable[[str | None], None]]:
    def done(path: str | None) -> None:
        if not path:
            return
        try:
            meant = export_destination(path, default)
            written = write(meant)
        except HistoryError as exc:
            tell(str(exc), "error")
            return
        if written != meant:
            tell(f"{meant} exists and was left as it was; exported to {written}", "warning")
        else:
            tell(f"Exported to {written}", "information")

    return EditScreen("Export chat to Markdown", str(default),
                      hint="File path (a new file, mode 0600; an existing one is never replaced)"), done
