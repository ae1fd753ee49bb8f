"""The current conversation and the saved ones: new, open, rename, delete, export.

Mixed into :class:`app.ui.app.SpecChatApp`. ``turns`` is what the backend sees
each turn (after the system prompt); ``chat_id`` is the saved chat, created
lazily with the first prompt so empty chats never clutter the history.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from textual.widgets import Static

from app.ui.export import default_export_path, export_chat
from app.store.history import HistoryError
from app.store.saver import ChatRef
from app.ui.screens.chats import ChatsResult, ChatsScreen
from app.ui.screens.edit import EditScreen
from app.ui.widgets.chat_view import AssistantMessage, UserMessage
from engine.events import ChatMessage

if TYPE_CHECKING:
    from app.ui.app import SpecChatApp

T = TypeVar("T")

WELCOME = (
    "Ask anything. [b]Enter[/b] sends, [b]ctrl+j[/b] adds a line, [b]Esc[/b] stops a reply.\n"
    "[b]F4[/b] colours tokens by source · [b]F2[/b] switches profile · [b]F3[/b] past chats · [b]F1[/b] help"
)


class ChatMixin:
    """Conversation state and history actions."""

    def init_chat_state(self) -> None:
        self._chat_ref: ChatRef | None = None
        self.turns: list[ChatMessage] = []
        self.chat_system_prompt: str | None = None
        """The chat's own system prompt; None follows the profile's."""

    @property
    def chat_id(self) -> int | None:
        """The saved chat's id; None before the saver wrote its first row."""
        return self._chat_ref.id if self._chat_ref is not None else None

    @chat_id.setter
    def chat_id(self, value: int | None) -> None:
        self._chat_ref = None if value is None else ChatRef("", id=value)

    @property
    def system_prompt(self: "SpecChatApp") -> str | None:
        """The system prompt sent first each turn."""
        if self.chat_system_prompt is not None:
            return self.chat_system_prompt or None
        return self.profile.system_prompt if self.profile is not None else None

    def db(self: "SpecChatApp", fn: Callable[..., T], *args: object, **kwargs: object) -> T | None:
        """Run a history call; on failure show the error and carry on without saving."""
        try:
            return fn(*args, **kwargs)
        except HistoryError as exc:
            self.notice(str(exc), severity="error", title="History")
            return None

    def ensure_chat(self: "SpecChatApp", title: str) -> ChatRef:
        """The current chat; on the first prompt a new one, created in the database by the saver."""
        if self._chat_ref is None:
            self._chat_ref = ChatRef(title, self.profile.name if self.profile else None, self.chat_system_prompt)
        return self._chat_ref

    def chat_profile_changed(self: "SpecChatApp", name: str) -> None:
        """A new profile is loaded: the chat continues with it."""
        if self.chat_id is not None:
            self.db(self.history.set_profile, self.chat_id, name)

    # -- transcript ----------------------------------------------------------------

    def show_welcome(self: "SpecChatApp") -> None:
        if not self.chat_log.query("#welcome"):
            self.chat_log.mount(Static(WELCOME, id="welcome"))

    def hide_welcome(self: "SpecChatApp") -> None:
        self.chat_log.query("#welcome").remove()

    async def _reset_transcript(self: "SpecChatApp") -> None:
        self.stop_reply()
        self._reply_id += 1  # late events of the old reply are dropped
        self._reply_widget = None
        self._cancel = None
        self.generating = False
        waiting, self.queued = [w.text for w in self.queued], []
        await self.chat_log.remove_children()
        if waiting:  # prompts that never went out return to the box, not lost
            self.prompt.restore("\n".join(waiting))

    async def action_new_chat(self: "SpecChatApp") -> None:
        """Start an empty conversation (the saved one stays in the history)."""
        await self._reset_transcript()
        self.chat_id = None
        self.turns = []
        self.chat_system_prompt = None
        self.show_welcome()
        self.notice("New chat.")

    async def open_chat(self: "SpecChatApp", chat_id: int) -> None:
        """Show a saved chat and continue it with the loaded profile."""
        chat = self.db(self.history.get_chat, chat_id)
        records = self.db(self.history.messages, chat_id)
        if chat is None or records is None:
            self.notice("That chat no longer exists.", severity="warning")
            return
        await self._reset_transcript()
        self.chat_id = chat.id
        self.chat_system_prompt = chat.system_prompt
        self.turns = []
        widgets: list[UserMessage | AssistantMessage] = []
        for i, rec in enumerate(records):
            if rec.superseded:  # an edited prompt's earlier exchange: shown, never sent again
                widget = UserMessage(rec.content, message_id=rec.id) if rec.role == "user" else AssistantMessage(
                    rec.profile, text=rec.content, pieces=rec.pieces, finish_reason=rec.finish_reason or "cancelled",
                    stats=rec.stats, show_sources=self.show_sources)
                widget.set_superseded()
                widgets.append(widget)
                continue
            if rec.role == "user":
                widgets.append(UserMessage(rec.content, message_id=rec.id))
            elif rec.role == "assistant":
                widgets.append(AssistantMessage(
                    rec.profile, text=rec.content, pieces=rec.pieces,
                    finish_reason=rec.finish_reason or "cancelled", stats=rec.stats,
                    show_sources=self.show_sources,
                ))
                if i + 1 < len(records) and records[i + 1].role == "assistant":
                    widgets[-1].set_superseded()  # regenerated: the next reply answers the same prompt
                    continue
            if rec.role in ("user", "assistant") and rec.content:
                self.turns.append(ChatMessage(rec.role, rec.content))  # type: ignore[arg-type]
        if widgets:
            await self.chat_log.mount_all(widgets)
        else:
            self.show_welcome()
        self.chat_log.follow()
        self.sub_title = f"{chat.title}"
        if chat.profile and self.profile is not None and chat.profile != self.profile.name:
            if self.profiles is not None and chat.profile in self.profiles.names():
                self.notice(f"This chat continues with its own profile, {chat.profile}.")
                self.switch_profile(chat.profile)
            else:
                self.notice(f"This chat was with {chat.profile}, which is not available; it continues with "
                            f"{self.profile.name} (F2 switches).")

    def rename_chat(self: "SpecChatApp", chat_id: int, title: str) -> None:
        self.db(self.history.rename_chat, chat_id, title)

    def delete_chat(self: "SpecChatApp", chat_id: int) -> None:
        self.db(self.history.delete_chat, chat_id)
        if chat_id == self.chat_id:
            self.chat_id = None  # the transcript stays on screen; a new prompt starts a new chat
            self.notice("Deleted the open chat; the next prompt starts a new one.")

    # -- screens --------------------------------------------------------------------

    def action_chats(self: "SpecChatApp") -> None:
        async def done(result: ChatsResult | None) -> None:
            if result is None:
                return
            action, chat_id = result
            if action == "open" and chat_id is not None:
                await self.open_chat(chat_id)
            elif action == "new":
                await self.action_new_chat()

        self.push_screen(ChatsScreen(self.chat_id), done)

    def action_edit_system_prompt(self: "SpecChatApp") -> None:
        profile_prompt = self.profile.system_prompt if self.profile else None

        def done(value: str | None) -> None:
            if value is None:
                return
            value = value.strip()
            self.chat_system_prompt = None if value == (profile_prompt or "") else value
            if self.chat_id is not None:
                self.db(self.history.set_system_prompt, self.chat_id, self.chat_system_prompt)
            self.notice("System prompt set." if value else "No system prompt for this chat.")

        self.push_screen(EditScreen(
            "System prompt for this chat", self.system_prompt or "", multiline=True,
            hint="ctrl+s saves · Esc cancels · leave the profile's text to follow the profile, clear it for none",
        ), done)

    def action_export_chat(self: "SpecChatApp") -> None:
        if self.chat_id is None:
            self.notice("Nothing to export yet.", severity="warning")
            return
        chat_id = self.chat_id
        chat = self.db(self.history.get_chat, chat_id)

        def done(path: str | None) -> None:
            if not path:
                return
            try:
                written = export_chat(self.history, chat_id, Path(path))
            except HistoryError as exc:
                self.notice(str(exc), severity="error", title="Export")
                return
            self.notice(f"Exported to {written}", title="Export")

        default = default_export_path(chat_id, chat.title if chat else "chat")
        self.push_screen(EditScreen("Export chat to Markdown", str(default),
                                    hint="File path (written with mode 0600)"), done)
