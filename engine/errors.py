"""The few named exceptions raised at the engine's boundaries.

Each message says what went wrong and what the user can do about it; the app
shows them as notices and the CLI prints them without a traceback.
"""
from __future__ import annotations


class SpecChatError(Exception):
    """Base class: anything the user can fix or should be told about."""


class ProfileError(SpecChatError):
    """A models.toml is malformed, or names a profile/field/value that does not exist."""


class ModelSourceError(SpecChatError):
    """A model could not be found, fetched, verified or read."""


class IncompatibleDraftError(SpecChatError):
    """The draft model cannot verify against the target (tokenizers differ)."""


class MemoryPlanError(SpecChatError):
    """Even the target alone does not fit in the memory budget. ``room_helps``: whether freeing
    memory (closing the models loaded now) could make it fit; not when the budget is the limit."""

    def __init__(self, message: str, room_helps: bool = True) -> None:
        super().__init__(message)
        self.room_helps = room_helps


class EngineError(SpecChatError):
    """Generation failed at run time (for example the target ran out of memory)."""


class NonFiniteLogitsError(EngineError):
    """A model's logits came out NaN or inf (float16 overflow); ``role`` is ``"target"`` or ``"draft"``."""

    def __init__(self, message: str, role: str = "target") -> None:
        super().__init__(message)
        self.role = role


class EngineDiedError(EngineError):
    """The engine's own process ended (killed, crashed) while the app still ran: the models must
    be loaded again; the conversation is the app's and nothing of it is lost."""


class EngineClosedError(EngineError):
    """A reply ended because its engine was closed under it (the app quitting), not by a failure: the
    reply keeps what it had and ends as stopped, as the quit asked; nothing is to be loaded again."""


class LoadStoppedError(EngineError):
    """Loading a profile was stopped by the user (Esc) before it was ready: its process, and any
    download it ran, ended; whatever was loaded before stays."""


class EngineBusyError(EngineError):
    """A second reply was asked of an engine while another thread's reply is still running."""


class ContextLengthError(SpecChatError):
    """A message is too long for the model's context window even with every earlier turn left out."""


class QuantizationError(SpecChatError):
    """A weight cannot be quantized as asked (a shape the int4 kernel refuses, an unknown group size)."""


class LlamaCppError(SpecChatError):
    """llama.cpp's binaries are missing where the user pointed, or llama-server failed or answered badly."""


class StorageError(SpecChatError):
    """A folder or file specchat keeps its data in cannot be made or written: a file stands where a
    folder should be, the disk is full, or permission is denied. The message names the path."""


class SettingError(SpecChatError):
    """An environment variable of specchat's (``SPECCHAT_*``) holds a value it cannot use; the
    message names the variable and the values it takes."""
