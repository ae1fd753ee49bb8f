"""What the app sends to the backend: the conversation, derived from the transcript, and the parameters.

The transcript on screen is the one source of truth: the turns the model sees are
read off its message widgets (:func:`turns_from`) each time a reply starts, so they
cannot drift from what the user sees. An earlier exchange (regenerated or edited)
stays on screen dimmed and is never sent again; a prompt still waiting its turn and
the reply that is streaming are not sent either.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

from app.ui.sampling import ChatSampling
from engine.events import ChatMessage, GenerationParams
from engine.events import generation_params as params_for

if TYPE_CHECKING:
    from engine.config.profiles import ModelProfile

MAX_NEW_TOKENS = 512


class Turn(Protocol):
    """A message of the transcript, as :func:`turns_from` reads it."""

    role: str
    text: str
    superseded: bool
    waiting: bool


def turns_from(messages: Iterable[Turn]) -> list[ChatMessage]:
    """The turns the model sees, oldest first: every message with text that is not
    superseded and not waiting. The caller leaves out the reply being written."""
    return [ChatMessage(m.role, m.text) for m in messages  # type: ignore[arg-type]
            if m.text and not m.superseded and not m.waiting]


def generation_params(profile: "ModelProfile", max_new_tokens: int = MAX_NEW_TOKENS, *,
                      private: bool = False, sampling: ChatSampling | None = None) -> GenerationParams:
    """Sampling and the K schedule from the profile (``k=None`` means adaptive), with the
    chat's own ``sampling`` over it (app.ui.sampling); ``private``: the engine keeps nothing
    of the reply for later chats."""
    params = params_for(profile, max_new_tokens, **(sampling or ChatSampling()).overrides())
    return dataclasses.replace(params, private=True) if private else params


def build_messages(system_prompt: str | None, turns: Sequence[ChatMessage]) -> list[ChatMessage]:
    """The whole conversation, system prompt first when there is one."""
    out: list[ChatMessage] = []
    if system_prompt:
        out.append(ChatMessage("system", system_prompt))
    out.extend(turns)
    return out
