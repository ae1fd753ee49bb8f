"""One reply being written: its worker's loop, and the state the UI keeps of it.

The worker (:func:`stream_reply`, run in a thread) holds the engine host's lock
while it iterates ``backend.chat`` (so a profile switch closes the backend only
after the reply stopped), hands the reply's state to the archive's saver after
every round (it writes in the background and keeps unsaved rounds while the
database is locked), and leaves each round in the reply's :class:`Outbox`,
posting a :class:`ReplyChunk` when the UI must look. Esc sets ``cancel``; the
engine stops between rounds and the partial reply stays.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from textual.message import Message

from app.store.pieces import Pieces, extend_pieces, piece_runs
from app.store.saver import HistorySaver
from app.store.pending import ReplyRecord, stats_dict
from app.ui.formatting import with_failure
from app.ui.collector import StreamingCollector
from app.ui.messages import Outbox, ReplyChunk, ReplyFinished
from app.ui.pacing import PaintPacer
from app.ui.widgets.chat_view import AssistantMessage
from engine.api import ChatBackend
from engine.errors import EngineClosedError, EngineDiedError, SpecChatError
from engine.events import ChatMessage, FinishReason, GenerationParams, ReplyStats


class ReplyStream:
    """The reply the UI is showing: which one (``reply_id``), its widget, its cancel
    event and outbox, and when to paint next. A new reply, or a reset, moves
    ``reply_id`` on, so late messages of an earlier reply are dropped."""

    def __init__(self) -> None:
        self.reply_id = 0
        self.widget: AssistantMessage | None = None
        self.cancel: threading.Event | None = None
        self.outbox = Outbox()
        self.pacer = PaintPacer()
        """When the next rounds of the streaming reply are painted (app.ui.pacing)."""
        self.collector = StreamingCollector()
        """The heap is frozen while a reply streams (app.ui.collector)."""

    def begin(self, widget: AssistantMessage) -> None:
        """A reply starts, shown in ``widget``."""
        self.reply_id += 1
        self.widget = widget
        self.cancel = threading.Event()
        self.outbox = Outbox()
        self.pacer.start()
        self.collector.reply_started()

    def is_current(self, reply_id: int) -> bool:
        return reply_id == self.reply_id and self.widget is not None

    @property
    def stopping(self) -> bool:
        """A reply streams and was asked to stop (Esc): its end is on its way."""
        return self.cancel is not None and self.cancel.is_set()

    def stop(self) -> None:
        """Ask the engine to stop after the current round (safe from any thread)."""
        if self.cancel is not None:
            self.cancel.set()

    def end(self) -> AssistantMessage | None:
        """The reply is over; answers its widget."""
        widget, self.widget, self.cancel = self.widget, None, None
        return widget

    def forget(self) -> None:
        """Stop the reply and drop whatever it still sends (a new or reopened chat)."""
        self.stop()
        self.reply_id += 1
        self.end()
        self.collector.reply_over()  # its ReplyFinished will be dropped: collect now


@dataclass(frozen=True)
class ReplyJob:
    """Everything the worker needs, taken on the UI thread when the reply starts."""

    reply_id: int
    backend: ChatBackend
    lock: threading.Lock
    messages: list[ChatMessage]
    params: GenerationParams
    cancel: threading.Event
    outbox: Outbox
    saver: HistorySaver | None
    record: ReplyRecord | None


def stream_reply(job: ReplyJob, post: Callable[[Message], Any]) -> None:
    """Run the reply to its end, posting :class:`ReplyChunk` as rounds wait and
    :class:`ReplyFinished` last. Never raises: a failure is the reply's ``error``."""
    text = ""
    pieces: Pieces = []
    stats: ReplyStats | None = None
    finish: FinishReason | None = None
    error: str | None = None
    died = False

    def save(final: FinishReason | None) -> None:
        # Handing over is cheap: the saver thread coalesces rounds and writes at most
        # every app.ui.archive.WRITE_EVERY_S, always ending with the final state. The stats
        # go as they are (frozen): turned into a dict only when written, not every round
        # (33 us a round, 190 rounds a second on pocket here).
        if job.saver is not None and job.record is not None:
            job.saver.update(job.record, text, pieces, with_failure(stats_dict(stats), error) if error else stats,
                             final)

    with job.lock:
        try:
            for event in job.backend.chat(job.messages, job.params, job.cancel):
                text += event.text
                extend_pieces(pieces, piece_runs(event.pieces))
                stats = event.stats
                finish = event.finish_reason or finish
                save(None)
                if job.outbox.put(event):
                    post(ReplyChunk(job.reply_id, job.outbox))
        except EngineClosedError:  # the app closes: the reply stops as the quit asked, the engine did not fail
            finish = "cancelled"
        except SpecChatError as exc:
            error, finish, died = str(exc), "error", isinstance(exc, EngineDiedError)
        except Exception as exc:  # shown as a notice, never a traceback
            error, finish = f"{type(exc).__name__}: {exc}", "error"
    if finish is None or (job.cancel.is_set() and finish == "stop"):
        finish = "cancelled" if job.cancel.is_set() else "stop"
    save(finish)
    post(ReplyFinished(job.reply_id, finish, stats, error, died))
