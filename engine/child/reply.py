"""A reply's events as :meth:`~engine.child.backend.ProcessBackend.chat` hands them out."""
from __future__ import annotations

from collections.abc import Callable, Iterator

from engine.events import ChatEvent


class Reply(Iterator[ChatEvent]):
    """A reply's events. A generator's ``finally`` runs only once it has started, so a
    reply dropped (or closed) before its first event is let go of here instead: the
    child is stopped and the engine freed for the next :meth:`ProcessBackend.chat`."""

    def __init__(self, events: Iterator[ChatEvent], abandon: Callable[[], None]) -> None:
        self._events = events
        self._abandon: Callable[[], None] | None = abandon  # until the first event is asked for

    def __next__(self) -> ChatEvent:
        self._abandon = None  # from here the generator's own finally cleans up
        return next(self._events)

    def close(self) -> None:
        abandon, self._abandon = self._abandon, None
        if abandon is not None:
            abandon()
        else:
            self._events.close()  # type: ignore[attr-defined]

    def __del__(self) -> None:
        self.close()
