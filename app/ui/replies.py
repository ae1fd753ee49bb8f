"""Sending a prompt and streaming the reply: the worker thread and its UI handlers.

The worker holds the backend lock while it iterates ``backend.chat`` (so a
profile switch closes the backend only after the reply stopped), hands the
reply's state to the app's :class:`app.store.saver.HistorySaver` after every round
(it writes in the background and keeps unsaved rounds while the database is
locked), and posts each round to the UI. Esc sets the
``cancel`` event; the engine stops between rounds and the partial reply stays.
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from textual import work
from textual.widget import Widget

from app.ui.conversation import build_messages, chat_title, generation_params
from app.store.pieces import Pieces, extend_pieces
from app.ui.messages import Outbox, ReplyChunk, ReplyFinished
from app.ui.pacing import PaintPacer
from app.store.saver import HistoryLag, HistorySaver, ReplyRecord
from app.ui.widgets.chat_view import AssistantMessage, UserMessage
from app.ui.widgets.prompt import PromptArea
from engine.api import ChatBackend
from engine.errors import SpecChatError
from engine.events import ChatMessage, FinishReason, GenerationParams, Stats

if TYPE_CHECKING:
    from app.ui.app import SpecChatApp

WRITE_EVERY_S = 0.1
"""Minimum time between two history writes of a streaming reply. A SQLite write
per round (and the JSON of every piece so far) competed with the engine for the
same cores; a round still reaches the disk within this time."""

SAVE_FLUSH_AT_EXIT_S = 10.0
"""How long quitting waits for a locked history to take the last reply."""


class ReplyMixin:
    """Prompt → worker → streamed reply. Mixed into :class:`app.ui.app.SpecChatApp`."""

    def init_reply_state(self) -> None:
        self._reply_id = 0
        self._cancel: threading.Event | None = None
        self._reply_widget: AssistantMessage | None = None
        self._outbox = Outbox()
        self.pacer = PaintPacer()
        """When the next rounds of the streaming reply are painted (app.ui.pacing)."""
        self.queued: list[UserMessage] = []
        """Prompts sent while the model loads or a reply streams, sent in turn when it is free."""
        self.saver: HistorySaver | None = None  # made on mount, once the history is open

    def on_prompt_area_submitted(self: "SpecChatApp", event: PromptArea.Submitted) -> None:
        """Enter in the prompt box: send now, or queue while the model loads or a reply streams."""
        text = event.text.strip("\n")
        event.prompt.remember(text)
        if self.backend is None and not self.loading:
            event.prompt.restore(text)
            self.notice("No model is loaded: press F2 to pick a profile.", severity="warning")
            return
        if self.loading or self.generating or self.queued:
            self.queue_prompt(text)
            return
        self.send_prompt(text)

    def queue_prompt(self: "SpecChatApp", text: str) -> None:
        """Show the prompt as waiting; it goes out when the model is free (:meth:`send_queued`)."""
        widget = UserMessage(text)
        widget.set_waiting("waiting for the model to load" if self.loading else "waiting for the reply above")
        self.queued.append(widget)
        self.hide_welcome()
        self.chat_log.mount(widget)
        self.chat_log.follow()

    def send_queued(self: "SpecChatApp") -> None:
        """Send the oldest waiting prompt, if the model is free."""
        if self.queued and self.backend is not None and not self.loading and not self.generating:
            widget = self.queued.pop(0)
            widget.set_waiting(None)
            self.send_prompt(widget.text, shown=widget)

    def drop_queued(self: "SpecChatApp") -> list[str]:
        """Take every waiting prompt off the transcript; returns their texts."""
        texts = [w.text for w in self.queued]
        for widget in self.queued:
            widget.remove()
        self.queued = []
        return texts

    def send_prompt(self: "SpecChatApp", text: str, shown: Widget | None = None,
                    answers: UserMessage | None = None, supersedes: UserMessage | None = None) -> None:
        """Show and save the prompt, then start the reply worker.

        ``shown``: the reply goes right after this widget (a queued prompt, or the
        reply being regenerated); ``answers``: the prompt on screen (and saved)
        that this reply answers again, so it is not saved twice; ``supersedes``:
        the prompt an edited one replaces (its exchange is saved as replaced).
        """
        assert self.backend is not None and self.profile is not None
        profile_name = self.profile.name
        chat = self.ensure_chat(chat_title(text))
        self.turns.append(ChatMessage("user", text))
        user_id = answers.saved_id() if answers is not None else None
        earlier = None if supersedes is None else (
            supersedes.message_id if supersedes.message_id is not None else supersedes.record)
        record = self.saver.start_reply(chat, text, profile_name, user_id, earlier) if self.saver is not None else None
        self.hide_welcome()
        reply = AssistantMessage(profile_name, show_sources=self.show_sources)
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
        self._reply_widget = reply
        self._reply_id += 1
        self._cancel = threading.Event()
        self._outbox = Outbox()
        self.pacer.start()
        self.generating = True
        self.hud.start_reply()
        messages = build_messages(self.system_prompt, self.turns)
        self._reply_worker(self._reply_id, self.backend, messages, generation_params(self.profile),
                           self._cancel, record, self._outbox)

    def stop_reply(self: "SpecChatApp") -> None:
        """Ask the engine to stop after the current round (Esc)."""
        if self._cancel is not None:
            self._cancel.set()

    @work(thread=True, group="reply", exit_on_error=False)
    def _reply_worker(
        self: "SpecChatApp",
        reply_id: int,
        backend: ChatBackend,
        messages: list[ChatMessage],
        params: GenerationParams,
        cancel: threading.Event,
        record: ReplyRecord | None,
        outbox: Outbox,
    ) -> None:
        text = ""
        pieces: Pieces = []
        stats: Stats | None = None
        finish: FinishReason | None = None
        error: str | None = None
        saver = _Saver(self.saver, record)
        with self._backend_lock:
            try:
                for event in backend.chat(messages, params, cancel):
                    text += event.text
                    extend_pieces(pieces, ((p.text, p.source) for p in event.pieces))
                    stats = event.stats
                    finish = event.finish_reason or finish
                    saver.save(text, pieces, stats, None)
                    if outbox.put(event):
                        self.post_message(ReplyChunk(reply_id, outbox))
            except SpecChatError as exc:
                error, finish = str(exc), "error"
            except Exception as exc:  # shown as a notice, never a traceback
                error, finish = f"{type(exc).__name__}: {exc}", "error"
        if finish is None or (cancel.is_set() and finish == "stop"):
            finish = "cancelled" if cancel.is_set() else "stop"
        saver.save(text, pieces, stats, finish)
        self.post_message(ReplyFinished(reply_id, finish, stats, error))

    async def on_reply_chunk(self: "SpecChatApp", message: ReplyChunk) -> None:
        """Rounds are waiting: show them now, or when the pacer allows the next paint."""
        if message.reply_id != self._reply_id:
            return
        wait = self.pacer.wait()
        if wait > 0:
            self.set_timer(wait, lambda: self._paint_rounds(message.reply_id, message.outbox))
        else:
            await self._paint_rounds(message.reply_id, message.outbox)

    async def _paint_rounds(self: "SpecChatApp", reply_id: int, outbox: Outbox) -> None:
        """Append every waiting round to the reply at once; the HUD sees each round's statistics."""
        events = outbox.take()
        if reply_id != self._reply_id or self._reply_widget is None or not events or not self.screen_stack:
            return  # a later reply, or the app is closing (a paint timer may still fire)
        self.pacer.painting()
        text = "".join(e.text for e in events)
        hud = self.hud
        with self.batch_update():  # the reply and the HUD in one layout of the screen
            await self._reply_widget.append(text, [(p.text, p.source) for e in events for p in e.pieces])
            for event in events:
                hud.set_stats(event.stats, live=True)
                if event.notice:
                    hud.set_notice(event.notice)
                    self.notice(event.notice, severity="warning", title="Engine")
            hud.flush()

    def on_history_lag(self: "SpecChatApp", message: HistoryLag) -> None:
        """The saver is behind (a lock elsewhere) or has caught up: say so."""
        if message.notice is not None:
            self.notice(message.notice, severity="warning", title="History not saved yet", timeout=30)
        else:
            self.notice("The history database is free again: everything is saved.", title="History saved")

    async def on_reply_finished(self: "SpecChatApp", message: ReplyFinished) -> None:
        if message.reply_id != self._reply_id or not self.screen_stack:
            return  # a stale reply, or the app closed its screens (the saver has the reply)
        await self._paint_rounds(message.reply_id, self._outbox)  # rounds still waiting for a paint slot
        widget, self._reply_widget = self._reply_widget, None
        self._cancel = None
        self.generating = False
        stats_dict = message.stats.to_dict() if message.stats else None
        if widget is not None:
            await widget.finish(message.finish_reason, stats_dict)
            if widget.text:
                self.turns.append(ChatMessage("assistant", widget.text))
        if message.stats is not None:
            self.hud.set_stats(message.stats, live=False)
        if self.backend is not None:
            self.hud.set_engine(self.backend.info, self.profile)
        self.hud.live = False
        self.hud.flush()
        if message.error:
            self.notice(message.error, severity="error", title="Generation failed")
        if len(self.screen_stack) == 1 and self.focused is None:
            self.prompt.focus()
        self.send_queued()


class _Saver:
    """Hands the streaming reply's state to the app's saver every round: handing over is
    cheap, and the saver thread coalesces rounds and writes at most every
    :data:`WRITE_EVERY_S`, always ending with the final state."""

    def __init__(self, saver: HistorySaver | None, record: ReplyRecord | None) -> None:
        self._saver = saver
        self._record = record

    def save(self, text: str, pieces: Pieces, stats: Stats | None, finish: str | None) -> None:
        if self._saver is None or self._record is None:
            return
        stats_dict: dict[str, Any] | None = stats.to_dict() if stats else None
        self._saver.update(self._record, text, pieces, stats_dict, finish)
