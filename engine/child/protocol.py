"""What crosses the pipes between the app's process and the engine's child: typed messages.

Every message is a frozen dataclass (pickled by ``multiprocessing``); each pipe
carries one conversation at a time:

* **start** (reply pipe, child → parent): :class:`Progress` while the child loads
  the profile, then :class:`Ready` or :class:`Failure`;
* **a reply** (reply pipe): :class:`ChatRequest` → one :class:`Round` per decoding
  round, then :class:`ReplyEnd`, or :class:`Failure`; the shared ``cancel`` event
  stops the reply between rounds, as in one process;
* **control** (second pipe, answered by a thread of the child even while a reply
  streams, so F5 acts mid-reply): :class:`SpeculationRequest` or :class:`LearnRequest`
  → :class:`Info` or :class:`Failure`;
* :class:`CloseRequest` (reply pipe): the child frees the models and exits.

Every answer carries the engine's :class:`~engine.api.EngineInfo` as it is after it,
so the parent's view of the engine never lags a message behind.
"""
from __future__ import annotations

import pickle
from dataclasses import dataclass

from engine.api import EngineInfo
from engine.errors import EngineError
from engine.events import ChatEvent, ChatMessage, GenerationParams


@dataclass(frozen=True)
class ChatRequest:
    """Reply to ``messages`` with ``params`` (parent → child)."""

    messages: list[ChatMessage]
    params: GenerationParams


@dataclass(frozen=True)
class CloseRequest:
    """Free the models and exit (parent → child)."""


@dataclass(frozen=True)
class SpeculationRequest:
    """Switch speculation on or off, at once (parent → child, control pipe)."""

    enabled: bool


@dataclass(frozen=True)
class LearnRequest:
    """Earlier chats' messages for the drafter to draft from (parent → child, control pipe)."""

    texts: list[str]


@dataclass(frozen=True)
class Progress:
    """A loading stage and its fraction done, None when unknown (child → parent)."""

    stage: str
    fraction: float | None


@dataclass(frozen=True)
class Ready:
    """The profile is loaded (child → parent)."""

    info: EngineInfo


@dataclass(frozen=True)
class Round:
    """The reply's rounds since the last message (child → parent): the first at once, then
    those of up to :data:`engine.child.serve.SEND_EVERY_S`, so the parent reads a message a
    paint, not one a token (a round of pocket's plain decoding is 5-7 ms)."""

    events: tuple[ChatEvent, ...]
    info: EngineInfo


@dataclass(frozen=True)
class ReplyEnd:
    """The reply is over (child → parent)."""

    info: EngineInfo


@dataclass(frozen=True)
class Info:
    """The engine after a control request (child → parent, control pipe)."""

    info: EngineInfo


@dataclass(frozen=True)
class Failure:
    """What the child raised, for the parent to raise in its own thread (child → parent)."""

    error: BaseException


ToChild = ChatRequest | CloseRequest
FromChild = Progress | Ready | Round | ReplyEnd | Failure
ControlRequest = SpeculationRequest | LearnRequest
ControlAnswer = Info | Failure


def failure(exc: BaseException) -> Failure:
    """``exc`` as it is when it survives pickling, else an EngineError with its text;
    without its traceback (the frames are the child's)."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001
        exc = EngineError(f"{type(exc).__name__}: {exc}")
    exc.__traceback__ = None
    return Failure(exc)
