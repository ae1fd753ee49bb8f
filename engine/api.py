"""The small surface the app and the CLI program against.

:class:`ChatBackend` is what a loaded engine offers; the app's tests implement
it with a fast fake. :mod:`engine.progress` says how loading reports progress.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.events import ChatEvent, ChatMessage, GenerationParams, Mode


@dataclass(frozen=True)
class EngineInfo:
    """What is loaded and why, for the HUD and for ``--json`` output.

    ``plan`` is the memory plan's plain-data form (``engine.model.plan.Plan.to_dict``):
    the choice made and the byte figures behind it. ``fallback_reason`` says why
    the engine runs without its configured drafter (dropped: memory, a tokenizer that differs),
    if it does; ``off_reason`` why a loaded drafter is idle for now (the user's switch,
    :data:`~engine.events.OFF_BY_USER`, or an automatic one, :data:`~engine.events.NOT_PAYING`). ``compat_note``
    counts and names the reserved special tokens on which target and draft
    tokenizers differ (allowed: :mod:`engine.model.compat`), if any. ``cpu_kernel`` names the
    CPU int4 kernel that multiplies the target's weights (a variant of specchat's,
    :data:`engine.quant.cpu_kernel.VARIANTS`, or ``torch``); None off the CPU or without int4.
    """

    profile: str
    target: str
    drafter: str
    mode: Mode
    device: str
    quantization: str = "none"
    plan: dict[str, Any] = field(default_factory=dict)
    fallback_reason: str | None = None
    off_reason: str | None = None
    target_bytes: int | None = None
    draft_bytes: int | None = None
    free_bytes: int | None = None
    compat_note: str | None = None
    cpu_kernel: str | None = None


class ChatBackend(Protocol):
    """A loaded target (and maybe drafter) ready to answer chat turns."""

    @property
    def info(self) -> EngineInfo:
        """The current state; it changes when the drafter is dropped or speculation is switched."""
        ...

    def chat(
        self,
        messages: Sequence[ChatMessage],
        params: GenerationParams,
        cancel: threading.Event | None = None,
    ) -> Iterator[ChatEvent]:
        """Reply to ``messages`` (the whole conversation so far, system prompt first).

        Yields one event per decoding round; the last has ``finish_reason``.
        Setting ``cancel`` stops between rounds, keeping the engine ready.
        """
        ...

    def learn(self, texts: Sequence[str]) -> None:
        """Earlier chats' messages, oldest first, for a drafter that drafts from them (the
        suffix drafter); replaces what it was given before. Nothing for other drafters."""
        ...

    def set_speculation(self, enabled: bool) -> None:
        """Switch speculation off (plain decoding) or back on."""
        ...

    def close(self) -> None:
        """Unload the models and free their memory."""
        ...
