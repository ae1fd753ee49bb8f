"""A reply's worker loop (app.ui.reply_stream): rounds coalesce for the UI, the end is always posted and saved."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from app.store.pending import ChatRef, ReplyRecord
from app.ui.messages import Outbox, ReplyChunk, ReplyFinished
from app.ui.reply_stream import ReplyJob, ReplyStream, stream_reply
from app.ui.widgets.chat_view import AssistantMessage
from engine.errors import EngineError
from engine.events import ChatEvent, ChatMessage, GenerationParams
from tests.app.fakes import FakeBackend, make_profiles


class Saver:
    """Records what the worker hands over (the real saver writes it in the background)."""

    def __init__(self) -> None:
        self.updates: list[tuple[str, str | None]] = []

    def update(self, record: ReplyRecord, text: str, pieces: Any, stats: Any, finish: str | None) -> None:
        self.updates.append((text, finish))


class Failing:
    """A backend whose reply fails after one round."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def chat(self, messages: Any, params: Any, cancel: Any) -> Iterator[ChatEvent]:
        yield ChatEvent("Hel", (), (1,), None)  # type: ignore[arg-type]
        raise self.error


def run(backend: Any, cancel: threading.Event | None = None) -> tuple[list[object], Saver]:
    posted: list[object] = []
    saver = Saver()
    job = ReplyJob(7, backend, threading.Lock(), [ChatMessage("user", "hi")], GenerationParams(max_new_tokens=8),
                   cancel or threading.Event(), Outbox(), saver, ReplyRecord(ChatRef("t"), "hi", "fast"))  # type: ignore[arg-type]
    stream_reply(job, posted.append)
    return posted, saver


def test_a_reply_posts_one_chunk_while_the_ui_has_not_looked_then_its_end() -> None:
    posted, saver = run(FakeBackend(make_profiles().get("fast")))
    chunks = [m for m in posted if isinstance(m, ReplyChunk)]
    assert len(chunks) == 1 and chunks[0].reply_id == 7  # nobody took the rounds: no second message
    end = posted[-1]
    assert isinstance(end, ReplyFinished) and end.finish_reason == "eos" and end.error is None
    text = "Hello there! Here is code:\n\n```python\nprint('hi')\n```\nDone."
    assert saver.updates[-1] == (text, "eos") and len(saver.updates) == 6  # every round, then the end
    assert "".join(e.text for e in chunks[0].outbox.take()) == text


def test_an_engine_error_ends_the_reply_as_failed_keeping_its_text() -> None:
    posted, saver = run(Failing(EngineError("the engine process was killed")))
    end = posted[-1]
    assert isinstance(end, ReplyFinished) and end.finish_reason == "error"
    assert end.error == "the engine process was killed" and saver.updates[-1] == ("Hel", "error")


def test_a_reply_stopped_because_the_app_closes_ends_as_cancelled_not_failed() -> None:
    """ctrl+q with the engine not answering saved the reply as failed, "the engine process did not stop the reply
    ... and was ended", though the user simply quit (a hostile tester's)."""
    from engine.errors import EngineClosedError

    cancel = threading.Event()
    cancel.set()  # the app's unmount stops the reply first
    posted, saver = run(Failing(EngineClosedError("closed")), cancel)
    end = posted[-1]
    assert isinstance(end, ReplyFinished) and end.finish_reason == "cancelled"
    assert end.error is None and not end.engine_died and saver.updates[-1] == ("Hel", "cancelled")


def test_any_other_error_is_named_not_raised() -> None:
    posted, _ = run(Failing(KeyError("x")))
    assert posted[-1].error == "KeyError: 'x'"  # type: ignore[attr-defined]


def test_a_cancelled_reply_ends_as_cancelled() -> None:
    cancel = threading.Event()
    cancel.set()
    posted, saver = run(FakeBackend(make_profiles().get("fast")), cancel)
    assert posted[-1].finish_reason == "cancelled" and saver.updates[-1][1] == "cancelled"  # type: ignore[attr-defined]


def test_the_stream_state_moves_on_and_stops() -> None:
    stream = ReplyStream()
    widget = AssistantMessage("fast")
    stream.begin(widget)
    assert stream.is_current(1) and stream.cancel is not None
    cancel = stream.cancel
    stream.forget()  # a new chat: the old reply is stopped and its late messages dropped
    assert cancel.is_set() and not stream.is_current(1) and stream.widget is None and stream.reply_id == 2
