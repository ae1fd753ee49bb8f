"""A loaded pair ready to chat: messages in, text events out.

:class:`ChatEngine` implements :class:`engine.api.ChatBackend`. It renders the
conversation with the target's chat template, runs the
:class:`~engine.decoder.SpecDecoder`, and turns each round's token ids into
text (attributed to draft or target) while watching for stop strings. The
decoder's caches persist between turns, so a follow-up turn reads only what
is new.
"""
from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator, Sequence

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from engine.api import EngineInfo
from engine.chat import IncrementalDetokenizer, StopStringFilter, render_prompt, stop_token_ids
from engine.decoder import SpecDecoder
from engine.device import Device
from engine.drafters import Drafter
from engine.events import ChatEvent, ChatMessage, GenerationParams, RoundEvent, TextPiece


class ChatEngine:
    """Target model + drafter + tokenizer behind the :class:`ChatBackend` surface.

    Not thread-safe: one reply at a time (the app runs replies one after another
    in a worker thread; ``cancel`` may be set from any thread).
    """

    def __init__(
        self,
        *,
        tokenizer: PreTrainedTokenizerBase,
        target_model: PreTrainedModel,
        drafter: Drafter | None,
        device: Device,
        info: EngineInfo,
        decoder_options: dict[str, int] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.device = device
        self.decoder = SpecDecoder(target_model, device, drafter, **(decoder_options or {}))
        self._info = info
        self.stop_ids = stop_token_ids(tokenizer, getattr(target_model, "generation_config", None))

    @property
    def info(self) -> EngineInfo:
        """The loaded state, with the live mode and any fallback reason."""
        reason = self.decoder.fallback_reason or self.decoder.off_reason or self._info.fallback_reason
        changes: dict[str, object] = {"mode": self.decoder.mode, "fallback_reason": reason}
        if self.decoder.drafter is None and self._info.draft_bytes:
            changes["draft_bytes"] = 0
        return dataclasses.replace(self._info, **changes)

    def prompt_ids(self, messages: Sequence[ChatMessage]) -> list[int]:
        """The conversation as target token ids ``[L]``, assistant turn opened."""
        return render_prompt(self.tokenizer, messages)

    def chat(
        self,
        messages: Sequence[ChatMessage],
        params: GenerationParams,
        cancel: threading.Event | None = None,
    ) -> Iterator[ChatEvent]:
        """Reply to the conversation; one :class:`ChatEvent` per decoding round."""
        return self.generate_ids(self.prompt_ids(messages), params, cancel)

    def generate_ids(
        self,
        prompt_ids: Sequence[int],
        params: GenerationParams,
        cancel: threading.Event | None = None,
    ) -> Iterator[ChatEvent]:
        """Like :meth:`chat`, from prompt token ids ``[L]`` (no template applied)."""
        if not params.stop_token_ids:
            params = dataclasses.replace(params, stop_token_ids=self.stop_ids)
        detok = IncrementalDetokenizer(self.tokenizer)
        stops = StopStringFilter(params.stop_strings)
        events = self.decoder.generate(prompt_ids, params, cancel)
        try:
            for event in events:
                pieces = [TextPiece(detok.push(t), src) for t, src in zip(event.token_ids, event.sources)]
                if event.finish_reason is not None:
                    pieces.append(TextPiece(detok.flush(), "target"))
                shown, hit = stops.feed(pieces, final=event.finish_reason is not None)
                if hit:
                    yield _chat_event(dataclasses.replace(event, finish_reason="stop"), shown)
                    return
                yield _chat_event(event, shown)
        finally:
            events.close()

    def set_speculation(self, enabled: bool) -> None:
        self.decoder.set_speculation(enabled)

    def close(self) -> None:
        """Free both models; the engine cannot be used afterwards."""
        self.decoder.close()


def _chat_event(event: RoundEvent, pieces: list[TextPiece]) -> ChatEvent:
    pieces = [p for p in pieces if p.text]
    return ChatEvent(
        text="".join(p.text for p in pieces),
        pieces=tuple(pieces),
        token_ids=event.token_ids,
        stats=event.stats,
        finish_reason=event.finish_reason,
        notice=event.notice,
    )
