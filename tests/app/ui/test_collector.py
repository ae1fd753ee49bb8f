"""The UI's heap is frozen while a reply streams and collected once after (app.ui.collector)."""
from __future__ import annotations

import gc
from collections.abc import Callable

import pytest

from app.ui.app import SpecChatApp
from app.ui.collector import StreamingCollector
from tests.app.fakes import FakeLoader
from tests.app.helpers import ready, send, send_held, wait_for

pytestmark = pytest.mark.anyio


class Recorder:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def freeze(self) -> None:
        self.calls.append("freeze")

    def unfreeze(self) -> None:
        self.calls.append("unfreeze")

    def collect(self) -> int:
        self.calls.append("collect")
        return 0


def test_a_reply_freezes_the_heap_and_its_end_collects_it_once() -> None:
    recorder = Recorder()
    collector = StreamingCollector(recorder)
    collector.reply_over()  # nothing frozen: nothing to do
    assert recorder.calls == []
    collector.reply_started()
    collector.reply_over()
    collector.reply_over()  # a second end (a stale message) collects nothing more
    assert recorder.calls == ["freeze", "unfreeze", "collect"]


async def test_the_app_streams_with_its_heap_frozen_and_hands_it_back_after(
        make_app: Callable[..., SpecChatApp]) -> None:
    loader = FakeLoader(hold_after=1)
    app = make_app(loader=loader)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        assert gc.get_freeze_count() == 0
        backend = await send_held(pilot, loader, "first")
        assert gc.get_freeze_count() > 0  # mid-reply: the collector leaves the heap alone
        backend.release.set()
        await wait_for(pilot, lambda: not app.conversation.generating)
        await wait_for(pilot, lambda: gc.get_freeze_count() == 0)  # once the last frame is out
        await pilot.press("ctrl+n")  # a new chat while a reply streams drops the reply: the heap is handed back
        backend.hold_after = 1
        backend.held.clear()
        backend.release.clear()
        await send(pilot, "second")
        await wait_for(pilot, backend.held.is_set)
        assert gc.get_freeze_count() > 0
        await pilot.press("ctrl+n")
        await wait_for(pilot, lambda: gc.get_freeze_count() == 0)
        backend.release.set()
