"""A chat's own settings and what is unsent, as the open chat keeps them: its sampling, system
prompt and profile (saved through the history's saver: :meth:`app.ui.archive.Archive.save_setting`),
Up's recall after a chat is deleted, and the text typed but not sent. A mixin of
:class:`~app.ui.widgets.conversation.Conversation`, which owns the state named below.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from textual.widget import Widget

from app.store.pending import ChatRef, Setting
from app.ui.notices import notice
from app.ui.sampling import ChatSampling

if TYPE_CHECKING:
    from app.ui.archive import Archive
    from app.ui.engine_host import EngineHost
    from app.ui.widgets.chat_view import UserMessage
    from app.ui.widgets.prompt import PromptArea

# A plain mixin at run time, as ReplyPainting is (app.ui.widgets.reply_painting says why).
_Base = Widget if TYPE_CHECKING else object


class OpenEdit(Protocol):
    """A dialog's text being edited (app.ui.screens.edit.EditScreen: widgets never import screens)."""

    text: str

    @property
    def changed(self) -> bool: ...


class ChatSettings(_Base):
    """The open chat's settings, Up's recall and its unsent text, for a Conversation."""

    host: EngineHost
    archive: Archive
    private: bool
    prompt: PromptArea
    queued: list[UserMessage]
    sampling: ChatSampling
    chat_system_prompt: str | None
    editing_prompt: OpenEdit | None
    _chat: ChatRef | None
    _recall_mark: int
    _private_text: str | None

    def forget_prompts(self, prompts: Iterable[str], still_saved: Iterable[str] = ()) -> None:
        """A deleted chat's ``prompts`` leave Up's recall, but for those another chat still holds
        (``still_saved``: the history's recent prompts after the delete). Up recalled a deleted
        chat's prompts until the next start (a hostile tester's)."""
        gone = set(prompts) - set(still_saved)
        if gone:
            # a private chat's own prompts (after the mark) stay as they are; the saved ones before
            # it lose the deleted, and the mark follows what is left of them
            mark = self._recall_mark if self.private else len(self.prompt.prompts)
            before, after = self.prompt.prompts[:mark], self.prompt.prompts[mark:]
            self.prompt.set_history(p for p in before if p not in gone)
            self._recall_mark = len(self.prompt.prompts)
            self.prompt.prompts.extend(after)

    def settings_lines(self) -> list[str]:
        """The chat's own sampling and system prompt, one line each, for an export at quit."""
        label = self.sampling.label(self.host.profile)
        lines = [f"Sampling: {label}"] if label else []
        if self.chat_system_prompt:
            lines.append("System prompt: " + " ".join(self.chat_system_prompt.split()))
        return lines

    def _save_setting(self, name: Setting) -> None:
        """Save the open chat's setting ``name`` through the saver; a private chat's never."""
        if self._chat is not None and not self.private:
            self.archive.save_setting(self._chat, name)

    def set_system_prompt(self, value: str) -> None:
        """The chat's system prompt; the profile's own text (or nothing) follows the profile."""
        profile = self.host.profile
        value = value.strip()
        self.chat_system_prompt = None if value == ((profile.system_prompt if profile else None) or "") else value
        if self._chat is not None:  # saved with the chat, or when the saver creates it
            self._chat.system_prompt = self.chat_system_prompt
            self._save_setting("system_prompt")
        notice(self, "System prompt set." if value else "No system prompt for this chat.")

    def set_sampling(self, sampling: ChatSampling, *, save: bool = True) -> None:
        """The chat's own sampling, from the next reply on; shown on the prompt box's border
        and (``save``) saved with the chat, or with it once the saver creates it."""
        self.sampling = sampling
        self.prompt.border_subtitle = sampling.label(self.host.profile)
        if save and self._chat is not None:
            self._chat.sampling = sampling.to_dict()
            self._save_setting("sampling")

    def profile_changed(self, name: str) -> None:
        """A new profile is loaded: the chat continues with it (and its sampling over the profile's)."""
        self.set_sampling(self.sampling, save=False)
        if self._chat is not None and self._chat.profile != name:  # the same again (a reload) is no change:
            self._chat.profile = name  # saved each time, it read as "1 chat setting not saved" under a lock
            self._save_setting("profile")

    def unsent_text(self) -> str:
        """What was typed and has not gone out: prompts waiting behind a reply or a load, then
        the box's text, as :meth:`drop_queued` would put them back in the box (ctrl+q lost the
        waiting ones: neither saved nor kept for the next start). Text typed in a private chat
        and carried out of it unedited is left out. An edit of the last prompt (ctrl+g) still open
        comes first."""
        box = self.prompt.text if self.prompt.text != self._private_text else ""
        edit = self.editing_prompt
        edited = [edit.text] if edit is not None and edit.changed and edit.text.strip() else []
        return "\n".join(edited + [w.text for w in self.queued] + ([box] if box else []))
