"""Pilot helpers shared by the app tests."""
from __future__ import annotations

from typing import TYPE_CHECKING

import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from textual.pilot import Pilot

from app.ui.app import SpecChatApp
from app.ui.widgets.prompt import PromptArea
from tests.app.fakes import FakeBackend, FakeLoader

if TYPE_CHECKING:
    import pytest


async def wait_for(pilot: Pilot, predicate: Callable[[], object], timeout: float = 5.0) -> None:
    """Let the app run until ``predicate()`` is true (fails the test after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {getattr(predicate, '__name__', predicate)}")
        await pilot.pause(0.01)
    await pilot.pause()


async def ready(pilot: Pilot) -> SpecChatApp:
    """Wait until the app's backend is loaded."""
    app = pilot.app
    assert isinstance(app, SpecChatApp)
    await wait_for(pilot, lambda: app.engine.backend is not None and not app.engine.loading)
    return app


async def send(pilot: Pilot, text: str) -> None:
    """Type ``text`` into the prompt box and press Enter."""
    prompt = pilot.app.query_one(PromptArea)
    prompt.focus()
    prompt.insert(text)
    await pilot.press("enter")


async def send_held(pilot: Pilot, loader: FakeLoader, text: str) -> FakeBackend:
    """Send ``text`` and wait until the loader's first backend holds its reply mid-stream (a
    :class:`FakeLoader` with ``hold_after``); returns that backend (``release`` lets it go on)."""
    await send(pilot, text)
    backend = loader.backends[0]
    await wait_for(pilot, backend.held.is_set)
    return backend


@asynccontextmanager
async def first_load_held(make_app: Callable[..., SpecChatApp], loader: FakeLoader,
                          size: tuple[int, int] = (80, 24)) -> AsyncIterator[tuple[SpecChatApp, Pilot]]:
    """An app whose first load waits on ``loader.gate`` (set it to let the load finish), run and
    watched until it is loading: the set-up of every test of what a first start shows."""
    loader.gate = threading.Event()
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.engine.loading)
        yield app, pilot


def interrupt_generate_after(monkeypatch: "pytest.MonkeyPatch", events: int) -> None:
    """``specchat generate``'s engine raises KeyboardInterrupt (^C) after its first ``events`` events."""
    import app.cli as cli

    real_load = cli.load_for

    def interrupted_load(*args: object, **kwargs: object) -> object:
        engine = real_load(*args, **kwargs)  # type: ignore[arg-type]
        real_chat = engine.chat

        def chat(*a: object, **k: object):  # type: ignore[no-untyped-def]
            replies = real_chat(*a, **k)
            for _ in range(events):
                yield next(replies)
            replies.close()
            raise KeyboardInterrupt

        engine.chat = chat  # type: ignore[method-assign]
        return engine

    monkeypatch.setattr(cli, "load_for", interrupted_load)
