"""Keys wait, in order, while a dialog finishes answering (see :mod:`app.ui.screens.dialog`).

The app reads a key and hands it to the focused widget's own queue, so a key is
read before the widgets have handled the keys read ahead of it. When Enter
answers a dialog, the answer must come from the dialog's input *after* it has
taken the keys typed before Enter, and the keys typed after Enter must reach
whatever is focused once the dialog is gone. So from Enter until the answer the
app keeps the keys it reads here, and then dispatches them in the order read.

A hold is released by its owner, or after ``max_s`` whatever happens, so a
dialog that fails to answer cannot swallow the keyboard.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable

from textual import events

HOLD_MAX_S = 1.0
"""The longest a hold lasts if its owner never releases it (seconds)."""


class KeyHold:
    """The app's held keys. ``dispatch`` handles one key as the app would have;
    ``schedule`` runs a coroutine function soon on the app's own loop (``App.call_later``)."""

    def __init__(self, dispatch: Callable[[events.Key], Awaitable[None]],
                 schedule: Callable[[Callable[[], Awaitable[None]]], object],
                 timer: Callable[[float, Callable[[], None]], object]) -> None:
        self._dispatch = dispatch
        self._schedule = schedule
        self._timer = timer
        self._holds = 0
        self._keys: deque[events.Key] = deque()

    @property
    def held(self) -> int:
        """How many keys wait."""
        return len(self._keys)

    def take(self, key: events.Key) -> bool:
        """Keep ``key`` if a hold is on, or keys still wait (they go first); False: dispatch it now."""
        if not self._holds and not self._keys:
            return False
        self._keys.append(key)
        return True

    def hold(self, max_s: float = HOLD_MAX_S) -> Callable[[], None]:
        """Start a hold; returns its release (safe to call more than once)."""
        self._holds += 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            self._holds -= 1
            if not self._holds:
                self._schedule(self._replay)

        self._timer(max_s, release)
        return release

    async def _replay(self) -> None:
        # A replayed key may start a new hold (Enter in the next dialog): the rest wait for it.
        while self._keys and not self._holds:
            await self._dispatch(self._keys.popleft())
