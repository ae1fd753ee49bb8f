"""The messages between the app and the engine's child: they survive the pipe, and so do errors."""
from __future__ import annotations

import pickle
import threading

from engine.api import EngineInfo
from engine.child.protocol import ChatRequest, Failure, Round, failure
from engine.errors import EngineError, MemoryPlanError
from engine.events import ChatEvent, ChatMessage, GenerationParams


def test_requests_and_rounds_pickle_as_they_are() -> None:
    info = EngineInfo("pocket", "target", "", "ngram", "")
    request = ChatRequest([ChatMessage("user", "hi")], GenerationParams(max_new_tokens=3, k=2))
    round_ = Round((ChatEvent(text="Hi", pieces=(), token_ids=(1, 2), stats=None),), info)
    assert pickle.loads(pickle.dumps(request)) == request
    assert pickle.loads(pickle.dumps(round_)) == round_


def test_an_error_that_pickles_crosses_as_itself_without_its_traceback() -> None:
    try:
        raise MemoryPlanError("the draft does not fit: 3.1 GiB needed, 2.0 GiB free")
    except MemoryPlanError as exc:
        sent = failure(exc)
    got = pickle.loads(pickle.dumps(sent))
    assert isinstance(got, Failure) and isinstance(got.error, MemoryPlanError)
    assert str(got.error) == "the draft does not fit: 3.1 GiB needed, 2.0 GiB free"
    assert got.error.__traceback__ is None


class _Unpicklable(Exception):
    def __init__(self) -> None:
        super().__init__("holds a lock")
        self.lock = threading.Lock()


def test_an_error_that_cannot_pickle_crosses_as_an_engine_error_with_its_text() -> None:
    got = pickle.loads(pickle.dumps(failure(_Unpicklable())))
    assert isinstance(got.error, EngineError)
    assert str(got.error) == "_Unpicklable: holds a lock"
