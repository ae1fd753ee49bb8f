"""Messages posted from worker threads to the UI.

Workers never touch widgets: they post one of these to the app
(``App.post_message`` is thread-safe) and the handlers on the UI thread update
the screen. ``reply_id`` lets the app drop messages of a reply it has already
moved on from (new chat, reopened chat).
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from textual.message import Message

from engine.api import ChatBackend
from engine.events import ChatEvent, FinishReason, ReplyStats

if TYPE_CHECKING:
    from engine.config.profiles import ModelProfile


class LoadProgress(Message):
    """A loading stage and its fraction done (None when unknown)."""

    def __init__(self, stage: str, fraction: float | None) -> None:
        super().__init__()
        self.stage = stage
        self.fraction = fraction


class EngineReady(Message):
    """A backend finished loading for ``profile``."""

    def __init__(self, backend: ChatBackend, profile: "ModelProfile") -> None:
        super().__init__()
        self.backend = backend
        self.profile = profile


class EngineEnded(Message):
    """The engine's process ``backend`` has ended (killed, crashed, or closed by the app)."""

    def __init__(self, backend: ChatBackend) -> None:
        super().__init__()
        self.backend = backend


class EngineFailed(Message):
    """Loading failed; ``error`` is the message to show the user.

    ``restored`` is the backend and profile still (or again) loaded after a failed
    switch, so the app keeps a model; None when there is none. ``stopped``: the user
    stopped the load (Esc), nothing went wrong.
    """

    def __init__(self, error: str, profile_name: str | None,
                 restored: "tuple[ChatBackend, ModelProfile] | None" = None, *, stopped: bool = False) -> None:
        super().__init__()
        self.error = error
        self.profile_name = profile_name
        self.restored = restored
        self.stopped = stopped


class ReplyChunk(Message):
    """Rounds of the reply ``reply_id`` wait in ``outbox`` (posted once until the UI takes them).

    Rounds are not posted one message each: a fast engine would make the UI
    render every round. The UI takes everything waiting in one go, so rounds
    coalesce whenever it is busy.
    """

    def __init__(self, reply_id: int, outbox: "Outbox") -> None:
        super().__init__()
        self.reply_id = reply_id
        self.outbox = outbox


class Outbox:
    """Rounds a reply worker has produced and the UI has not shown yet (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: list[ChatEvent] = []
        self._waiting = False

    def put(self, event: ChatEvent) -> bool:
        """Add a round; True when the UI must be told (nothing was waiting for it)."""
        with self._lock:
            self._events.append(event)
            if self._waiting:
                return False
            self._waiting = True
            return True

    def take(self) -> list[ChatEvent]:
        """Every round waiting, oldest first; the next ``put`` tells the UI again."""
        with self._lock:
            events, self._events = self._events, []
            self._waiting = False
            return events


class ReplyFinished(Message):
    """The reply ``reply_id`` ended (normally, stopped, or with ``error``). Handled by the
    conversation, then by the App (it bubbles)."""

    def __init__(
        self,
        reply_id: int,
        finish_reason: FinishReason,
        stats: ReplyStats | None,
        error: str | None = None,
        engine_died: bool = False,
    ) -> None:
        super().__init__()
        self.reply_id = reply_id
        self.finish_reason = finish_reason
        self.stats = stats
        self.error = error
        self.engine_died = engine_died
        """The engine's process ended under the reply (the App loads the profile again)."""
