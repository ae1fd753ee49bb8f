"""app.ui.key_hold: keys read during a hold wait, then go on in the order read."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from textual import events

from app.ui.key_hold import KeyHold


class Harness:
    def __init__(self) -> None:
        self.dispatched: list[str] = []
        self.scheduled: list[Callable[[], Awaitable[None]]] = []
        self.timers: list[tuple[float, Callable[[], None]]] = []
        self.on_dispatch: Callable[[str], None] = lambda name: None
        self.hold = KeyHold(self.dispatch, self.scheduled.append, lambda s, f: self.timers.append((s, f)))

    async def dispatch(self, key: events.Key) -> None:
        self.dispatched.append(key.key)
        self.on_dispatch(key.key)

    def read(self, *names: str) -> None:
        """The app reads keys: each is dispatched at once unless the hold takes it."""
        for name in names:
            key = events.Key(name, name)
            if not self.hold.take(key):
                asyncio.run(self.dispatch(key))

    def run_scheduled(self) -> None:
        while self.scheduled:
            asyncio.run(self.scheduled.pop(0)())


def test_keys_go_straight_through_without_a_hold() -> None:
    h = Harness()
    h.read("a", "b")
    assert h.dispatched == ["a", "b"] and h.hold.held == 0


def test_held_keys_go_on_in_order_after_the_release_and_later_keys_queue_behind_them() -> None:
    h = Harness()
    release = h.hold.hold()
    h.read("c", "d")
    assert h.dispatched == [] and h.hold.held == 2
    release()
    h.read("e")  # read after the release but before the replay ran: it must not jump the queue
    assert h.dispatched == []
    h.run_scheduled()
    assert h.dispatched == ["c", "d", "e"]
    h.read("f")
    assert h.dispatched == ["c", "d", "e", "f"]


def test_a_second_release_is_harmless_and_the_timer_releases_a_forgotten_hold() -> None:
    h = Harness()
    release = h.hold.hold(max_s=0.5)
    h.read("x")
    [(seconds, fallback)] = h.timers
    assert seconds == 0.5
    fallback()  # the owner never answered
    release()  # ...and then did: nothing more happens
    h.run_scheduled()
    assert h.dispatched == ["x"]
    other = h.hold.hold()
    h.read("y")
    assert h.dispatched == ["x"]  # the count of holds was not thrown off by the double release
    other()
    h.run_scheduled()
    assert h.dispatched == ["x", "y"]


def test_a_replayed_key_that_starts_a_hold_keeps_the_rest_waiting() -> None:
    """Enter in a second dialog, typed before the first had answered."""
    h = Harness()
    releases: list[Callable[[], None]] = []
    h.on_dispatch = lambda name: releases.append(h.hold.hold()) if name == "enter" else None
    first = h.hold.hold()
    h.read("enter", "g", "h")
    first()
    h.run_scheduled()
    assert h.dispatched == ["enter"] and h.hold.held == 2
    releases[0]()
    h.run_scheduled()
    assert h.dispatched == ["enter", "g", "h"]
