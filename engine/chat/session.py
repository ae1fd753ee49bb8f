"""A loaded pair ready to chat: messages in, text events out.

:class:`ChatEngine` implements :class:`engine.api.ChatBackend`. It renders the
conversation with the target's chat template, runs the
:class:`~engine.decode.decoder.SpecDecoder`, and turns each round's token ids into
text (attributed to draft or target) while watching for stop strings. The
decoder's caches persist between turns, so a follow-up turn reads only what
is new.
"""
from __future__ import annotations

import dataclasses
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from engine.api import EngineInfo
from engine.chat.text import IncrementalDetokenizer, StopStringFilter, render_prompt, stop_token_ids
from engine.decode.decoder import SpecDecoder
from engine.model.device import Device
from engine.decode.drafters import Drafter, ModelDrafter
from engine.errors import ContextLengthError, EngineBusyError
from engine.model.memory import context_window
from engine.model.plan import Plan
from engine.events import ChatEvent, ChatMessage, GenerationParams, RoundEvent, TextPiece


class ChatEngine:
    """Target model + drafter + tokenizer behind the :class:`ChatBackend` surface.

    One reply at a time. A reply is claimed when :meth:`chat` is called and
    released when its iterator finishes, is closed or is garbage-collected.
    A call while another *live thread's* reply is unfinished raises
    :class:`~engine.errors.EngineBusyError`; a newer call from the same thread
    (or after the owner thread ended) takes over an abandoned reply, whose
    iterator then raises EngineBusyError instead of touching the caches.
    ``cancel`` may be set from any thread.

    The conversation is fitted to the context window (:attr:`window`): the
    oldest turns are left out (never the system prompt nor the new message),
    and the first event's ``notice`` and every ``stats.truncated_turns`` say so.
    """

    def __init__(
        self,
        *,
        tokenizer: PreTrainedTokenizerBase,
        target_model: PreTrainedModel,
        drafter: Drafter | None,
        device: Device,
        info: EngineInfo,
    ) -> None:
        self.tokenizer = tokenizer
        self.device = device
        draft_config = drafter.runner.model.config if isinstance(drafter, ModelDrafter) else None
        self.window: int | None = context_window(info.plan.get("context_length"), target_model.config, draft_config)
        """Tokens of prompt + reply: min(profile context_length, each model's max_position_embeddings)."""
        self.decoder = SpecDecoder(target_model, device, drafter, window=self.window)
        self._info = info
        self.stop_ids = stop_token_ids(tokenizer, getattr(target_model, "generation_config", None))
        self._claims = threading.Lock()
        self._dropped: tuple[tuple[str, str], ...] = ()
        """The (role, content) of the messages the last fitted prompt left out (:meth:`fit`)."""
        self._owner: _Claim | None = None
        self._step = threading.Lock()

    @property
    def info(self) -> EngineInfo:
        """The loaded state, with the live mode and any fallback reason."""
        changes: dict[str, object] = {
            "mode": self.decoder.mode,
            "fallback_reason": self.decoder.fallback_reason or self._info.fallback_reason,  # a drop, at load or later
            "off_reason": self.decoder.off_reason,  # a switch: the user's or the evidence's
        }
        if self.decoder.drafter is None and self._info.drafter != "none":  # dropped while decoding: plain now
            reason = self.decoder.fallback_reason or "the drafter was dropped"
            changes.update(drafter="none", draft_bytes=0 if self._info.draft_bytes is not None else None,
                           plan=Plan.dict_without_drafter(self._info.plan, reason))
        return dataclasses.replace(self._info, **changes)

    def prompt_ids(self, messages: Sequence[ChatMessage]) -> list[int]:
        """The conversation as target token ids ``[L]``, assistant turn opened."""
        return render_prompt(self.tokenizer, messages)

    def fit(self, messages: Sequence[ChatMessage], params: GenerationParams) -> tuple[list[int], int]:
        """Prompt ids ``[L]`` of the conversation fitted to the window, and how many
        earlier messages were left out.

        Oldest turns go first, whole user turns at a time (a kept history starts
        with a user message), until the prompt leaves room for
        ``min(max_new_tokens, window // 4)`` reply tokens; if even the system
        prompt plus the new message leave less, they are sent alone. Raises
        :class:`ContextLengthError` when those two alone do not fit the window.

        A cut is kept while it leaves that room: the next turn leaves out the same
        messages, so the prompt starts as the last one did and the cache reads only what
        is new. A new cut goes down to half the window where it can (as llama.cpp's
        context shift does), so that several turns fit before the next one: every cut
        makes the models read the whole kept prompt again, seconds on a CPU
        (pocket: ~1,200 tokens in 3 s), and cutting just enough would do that at
        every turn once the conversation fills the window.
        """
        ids = self.prompt_ids(messages)
        window = self.window
        if window is None:
            return ids, 0
        room = max(1, min(params.max_new_tokens, window // 4))
        if len(ids) + room <= window:
            self._dropped = ()
            return ids, 0
        head = list(messages[:1]) if messages and messages[0].role == "system" else []
        body = list(messages[len(head):])
        # Cut points: drop body[:i] where body[i] is a user turn; the last is the new message alone.
        cuts = [i for i in range(1, len(body)) if body[i].role == "user"] or [max(len(body) - 1, 0)]
        if cuts[-1] != len(body) - 1:
            cuts.append(len(body) - 1)
        rendered: dict[int, list[int]] = {}

        def ids_for(cut: int) -> list[int]:
            if cut not in rendered:
                rendered[cut] = self.prompt_ids(head + body[cut:])
            return rendered[cut]

        alone = ids_for(cuts[-1])
        if len(alone) >= window:
            earlier = " (leaving out every earlier turn is not enough)" if len(body) > 1 else ""
            system = len(self.prompt_ids(head)) if head else 0
            if system * 2 >= len(alone):  # most of it is the system prompt: a 2-token message was told to shorten
                raise ContextLengthError(
                    f"the system prompt is too long: {system} of the {len(alone)} tokens with the message, but the "
                    f"context window holds {window} tokens of prompt and reply{earlier}; shorten the system prompt"
                )
            with_system = f" with the system prompt ({system} of them)" if head else ""
            raise ContextLengthError(
                f"the message is too long: {len(alone)} tokens{with_system}, but the context window holds "
                f"{window} tokens of prompt and reply{earlier}; shorten it"
            )
        said = [(m.role, m.content) for m in body]
        last = len(self._dropped)
        if last in cuts and tuple(said[:last]) == self._dropped and len(ids_for(last)) + room <= window:
            return ids_for(last), last  # the same cut as the last prompt's: its start is cached

        def smallest(limit: int) -> int:
            lo, hi = 0, len(cuts) - 1  # the smallest cut whose prompt is at most `limit` tokens
            while lo < hi:
                mid = (lo + hi) // 2
                if len(ids_for(cuts[mid])) <= limit:
                    hi = mid
                else:
                    lo = mid + 1
            return cuts[lo]

        cut = smallest(min(window // 2, window - room))
        if len(ids_for(cut)) + room > window:  # the new message is longer than half the window
            cut = smallest(window - room)
        self._dropped = tuple(said[:cut])
        return ids_for(cut), cut

    def chat(
        self,
        messages: Sequence[ChatMessage],
        params: GenerationParams,
        cancel: threading.Event | None = None,
    ) -> Iterator[ChatEvent]:
        """Reply to the conversation; one :class:`ChatEvent` per decoding round.

        Fitting, refusals (:class:`ContextLengthError`, :class:`EngineBusyError`)
        happen here, before any token is read by a model.
        """
        ids, dropped = self.fit(messages, params)
        notice = None
        if dropped:
            notice = (f"{dropped} earlier message{'s' if dropped != 1 else ''} left out to fit the "
                      f"{self.window}-token context window")
        return self._claim().watch(self._stream, ids, params, cancel, notice, dropped)

    def generate_ids(
        self,
        prompt_ids: Sequence[int],
        params: GenerationParams,
        cancel: threading.Event | None = None,
    ) -> Iterator[ChatEvent]:
        """Like :meth:`chat`, from prompt token ids ``[L]`` (no template applied, no fitting)."""
        return self._claim().watch(self._stream, list(prompt_ids), params, cancel, None, 0)

    def _claim(self) -> "_Claim":
        with self._claims:
            owner = self._owner
            me = threading.current_thread()
            if owner is not None and owner.live and owner.thread is not me and owner.thread.is_alive():
                raise EngineBusyError(
                    "this engine is already writing a reply in another thread; wait for it to finish, "
                    "cancel it, or use one engine per thread"
                )
            self._owner = _Claim(me)
            return self._owner

    def _stream(
        self,
        claim: "_Claim",
        prompt_ids: list[int],
        params: GenerationParams,
        cancel: threading.Event | None,
        notice: str | None,
        truncated: int,
    ) -> Iterator[ChatEvent]:
        if not params.stop_token_ids:
            params = dataclasses.replace(params, stop_token_ids=self.stop_ids)
        detok = IncrementalDetokenizer(self.tokenizer)
        stops = StopStringFilter(params.stop_strings)
        reply: list[int] = []
        events = self.decoder.generate(prompt_ids, params, cancel)
        try:
            while True:
                with self._turn(claim):
                    event = next(events, None)
                    if event is None:
                        return
                    shown, kept = self._stop_strings(event, detok, stops)
                    if kept is not None:  # a stop string: the reply ends at the token that completed it
                        event = dataclasses.replace(event, token_ids=event.token_ids[:kept],
                                                    sources=event.sources[:kept], finish_reason="stop")
                    if truncated:
                        event = dataclasses.replace(event, stats=dataclasses.replace(event.stats, truncated_turns=truncated))
                    if notice:
                        event = dataclasses.replace(event, notice=f"{notice}; {event.notice}" if event.notice else notice)
                        notice = None
                reply.extend(event.token_ids)
                yield _chat_event(event, shown)
                if event.finish_reason is not None:
                    # after the last event: the reply is on screen already. Not a stopped or failed
                    # one: Esc is how a chat deleted while its reply streams stops it, and its text
                    # came back into the drafter after the drafter was taught the history without it
                    if not params.private and event.finish_reason not in ("cancelled", "error"):
                        self._remember(reply)
                    return
        finally:
            claim.done = True
            if self._owner is claim:
                events.close()

    @staticmethod
    def _stop_strings(event: RoundEvent, detok: IncrementalDetokenizer,
                      stops: StopStringFilter) -> tuple[list[TextPiece], int | None]:
        """The round's text safe to show, and where a stop string ended the reply: how many of the
        round's tokens to keep (None: none ended it). Fed token by token, as plain decoding feeds
        them, so a round of several accepted tokens stops where plain decoding would: it kept the
        tokens after the stop string in ``token_ids`` (and in what the suffix drafter remembers).
        The round's statistics still count every token it decoded: they measure the work done."""
        shown: list[TextPiece] = []
        for i, (token, source) in enumerate(zip(event.token_ids, event.sources)):
            out, hit = stops.feed([TextPiece(detok.push(token), source, event.origin if source == "draft" else None)],
                                  final=False)
            shown += out
            if hit:
                return shown, i + 1
        if event.finish_reason is None:
            return shown, None
        out, hit = stops.feed([TextPiece(detok.flush(), "target")], final=True)
        return shown + out, len(event.token_ids) if hit else None

    @contextmanager
    def _turn(self, claim: "_Claim") -> Iterator[None]:
        """One step of a reply: only the current owner may touch the caches, one step at a time."""
        if self._owner is not claim:
            raise EngineBusyError("this reply was abandoned and a newer one took over the engine; "
                                  "it cannot be resumed")
        if not self._step.acquire(blocking=False):
            raise EngineBusyError("this engine is running another step; use one engine per thread")
        try:
            yield
        finally:
            self._step.release()

    def set_speculation(self, enabled: bool) -> None:
        self.decoder.set_speculation(enabled)

    def learn(self, texts: Sequence[str]) -> None:
        """Earlier chats' messages (oldest first), for a drafter that drafts from them
        (:class:`~engine.decode.suffix.SuffixDrafter`); the history as it is now, so what
        was deleted is forgotten. Nothing for other drafters."""
        learn = getattr(self.decoder.drafter, "learn", None)
        if learn is not None:
            # As a prompt reads them (engine.chat.text.render_prompt): a control token's spelling is text.
            learn([self.tokenizer.encode(t, add_special_tokens=False, split_special_tokens=True) for t in texts if t])

    def _remember(self, reply: Sequence[int]) -> None:
        """A finished reply ``[n]`` joins what a suffix drafter drafts from in later chats."""
        remember = getattr(self.decoder.drafter, "remember", None)
        if remember is not None and reply:
            remember(reply)

    def models(self) -> tuple[PreTrainedModel, PreTrainedModel | None]:
        """The loaded target and draft models (None: an n-gram or no drafter), for tools
        that run them side by side with other methods (the bench)."""
        drafter = self.decoder.drafter
        return self.decoder.target.model, drafter.runner.model if isinstance(drafter, ModelDrafter) else None

    def close(self) -> None:
        """Free both models; the engine cannot be used afterwards."""
        self.decoder.close()


class _Claim:
    """Who owns the engine's caches now: the thread that asked, and whether its reply ended."""

    def __init__(self, thread: threading.Thread) -> None:
        self.thread = thread
        self.done = False
        self._stream: Callable[[], object] = lambda: None

    @property
    def live(self) -> bool:
        """Unfinished and its iterator still exists (one dropped before its first step ends nothing else)."""
        return not self.done and self._stream() is not None

    def watch(self, stream: Callable[..., Iterator[ChatEvent]], *args: object) -> Iterator[ChatEvent]:
        """Start ``stream(self, *args)`` and remember it weakly."""
        it = stream(self, *args)
        self._stream = weakref.ref(it)
        return it


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
