"""The Conversation widget: one chat, its transcript, the prompt box, the HUD and the reply stream.

It owns everything about the chat on screen: the message widgets (the one source of
the turns the model sees, :func:`app.ui.requests.turns_from`), the prompts waiting
their turn, the reply being written (:class:`app.ui.reply_stream.ReplyStream`) and
the saved chat it belongs to. The App owns the engine host and the archive and
hands them in; it opens every dialog and calls the methods here with the answer.

A token's way to the screen: the engine's ``ChatEvent`` → :func:`stream_reply`
(worker thread) → :class:`Outbox` → :meth:`ReplyPainting.on_reply_chunk` →
:meth:`AssistantMessage.append` and the HUD (:mod:`app.ui.widgets.reply_painting`).
"""
from __future__ import annotations

import asyncio

from collections.abc import Callable
from functools import partial

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.timer import Timer
from textual.widget import Widget
from textual.widgets import Static

from app.store.history import ChatRecord
from app.store.pending import ChatRef
from app.ui.archive import Archive
from app.ui.engine_host import EngineHost
from app.ui.labels import chat_title, shown_title
from app.ui.notices import notice
from app.ui.reply_stream import ReplyJob, ReplyStream, stream_reply
from app.ui.requests import build_messages, generation_params, turns_from
from app.ui.sampling import ChatSampling
from app.ui.widgets.chat_log import ChatLog
from app.ui.widgets.chat_view import AssistantMessage, UserMessage
from app.ui.widgets.hud import Hud
from app.ui.widgets.hud_line import HUD_MIN_WIDTH
from app.ui.widgets.chat_settings import ChatSettings, OpenEdit
from app.ui.widgets.last_exchange import LastExchange
from app.ui.widgets.reply_painting import ReplyPainting
from app.ui.widgets.prompt import LOADING_PLACEHOLDER, NO_MODEL_PLACEHOLDER, PLACEHOLDER, PromptArea
from app.ui.widgets.transcript import copyable, messages_of, widgets_for
from engine.events import ChatMessage

HUD_REFRESH_S = 0.25
LEFT_REPLY_WAIT_S = 1.0
"""How long opening a chat waits for the saver to write the reply it was left with (ctrl+n mid-reply, then F3)."""

WELCOME = (
    "Ask anything. [b]Enter[/b] sends, [b]ctrl+j[/b] adds a line, [b]Esc[/b] stops a reply.\n"
    "[b]F4[/b] colours tokens by source · [b]F2[/b] switches profile · [b]F3[/b] past chats · [b]F1[/b] help"
)
PRIVATE = ("[b]Private chat[/b]: it is not saved to the history, and no later chat is drafted from it. "
           "It ends with the next new chat or when the app closes.")


class Conversation(ChatSettings, LastExchange, ReplyPainting, Horizontal):
    """One chat: the transcript and prompt box on the left, the HUD on the right."""

    generating: reactive[bool] = reactive(False, bindings=True)
    show_sources: reactive[bool] = reactive(False)
    hud_folded: bool | None = None
    """None: folded to one line below HUD_MIN_WIDTH columns; True/False: the user's choice (F6)."""

    def __init__(self, host: EngineHost, archive: Archive, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.host = host
        self.archive = archive
        self.stream = ReplyStream()
        self.queued: list[UserMessage] = []
        """Prompts sent while the model loads or a reply streams, sent in turn when it is free."""
        self._chat: ChatRef | None = None
        self.before_send: Callable[[], None] = lambda: None
        """Called as a prompt goes out (the App checks that the drafter's earlier chats still exist)."""
        self.editing_prompt: OpenEdit | None = None
        """ctrl+g's dialog while it is open: its text is unsent (:meth:`unsent_text`)."""
        self.chat_system_prompt: str | None = None
        """The chat's own system prompt; None follows the profile's."""
        self.sampling = ChatSampling()
        """The chat's own temperature, top-p, top-k and seed over the profile's (app.ui.sampling)."""
        self.private = False
        """A private chat: nothing of it is saved, and the engine is told not to learn from
        its replies (``GenerationParams.private``), so no later chat is drafted from it."""
        self._private_text: str | None = None
        """The box's text as a private chat was left (carried into the next chat): never kept for
        the next start unless edited since, as a private chat's text is never written down."""
        self._recall_mark = 0
        """How many prompts Up recalled when the private chat began: its own go when it ends."""
        self._hud_timer: Timer | None = None
        """Flushes the HUD every HUD_REFRESH_S; paused while a reply streams (its paints flush it)."""
        self._greedy_said = False
        """ctrl+r's word on greedy decoding (the same reply again) was said this session."""
        self.after_reply: list[Callable[[], None]] = []
        """ctrl+r or ctrl+g pressed while Esc's stop or a load was on its way: run once it is over."""
        self._prompt = PromptArea(id="prompt", placeholder=PLACEHOLDER)
        """The prompt box, held: its text can still be read as the app closes, once unmounted."""

    def compose(self) -> ComposeResult:
        with Vertical(id="chat-column"):
            yield ChatLog(id="chat-log")
            yield self._prompt
        yield Hud(id="hud")

    @property
    def chat_log(self) -> ChatLog:
        return self.query_one(ChatLog)

    @property
    def prompt(self) -> PromptArea:
        return self._prompt

    @property
    def hud(self) -> Hud:
        return self.query_one(Hud)

    def on_mount(self) -> None:
        self.show_welcome()
        self.prompt.scroll_target = lambda: self.chat_log
        self.prompt.focus()
        self._hud_timer = self.set_interval(HUD_REFRESH_S, self.hud.flush)

    def watch_generating(self, generating: bool) -> None:
        """While a reply streams, its paints flush the HUD and the prompt's cursor stays lit: no
        timer of the UI's own wakes it between paints (on 2 cores each wake-up takes a moment
        from one of the engine's threads while the other waits; docs/performance.md)."""
        if self._hud_timer is None:  # not mounted yet
            return
        if generating:
            self._hud_timer.pause()
        else:
            self._hud_timer.resume()
        self.prompt.cursor_blink = not generating

    def start(self, recent_prompts: list[str]) -> None:
        """The archive is open: Up in the empty box recalls ``recent_prompts``."""
        self.prompt.set_history(recent_prompts)

    # -- the chat --------------------------------------------------------------------

    @property
    def chat_ref(self) -> ChatRef | None:
        """The chat on screen as the saver knows it (its id may not be set yet)."""
        return self._chat

    @property
    def title(self) -> str | None:
        """The chat's title (its first prompt's first line, or as renamed); None before a prompt."""
        return self._chat.title if self._chat is not None else None

    def retitle(self, chat_id: int, title: str) -> bool:
        """Chat ``chat_id`` was renamed; answers whether it is this one (its header then follows)."""
        if self._chat is None or chat_id != self._chat.id:
            return False
        self._chat.title = title
        return True

    @property
    def chat_id(self) -> int | None:
        """The saved chat's id; None before the saver wrote its first row."""
        return self._chat.id if self._chat is not None else None

    @property
    def system_prompt(self) -> str | None:
        """The system prompt sent first each turn."""
        if self.chat_system_prompt is not None:
            return self.chat_system_prompt or None
        profile = self.host.profile
        return profile.system_prompt if profile is not None else None

    def turns(self) -> list[ChatMessage]:
        """The turns the model sees, read off the transcript."""
        return turns_from(messages_of(self.chat_log.transcript()))

    def messages(self) -> list[tuple[str, str]]:
        """``(role, text)`` of every prompt and reply on screen."""
        return copyable(self.chat_log.transcript())

    def show_welcome(self) -> None:
        if not self.chat_log.query("#welcome"):
            self.chat_log.mount(Static(f"{PRIVATE}\n{WELCOME}" if self.private else WELCOME, id="welcome"))

    def hide_welcome(self) -> None:
        self.chat_log.query("#welcome").remove()

    async def _reset(self, reply_kept: bool = True) -> None:
        """Empty the transcript; prompts that never went out return to the box, not lost.
        Leaving a private chat, its prompts leave Up's recall; any that return to the box
        are said to, since sending them now puts them in the next chat. A reply still streaming
        is stopped, and said to be (it stopped without a word: a hostile tester's)."""
        if self.generating:  # ``reply_kept`` False: the chat was deleted, its reply with it
            notice(self, "Stopped the reply to leave the chat; it is saved as far as it got."
                   if reply_kept and not self.private else "Stopped the reply.")
        self.stream.forget()
        self.after_reply = []  # they were for the chat left
        self.generating = False
        waiting, self.queued = [w.text for w in self.queued], []
        await self.chat_log.clear()
        if self.private:
            self.prompt.set_history(self.prompt.prompts[:self._recall_mark])
        if waiting:
            self.prompt.restore("\n".join(waiting))
            if self.private:
                notice(self, "The private chat's unsent prompts are back in the box: sent now, they go "
                             "into the new chat.", severity="warning")
        self._private_text = self.prompt.text if self.private and self.prompt.text else None
        self.hud.set_seen_sources(())
        self.hud.clear_reply()  # the figures were the chat left's (a new user read them as the new one's)
        self.hud.flush()

    async def new_chat(self, private: bool = False, said: str | None = None, reply_kept: bool = True) -> None:
        """Start an empty conversation (the saved one stays in the history); a ``private``
        one is never saved and teaches the drafter nothing. ``said``: the notice, instead of
        "New chat."."""
        await self._reset(reply_kept)
        self._chat = None
        self.archive.open_chats.show(None)
        self.chat_system_prompt = None
        self.set_sampling(ChatSampling(), save=False)
        self.private = private
        self._recall_mark = len(self.prompt.prompts)
        self.show_welcome()
        notice(self, said or ("New private chat: not saved, not learned from." if private else "New chat."))

    async def open_chat(self, chat_id: int) -> ChatRecord | None:
        """Show a saved chat to continue it; answers its record (None: it is gone, or it is the one
        open, left as it is: opening it again stopped its streaming reply and showed it as never
        saved). A chat just left mid-reply is read once its reply has ended and is written
        (:data:`LEFT_REPLY_WAIT_S` at most)."""
        if chat_id == self.chat_id and not self.private:
            notice(self, "That chat is the one open.")
            return None
        history = self.archive.history
        saver = self.archive.saver
        if saver is not None:  # off the UI's thread: it waits for an engine to end that reply
            await asyncio.to_thread(saver.wait_chat, chat_id, LEFT_REPLY_WAIT_S)
        chat = self.archive.db(history.get_chat, chat_id) if history is not None else None
        records = self.archive.db(history.messages, chat_id) if history is not None else None
        if chat is None or records is None:
            notice(self, "That chat no longer exists.", severity="warning")
            return None
        await self._reset()
        self.private = False
        self._chat = ChatRef(chat.title, chat.profile, chat.system_prompt, chat.sampling, id=chat.id)
        if not self.archive.open_chats.show(chat.id):
            notice(self, f"“{shown_title(chat.title)}” is open in another specchat window too: what each window adds goes into "
                         "it, and neither shows the other's turns (ctrl+n starts a new chat).", severity="warning",
                   title="Open twice")
        self.chat_system_prompt = chat.system_prompt
        self.set_sampling(ChatSampling.from_dict(chat.sampling), save=False)
        widgets = widgets_for(records, self.show_sources)
        if widgets:
            await self.chat_log.show_chat(widgets)  # the newest first; older ones as the user scrolls up
            self.hud.set_seen_sources(self._sources())
        else:
            self.show_welcome()
        self.chat_log.follow()
        return chat

    async def chat_deleted(self, chat_id: int) -> bool:
        """A saved chat was deleted here; if it is this one, a new empty chat takes its place (its
        transcript left on screen was regenerated into a chat of its own, the prompt saved twice).
        Answers whether it was this one."""
        if chat_id != self.chat_id:
            return False
        await self.new_chat(said="Deleted the open chat; this is a new one.", reply_kept=False)
        return True

    def model_state(self, loading: str | None, loaded: bool = True) -> None:
        """The prompt box says what the model is doing: ``loading`` (the profile's name; Enter
        queues meanwhile), else whether a model is ``loaded``."""
        self.prompt.placeholder = (LOADING_PLACEHOLDER.format(name=loading) if loading is not None
                                   else PLACEHOLDER if loaded else NO_MODEL_PLACEHOLDER)
        if loading is not None:
            for waiting in self.queued:
                waiting.set_waiting("waiting for the model to load")

    # -- sending -----------------------------------------------------------------------

    def on_prompt_area_submitted(self, event: PromptArea.Submitted) -> None:
        """Enter in the prompt box: send now, or queue while the model loads or a reply streams."""
        text = event.text.strip("\n")
        event.prompt.remember(text)
        if self.host.backend is None and not self.host.loading:
            event.prompt.restore(text)
            notice(self, "No model is loaded: press F2 to pick a profile.", severity="warning")
            return
        if self.host.loading or self.generating or self.queued:
            self.queue_prompt(text)
            return
        self.send_prompt(text)

    def queue_prompt(self, text: str) -> None:
        """Show the prompt as waiting; it goes out when the model is free (:meth:`send_queued`)."""
        widget = UserMessage(text)
        widget.set_waiting("waiting for the model to load" if self.host.loading else "waiting for the reply above")
        self.queued.append(widget)
        self.hide_welcome()
        self.chat_log.mount(widget)
        self.chat_log.follow()

    def send_queued(self) -> None:
        """Send the oldest waiting prompt, if the model is free (an engine that died under the reply
        before is loaded again first: the prompt sent to it failed at once)."""
        if self.queued and self.host.backend_alive and not self.host.loading and not self.generating:
            widget = self.queued.pop(0)
            widget.set_waiting(None)
            self.send_prompt(widget.text, shown=widget)

    def drop_queued(self) -> int:
        """Take every waiting prompt off the transcript and back into the box; answers how many."""
        texts = [w.text for w in self.queued]
        for widget in self.queued:
            widget.remove()
        self.queued = []
        if texts:
            self.prompt.restore("\n".join(texts))
        return len(texts)

    def send_prompt(self, text: str, shown: Widget | None = None,
                    answers: UserMessage | None = None, supersedes: UserMessage | None = None) -> None:
        """Show and save the prompt, then start the reply worker.

        ``shown``: the reply goes right after this widget (a queued prompt, or the
        reply being regenerated); ``answers``: the prompt on screen (and saved)
        that this reply answers again, so it is not saved twice; ``supersedes``:
        the prompt an edited one replaces (its exchange is saved as replaced).
        """
        backend, profile = self.host.backend, self.host.profile
        saver = None if self.private else self.archive.saver
        assert backend is not None and profile is not None
        self.before_send()
        if self._chat is None:  # created in the database by the saver's first write
            self._chat = ChatRef(chat_title(text), profile.name, self.chat_system_prompt, self.sampling.to_dict())
            if not self.private:
                self.app.sub_title = self._chat.title  # the header names the chat, as after a restart
        user_id = answers.saved_id() if answers is not None else None
        earlier = None if supersedes is None else (
            supersedes.message_id if supersedes.message_id is not None else supersedes.record)
        record = saver.start_reply(self._chat, text, profile.name, user_id, earlier) if saver is not None else None
        self.hide_welcome()
        reply = AssistantMessage(profile.name, show_sources=self.show_sources)
        if shown is None:
            user = UserMessage(text)
            user.record = record
            self.chat_log.mount(user)
            self.chat_log.mount(reply)
        else:
            if isinstance(shown, UserMessage) and answers is None:
                shown.record = record
            self.chat_log.mount(reply, after=shown)
        self.chat_log.follow()
        self.stream.begin(reply)
        assert self.stream.cancel is not None
        self.generating = True
        self.hud.start_reply()
        job = ReplyJob(self.stream.reply_id, backend, self.host.lock, build_messages(self.system_prompt, self.turns()),
                       generation_params(profile, private=self.private, sampling=self.sampling), self.stream.cancel,
                       self.stream.outbox, saver, record)
        self.run_worker(partial(stream_reply, job, self.post_message), thread=True, group="reply",
                        exit_on_error=False)

    def stop_reply(self) -> None:
        """Ask the engine to stop after the current round (Esc; safe from any thread)."""
        self.stream.stop()

    # -- the HUD ------------------------------------------------------------------------

    def fit_hud(self, width: int) -> None:
        """Show the side HUD or its one-line form, for ``width`` columns."""
        folded = width < HUD_MIN_WIDTH if self.hud_folded is None else self.hud_folded
        self.hud.set_class(folded, "-line")

    def toggle_hud(self, width: int) -> None:
        self.hud_folded = not self.hud.has_class("-line")
        self.fit_hud(width)

    def watch_show_sources(self, show: bool) -> None:
        for message in messages_of(self.chat_log.transcript()):
            if isinstance(message, AssistantMessage):
                message.set_show_sources(show)
        self.hud.set_class(show, "-legend")
        self.hud.flush(force=True)  # the one-line HUD carries the legend too
