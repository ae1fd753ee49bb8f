"""Past chats: reopen, rename, delete, export, or start a new one."""
from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, cast

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.content import Content
from textual.widgets import Footer, Label, OptionList
from textual.widgets.option_list import Option

from app.ui.export import default_export_path, export_chat
from app.store.history import ChatRecord, HistoryError
from app.ui.screens.dialog import Dialog
from app.ui.screens.edit import ConfirmScreen, EditScreen

if TYPE_CHECKING:
    from app.ui.app import SpecChatApp

ChatsResult = tuple[str, "int | None"]
"""``("open", chat_id)`` or ``("new", None)``."""


def chat_option(chat: ChatRecord, current: bool) -> Option:
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(chat.updated))
    return Option(
        Content.assemble(
            (chat.title, "bold"),
            ("  ● open" if current else "", "$text-success"),
            "\n  ",
            (f"{when} · {chat.profile or '—'} · {chat.message_count} messages", "$text-muted"),
        ),
        id=str(chat.id),
    )


class ChatsScreen(Dialog["ChatsResult | None"]):
    """The list of saved chats."""

    BINDINGS = [
        Binding("n", "new", "New chat"),
        Binding("r", "rename", "Rename"),
        Binding("d,delete", "delete", "Delete"),
        Binding("e", "export", "Export"),
    ]

    def __init__(self, current: int | None) -> None:
        super().__init__()
        self._current = current

    @property
    def _app(self) -> "SpecChatApp":
        return cast("SpecChatApp", self.app)

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog chats-dialog"):
            yield Label("Chats", classes="dialog-title")
            yield Label("Enter opens · n new · r rename · d delete · e export · Esc closes",
                        classes="dialog-hint")
            yield OptionList(id="chat-list")
        yield Footer()

    def on_mount(self) -> None:
        self._reload()
        self.query_one(OptionList).focus()

    def _reload(self) -> None:
        option_list = self.query_one(OptionList)
        highlighted = option_list.highlighted
        option_list.clear_options()
        try:
            chats = self._app.history.list_chats()
        except HistoryError as exc:
            self.notify(str(exc), severity="error")
            chats = []
        if not chats:
            option_list.add_option(Option(Content.styled("No saved chats yet.", "$text-muted"), disabled=True))
            return
        option_list.add_options(chat_option(c, c.id == self._current) for c in chats)
        option_list.highlighted = 0 if highlighted is None else min(highlighted, len(chats) - 1)

    def _selected_chat(self) -> ChatRecord | None:
        """The highlighted chat, as saved now (None: no chat, or it is gone)."""
        option = self.query_one(OptionList).highlighted_option
        return self._app.history.get_chat(int(option.id)) if option is not None and option.id else None

    def picked(self, option: Option) -> None:
        if option.id:
            self.dismiss(("open", int(option.id)))

    def action_new(self) -> None:
        self.dismiss(("new", None))

    def action_rename(self) -> None:
        chat = self._selected_chat()
        if chat is None:
            return

        def done(title: str | None) -> None:
            if title and title.strip():
                self._app.rename_chat(chat.id, title.strip())
                self._reload()

        self.app.push_screen(EditScreen("Rename chat", chat.title), done)

    def action_delete(self) -> None:
        chat = self._selected_chat()
        if chat is None:
            return

        def done(yes: bool | None) -> None:
            if yes:
                self._app.delete_chat(chat.id)
                self._reload()

        self.app.push_screen(ConfirmScreen(f"Delete “{chat.title}” and its {chat.message_count} messages?"), done)

    def action_export(self) -> None:
        chat = self._selected_chat()
        if chat is None:
            return

        def done(path: str | None) -> None:
            if not path:
                return
            try:
                written = export_chat(self._app.history, chat.id, Path(path))
            except HistoryError as exc:
                self.notify(str(exc), severity="error")
                return
            self.notify(f"Exported to {written}", title="Export")

        self.app.push_screen(
            EditScreen("Export chat to Markdown", str(default_export_path(chat.id, chat.title)),
                       hint="File path (created with mode 0600)"),
            done,
        )
