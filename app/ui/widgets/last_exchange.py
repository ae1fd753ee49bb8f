"""The last exchange again: ctrl+r answers the last prompt anew, ctrl+g asks an edited one in its place.

Both keep the earlier exchange on screen, dimmed, and in the history. A mixin of
:class:`~app.ui.widgets.conversation.Conversation`, which owns the state named below.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from textual.widget import Widget

from app.ui.notices import notice
from app.ui.requests import generation_params
from app.ui.widgets.chat_view import AssistantMessage, UserMessage
from app.ui.widgets.transcript import last_exchange

if TYPE_CHECKING:
    from app.ui.engine_host import EngineHost
    from app.ui.reply_stream import ReplyStream
    from app.ui.sampling import ChatSampling
    from app.ui.widgets.chat_log import ChatLog
    from app.ui.widgets.prompt import PromptArea

# A plain mixin at run time, as ReplyPainting is (app.ui.widgets.reply_painting says why).
_Base = Widget if TYPE_CHECKING else object


class SendsPrompts(Protocol):
    def __call__(self, text: str, shown: Widget | None = None, answers: UserMessage | None = None,
                 supersedes: UserMessage | None = None) -> None: ...


class LastExchange(_Base):
    """ctrl+r and ctrl+g for a Conversation."""

    host: EngineHost
    sampling: ChatSampling
    generating: bool
    queued: list[UserMessage]
    chat_log: ChatLog
    prompt: PromptArea
    send_prompt: SendsPrompts
    _greedy_said: bool
    stream: ReplyStream
    after_reply: list[Callable[[], None]]

    def when_free(self, action: Callable[[], None], what: str, *, load_too: bool = True) -> bool:
        """Run ``action`` (``what`` the key does) once the reply being stopped has ended or (``load_too``)
        the profile being loaded is ready, as a prompt sent meanwhile waits; False (nothing kept) when
        neither is under way. Keys are taken in the order typed: Esc then ctrl+r was refused with "press Esc to
        stop it" while the stop was on its way, and ctrl+r during a switch said "No model is loaded
        yet" (a hostile tester's)."""
        if load_too and self.host.loading and self.host.profile is not None and not self.queued:
            notice(self, f"{what} once {self.host.profile.name} is ready.")
        elif not (self.generating and self.stream.stopping and not self.queued):
            return False
        self.after_reply.append(action)
        return True

    def run_after_reply(self) -> None:
        """The reply ended, or the model is ready: what :meth:`when_free` kept, in order, before any
        prompt queued after it. Kept while the engine is dead (a reply that died under the stop: the
        reload that follows runs them, not the dead engine); once one starts a reply, the rest (the
        same key again) are dropped, as they would have been refused."""
        if self.generating or self.host.loading or not self.host.backend_alive:
            return
        waiting, self.after_reply = self.after_reply, []
        for action in waiting:
            if self.generating:
                break
            action()

    def last_exchange(self) -> tuple[UserMessage, AssistantMessage | None] | None:
        """The last prompt on screen and its reply; None (with a notice) while a reply
        streams or a prompt waits, or when there is no prompt yet."""
        if self.generating or self.queued:
            notice(self, "Wait for the reply to finish (or press Esc to stop it).", severity="warning")
            return None
        last = last_exchange(self.chat_log.transcript())
        if last is None:
            notice(self, "No prompt yet.", severity="warning")
        return last

    def regenerate(self) -> None:
        """Answer the last prompt again; the earlier reply stays (dimmed) and in the history."""
        if self.when_free(self.regenerate, "ctrl+r answers again"):
            return
        last = self.last_exchange()
        if last is None:
            return
        if self.host.backend is None:
            notice(self, "No model is loaded yet.", severity="warning")
            return
        user, reply = last
        if reply is not None:
            reply.set_superseded()
        profile = self.host.profile
        if profile is not None and generation_params(profile, sampling=self.sampling).sampling.greedy \
                and not self._greedy_said:
            self._greedy_said = True  # once a session: an ollama user expects another answer from ctrl+r
            notice(self, "Temperature 0 (greedy) writes the same reply again; F10 sets a temperature for "
                         "this chat.")
        self.send_prompt(user.text, shown=reply or user, answers=user)

    def ask_edited(self, user: UserMessage, reply: AssistantMessage | None, text: str) -> None:
        """Ask ``text`` in place of the prompt ``user``; the earlier exchange stays (dimmed)."""
        if self.generating or self.host.backend is None:
            self.prompt.restore(text)
            notice(self, "The model is busy: your edited prompt is back in the box.", severity="warning")
            return
        user.set_superseded()
        if reply is not None:
            reply.set_superseded()
        self.send_prompt(text.strip("\n"), supersedes=user)


