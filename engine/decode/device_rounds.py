"""The rounds a card runs without waiting for it each time (issue 35, item 3), as methods of
:class:`~engine.decode.decoder.SpecDecoder`: plain **bursts** (:data:`~engine.decode.decoder.BURST`
one-token steps read back at once, :func:`~engine.decode.read_once.plain_steps`) and greedy
speculation in **chains** (:mod:`engine.decode.chain`: rounds decided on the device, the next chain
queued behind the one being read). Both are counted as the rounds they hold, so the HUD, the cost
model and the schedule see what a round at a time would have shown them.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, TypeVar

from engine.decode.chain import ChainedRound, QueuedChain, chains_allowed, queue_chain, read_chain
from engine.decode.chain_drafts import ChainDrafting, DeviceLookup, ModelChainDraft
from engine.decode.cost_model import CostModel
from engine.decode.tally import ReplyTally
from engine.decode.drafters import Draft, Drafter, ModelDrafter, NgramDrafter, match_key
from engine.decode.read_once import plain_steps
from engine.decode.runner import ModelRunner
from engine.decode.sampling import Randomness
from engine.decode.schedule import Schedule
from engine.events import FinishReason, GenerationParams, Mode, RoundEvent, TokenSource
from engine.model.device import Device

T = TypeVar("T")


class Decoder(Protocol):
    """What these rounds use of :class:`~engine.decode.decoder.SpecDecoder` (named here, not imported:
    the decoder imports this module)."""

    target: ModelRunner
    drafter: Drafter | None
    device: Device
    costs: CostModel
    schedule: Schedule
    speculation_enabled: bool
    burst: int
    chain: int
    _queued: QueuedChain | None
    _lookup_chain: DeviceLookup | None

    @property
    def mode(self) -> Mode: ...

    def _room(self, seq: list[int], params: GenerationParams, produced: int) -> tuple[int, int]: ...

    def _emit(self, seq: list[int], tokens: list[int], params: GenerationParams, budget: int,
              remaining: int) -> tuple[list[int], FinishReason | None]: ...

    def _guarded(self, step: Callable[[], T], reason: str | Callable[[], str],
                 instead: Callable[[], T]) -> tuple[T, str | None]: ...

    def _apply_switch(self, switched: tuple[bool, str] | None) -> None: ...

    def _close_round(self, stats: ReplyTally, notice: str | None, switched: tuple[bool, str] | None) -> str | None: ...

    def _runners(self) -> list[ModelRunner]: ...

    def _lookup_first(self, seq: list[int], params: GenerationParams, generator: Randomness, remaining: int) -> Draft: ...

    def _burst_round(self, seq: list[int], params: GenerationParams, generator: Randomness, stats: ReplyTally,
                     produced: int, notice: str | None) -> tuple[RoundEvent, int]: ...

    def _chain_room(self, seq: list[int], remaining: int) -> int: ...

    def _chain_drafting(self) -> ChainDrafting: ...


class DeviceRounds:
    """Bursts and chains, mixed into :class:`~engine.decode.decoder.SpecDecoder` (whose state they use)."""

    def _burst_round(self: Decoder, seq: list[int], params: GenerationParams, generator: Randomness, stats: ReplyTally,
                     produced: int, notice: str | None) -> tuple[RoundEvent, int]:
        """Up to :attr:`burst` plain steps read back at once (:data:`BURST`); extends ``seq``
        in place. Counted as one plain round a token kept, each with the burst's mean step time.

        While speculating, this is also the plain calibration round (:meth:`Schedule.calibrating`):
        the plain step the speedup divides by is the one plain decoding would run here, a burst,
        not a single synchronised step (on a card that costs about twice as much, docs/gpu.md)."""
        round_mode = self.mode
        shown_k = 0 if round_mode == "plain" else stats.k
        budget, remaining = self._room(seq, params, produced)
        n = min(self.burst, remaining)
        t_start = self.device.mark()
        steps = lambda: plain_steps(self.target, seq, n, params.sampling, generator)  # noqa: E731
        tokens, dropped = self._guarded(steps, "out of memory while decoding", steps)
        t_steps = self.device.mark()
        emitted, finish = self._emit(seq, tokens, params, budget, remaining)
        t_end = self.device.mark()
        steps_s, other_s = self.device.seconds_between([t_start, t_steps, t_end])
        step_s, other = steps_s / n, other_s / n
        switched = None
        for i, _ in enumerate(emitted):
            self.costs.observe(0, 0, 0.0, step_s, other, decided=i == 0)  # one choice for the burst
            stats.record(shown_k, 0, 0, 1, 0.0, step_s, other, mode=round_mode)
            if round_mode == "plain":  # a plain round a token: the re-probe counts them
                switched = self.schedule.verdict(params, "plain", 1, self.costs.plain_equivalent(0, step_s, step_s + other))
                if switched is not None:  # a re-probe after an automatic switch-off: speculation is back
                    break
        if round_mode != "plain" and emitted:  # a calibration burst is one round of the switch's evidence
            each = self.costs.plain_equivalent(0, step_s, step_s + other)
            switched = self.schedule.verdict(params, round_mode, len(emitted), None if each is None else each * len(emitted))
        self._apply_switch(switched)
        notice = self._close_round(stats, notice or dropped, switched)
        event = RoundEvent(tuple(emitted), ("target",) * len(emitted), stats.snapshot(), finish, notice, None)
        return event, len(emitted)

    def _chain_length(self: Decoder, seq: list[int], params: GenerationParams, k: int, remaining: int) -> int:
        """Rounds of ``k`` drafted tokens to chain now (:mod:`engine.decode.chain`); 0 or 1: none.
        Greedy replies over static caches only (a model draft's, or a prompt lookup's on the
        device: :func:`~engine.decode.chain.chains_allowed`), and never past ``remaining``."""
        if self.chain < 2 or not params.sampling.greedy or len(seq) < 2 or not chains_allowed(self.target,
                                                                                              self.drafter):
            return 0
        return min(self.chain, self._chain_room(seq, remaining) // (k + 1))

    def _chain_room(self: Decoder, seq: list[int], remaining: int) -> int:
        """Tokens a chain may give after ``seq``: ``remaining`` (the budget and the decoder's window),
        and never a position past either runner's cache (a decoder without a window still has one)."""
        return min(remaining, *(runner.window - len(seq) for runner in self._runners()))

    def _chain_round(self: Decoder, seq: list[int], params: GenerationParams, generator: Randomness, stats: ReplyTally,
                     produced: int, notice: str | None, start: tuple[int, int] | None = None,
                     more: bool = True) -> tuple[RoundEvent, int]:
        """A chain of speculative rounds read back once (:mod:`engine.decode.chain`), counted as the
        rounds it holds; extends ``seq`` in place. The chain is the one queued last time, else a new
        one of ``start`` = ``(K, rounds)``. With ``more``, the next chain is queued behind it before
        it is read, so the card runs that one while the host reads and emits this one (dropped if
        this one ends the reply). Where the draft fails (out of memory, NaN), it is dropped and a
        plain burst runs from where the chain began."""
        drafting = self._chain_drafting()
        # A chain queued before speculation went off is still the speculative rounds it was.
        round_mode: Mode = "spec" if drafting.origin == "model" else "ngram"
        budget, remaining = self._room(seq, params, produced)
        room = self._chain_room(seq, remaining)
        queued, self._queued = self._queued, None

        def run() -> tuple[int, list[ChainedRound]]:
            first = queued
            if first is None:
                assert start is not None
                first = queue_chain(self.target, drafting, self.device, *start, seq)
            k_next = self.schedule.policy_k(self.drafter, self.speculation_enabled, params) if more else 0
            k_next = self.schedule.chain_k(self.drafter, k_next, params)
            rounds = min(self.chain, (room - first.most) // (k_next + 1)) if k_next > 0 else 0
            if rounds > 1:
                self._queued = queue_chain(self.target, drafting, self.device, k_next, rounds, seq, after=first)
            return first.k, read_chain(self.target, drafting, self.device, first, seq)

        result, dropped = self._guarded(run, "out of memory while speculating", lambda: None)
        if result is None:
            self._queued = None
            return self._burst_round(seq, params, generator, stats, produced, dropped or notice)
        k, chain = result
        if drafting.origin != "model":  # a lookup's next chains take the K this one showed it uses
            self.schedule.chain_read(params, max(r.accepted for r in chain))
        # The host's own time, by the host's clock: a device mark here would wait for the chain
        # queued behind this one, and leave the card idle while the host counts and yields.
        began = time.perf_counter()
        tokens = [t for r in chain for t in r.tokens]
        sources: list[TokenSource] = [s for r in chain for s in ["draft"] * r.accepted + ["target"]]
        free = drafting.origin != "model"  # a lookup's proposals cost no draft model's steps
        emitted, finish = self._emit(seq, tokens, params, budget, remaining)
        if finish is not None:
            self._queued = None  # computed past the reply's end: dropped, and its buffers with it
        other_s = (time.perf_counter() - began) / len(chain)
        plain_step, left, switched = self.burst == 1, len(emitted), None
        for i, r in enumerate(chain):
            kept = min(len(r.tokens), left)
            if kept == 0:  # computed past a stop token, and cropped: not evidence of anything
                break
            left -= kept
            key = match_key(r.key) if free else 0
            # Every chained round verifies K + 1 tokens, whatever a lookup found to fill them with.
            self.costs.observe(r.proposed, r.accepted, r.draft_s, r.verify_s, other_s, key, free=free,
                               plain_step=plain_step, fed=k + 1, decided=i == 0)  # one K for the chain
            stats.record(k, r.proposed, r.accepted, kept, r.draft_s, r.verify_s, other_s, mode=round_mode,
                         origin=drafting.origin if r.proposed else None, plain_step=plain_step, fed=k + 1)
            equivalent = self.costs.plain_equivalent(r.proposed, r.verify_s, r.draft_s + r.verify_s + other_s,
                                                     plain_step, fed=k + 1)
            switched = self.schedule.verdict(params, round_mode, kept, equivalent) or switched
        self._apply_switch(switched)
        notice = self._close_round(stats, notice, switched)
        origin = drafting.origin if any(r.proposed for r in chain) else None
        event = RoundEvent(tuple(emitted), tuple(sources[: len(emitted)]), stats.snapshot(), finish, notice, origin)
        return event, len(emitted)

    def _chain_drafting(self: Decoder) -> ChainDrafting:
        """The drafter's side of a chain: its model's captured steps, or its lookup on the device
        (kept from chain to chain: its copy of the sequence is only uploaded where it differs)."""
        if isinstance(self.drafter, ModelDrafter):
            return ModelChainDraft(self.drafter)
        assert isinstance(self.drafter, NgramDrafter)
        if self._lookup_chain is None:
            self._lookup_chain = DeviceLookup(self.drafter, self.target.window, self.device)
        return self._lookup_chain

    def _chain_goes_on(self: Decoder, seq: list[int], params: GenerationParams, generator: Randomness, produced: int) -> bool:
        """Whether the chain after the queued one should be queued too: not when the schedule wants
        something else next (a calibration burst, plain decoding, a lookup's copy that pays)."""
        if self.mode == "plain" or self.schedule.calibrating(self.mode):
            return False
        return not self._lookup_first(seq, params, generator, self._room(seq, params, produced)[1]).tokens
