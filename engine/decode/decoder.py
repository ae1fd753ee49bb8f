"""The speculative decoding loop: draft, verify, crop, emit.

Each round (Leviathan et al. 2022; Chen et al. 2023):

1. choose K (fixed, or from the measured costs: :mod:`engine.decode.cost_model`);
2. the drafter proposes up to K tokens;
3. the target scores the pending token plus the draft in **one** forward pass;
4. the longest accepted prefix is kept and the target adds one token of its
   own (:mod:`engine.decode.verify`);
5. stop conditions cut the emitted tokens; both caches are cropped to the
   accepted sequence; an event is yielded.

Plain decoding is the same loop with K = 0, so every comparison runs the same
code. Cache invariant after every round: the target's cache holds the whole
sequence except its last token (the pending one, fed at the next round).
"""
from __future__ import annotations

import numbers
import threading
from collections.abc import Iterator, Sequence

from transformers import PreTrainedModel

from engine.model.device import Device
from engine.decode.drafters import EMPTY_DRAFT, Draft, Drafter, ModelDrafter
from engine.errors import ContextLengthError
from engine.events import NOT_PAYING, OFF_BY_USER, FinishReason, GenerationParams, Mode, RoundEvent, TokenSource
from engine.decode.runner import ModelRunner
from engine.decode.sampling import GumbelNoise, Randomness, make_randomness, warp
from engine.decode.schedule import Schedule
from engine.decode.cost_model import CostModel
from engine.decode.tally import ReplyTally
from engine.decode.read_once import draft_and_verify, matching
from engine.decode.chain import QueuedChain, chain_rounds
from engine.decode.chain_drafts import DeviceLookup
from engine.decode.device_rounds import DeviceRounds
from engine.decode.recovery import DraftRecovery
from engine.decode.verify import Verdict, verify_coupled, verify_greedy, verify_sampled

BURST = 8
"""Plain steps a round on a card. Each step's pick feeds the next pass on the device and the
picks come back in one transfer, so the host queues step i + 1 while the card runs step i: at
batch size one a card's step is short enough that the host's share (0.8 ms a token on an H200,
docs/gpu.md) would otherwise add to it. The same passes as one step a round (the one-token
pass, the same pick: argmax, seeded Gumbel-argmax or a draw with the reply's generator), so the
same tokens; a stop token ends the reply where it stands, the steps after it are cropped. On the
CPU, whose passes are synchronous, one step a round."""


class SpecDecoder(DeviceRounds, DraftRecovery):
    """Owns the target's runner, the drafter, and the measured cost model.

    Args:
        target_model: the model whose output is reproduced exactly.
        device: where both models live.
        drafter: a :class:`~engine.decode.drafters.Drafter`, or None for plain decoding.
        calibrate_every: while speculating, run a plain step (K = 0) when no
            round of the session fed one token for this many rounds (every
            other round until :data:`engine.decode.pass_costs.MIN_PLAIN` were seen): the
            plain step is measured, never extrapolated (``engine.decode.pass_costs``).
            0: never; the speedup then stays unknown unless the drafter
            itself leaves rounds empty (an n-gram miss).
        auto_off_window: with adaptive K, the rounds of evidence needed before
            speculation switches itself off (:mod:`engine.decode.auto_switch`: speedup
            below 0.95 and its upper confidence bound below 1.0); it is tried
            again later (0 disables the check).
        reprobe_after: plain rounds after an automatic switch-off before
            speculation is tried again (doubling with each further switch-off).
        window: the context window, tokens of prompt + reply (None: no limit).
            A prompt must leave room for one new token; a reply stops with
            finish reason ``context`` when the sequence fills the window, and
            no round feeds a position at or past it.
        costs: the measured cost model to start from (the bench keeps one per
            method across replies); None: a fresh one.
    """

    def __init__(
        self,
        target_model: PreTrainedModel,
        device: Device,
        drafter: Drafter | None = None,
        *,
        calibrate_every: int = 32,
        auto_off_window: int = 32,
        reprobe_after: int = 64,
        window: int | None = None,
        costs: CostModel | None = None,
    ) -> None:
        self.device = device
        self.target = ModelRunner(target_model, device, window=window)
        self.drafter = drafter
        draft_runner = getattr(drafter, "runner", None)
        if isinstance(draft_runner, ModelRunner):  # the draft's cache is capped at the window too
            draft_runner.set_window(window)
        self.costs = costs or CostModel()
        self.schedule = Schedule(self.costs, calibrate_every, auto_off_window, reprobe_after)
        self.window = window
        self.speculation_enabled = True
        self.off_reason: str | None = None
        """Why speculation is off for now (by hand, or switched off automatically: :data:`NOT_PAYING`)."""
        self.off_detail: str | None = None
        """The evidence behind an automatic switch-off."""
        self.fallback_reason: str | None = None
        """Why the drafter was dropped for good (out of memory)."""
        self.burst = BURST if device.is_cuda else 1
        """Plain greedy steps a round (:data:`BURST`)."""
        self.chain = chain_rounds(device.is_cuda)
        """Greedy model-drafted rounds queued before one read-back (:mod:`engine.decode.chain`)."""
        self._queued: QueuedChain | None = None
        """A chain queued behind the one being read (:meth:`_chain_round`), not read yet."""
        self._lookup_chain: DeviceLookup | None = None
        """A lookup drafter's copy of the sequence on the device, for chains (:mod:`engine.decode.chain_drafts`)."""

    @property
    def mode(self) -> Mode:
        """What runs now: ``spec`` (model draft), ``ngram`` or ``plain``."""
        if self.drafter is None or not self.speculation_enabled:
            return "plain"
        return "spec" if self.drafter.kind == "model" else "ngram"

    @property
    def plain_reason(self) -> str | None:
        """Why decoding is plain, if it is: the drafter dropped for good comes first."""
        return self.fallback_reason or self.off_reason

    def set_speculation(self, enabled: bool) -> None:
        """Switch speculation on or off by hand (also undoes an automatic switch-off). On over
        an automatic switch-off, it is forced on (:class:`~engine.decode.auto_switch.AutoSwitch`)."""
        forced = enabled and not self.speculation_enabled and self.off_reason == NOT_PAYING
        self.speculation_enabled = enabled
        self.off_reason = None if enabled else OFF_BY_USER
        self.off_detail = None
        self.schedule.switch.reset(forced)

    def compile_now(self) -> float:
        """Compile the target's and a model draft's static passes now, not at the first reply
        (:meth:`ModelRunner.compile_now`); the seconds spent (0 where nothing compiles)."""
        runner = getattr(self.drafter, "runner", None)
        return sum(r.compile_now() for r in (self.target, *([runner] if isinstance(runner, ModelRunner) else [])))

    def close(self) -> None:
        """Release both models' caches and references."""
        self._release(target=True)

    def _release(self, *, target: bool) -> None:
        self._queued, self._lookup_chain = None, None
        if self.drafter is not None:
            self.drafter.release()
            self.drafter = None
        if target:
            self.target.release()
        self.device.release_memory()

    def generate(
        self,
        prompt_ids: Sequence[int],
        params: GenerationParams,
        cancel: threading.Event | None = None,
    ) -> Iterator[RoundEvent]:
        """Decode a reply to ``prompt_ids`` (``[L]`` ids, the whole conversation).

        The part of the prompt already in the target's cache (a previous chat
        turn) is reused; only the rest is prefilled. Yields one
        :class:`RoundEvent` per round; the last one carries ``finish_reason``.
        ``cancel`` is checked between rounds; caches stay consistent.
        """
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        if self.window is not None and len(prompt_ids) >= self.window:
            raise ContextLengthError(
                f"the prompt is {len(prompt_ids)} tokens but the context window holds {self.window} "
                "(prompt and reply together); shorten it or start a new chat"
            )
        bad = next((t for t in prompt_ids if isinstance(t, bool) or not isinstance(t, numbers.Integral)
                    or not 0 <= t < self.target.vocab_size), None)
        if bad is not None:  # an id past the vocabulary raised a bare IndexError deep in the embedding
            raise ValueError(f"prompt token id {bad!r} is not a token of this model: ids are whole numbers "
                             f"from 0 to {self.target.vocab_size - 1}")
        seq = list(prompt_ids)
        self._queued = None  # a chain left queued by a reply that ended early: its work is dropped
        self._plan_captures(params)
        self.schedule.switch.new_reply()
        self.costs.new_reply()
        generator = make_randomness(params.sampling, len(seq), self.target.vocab_size, self.device)
        drafter_name = self.drafter.name if self.drafter is not None else "none"
        stats = ReplyTally(self.mode, drafter_name, params.k is None and self.mode != "plain", self.costs)
        stats.speculation_off_reason = self.plain_reason
        stats.speculation_off_detail = self.off_detail if self.fallback_reason is None else None
        start = self.device.mark()
        notice = self._prefill(seq, cancel)
        stats.prefill_s = self.device.seconds_between([start, self.device.mark()])[0]
        produced = 0
        for round_index in range(params.max_new_tokens):
            if cancel is not None and cancel.is_set():
                yield RoundEvent((), (), stats.snapshot(), "cancelled", notice)
                return
            if self._queued is not None:  # a chain queued behind the last one: read it first
                event, n_emitted = self._chain_round(seq, params, generator, stats, produced, notice,
                                                     more=self._chain_goes_on(seq, params, generator, produced))
            elif self.burst > 1 and (self.mode == "plain" or self.schedule.calibrating(self.mode)):
                event, n_emitted = self._burst_round(seq, params, generator, stats, produced, notice)
            else:
                event, n_emitted = self._round(seq, params, generator, stats, round_index, produced, notice)
            notice = None
            produced += n_emitted
            yield event
            if event.finish_reason is not None:
                return

    def _round(
        self,
        seq: list[int],
        params: GenerationParams,
        generator: Randomness,
        stats: ReplyTally,
        round_index: int,
        produced: int,
        notice: str | None = None,
    ) -> tuple[RoundEvent, int]:
        """One draft-verify round; extends ``seq`` in place."""
        budget, remaining = self._room(seq, params, produced)
        round_mode = self.mode
        policy_k = self.schedule.policy_k(self.drafter, self.speculation_enabled, params)
        k = 0 if self.schedule.calibrating(round_mode) else min(policy_k, remaining - 1)
        # Marks, not clock reads: on CUDA each is an event, and the round waits for the card
        # once (the verdict's transfer), not at every mark (Device.mark).
        t_start = self.device.mark()
        draft = EMPTY_DRAFT
        verdict: Verdict | None = None
        free = self.drafter is not None and self.drafter.free_proposals and params.k is None
        looked_up = EMPTY_DRAFT if free or k == 0 else self._lookup_first(seq, params, generator, remaining)
        chain_k = self.schedule.chain_k(self.drafter, k, params)
        rounds = 0 if looked_up.tokens or k == 0 else self._chain_length(seq, params, chain_k, remaining)
        if rounds > 1:  # greedy rounds decided on the card, a model's draft or a lookup's (engine/decode/chain.py)
            return self._chain_round(seq, params, generator, stats, produced, notice, (chain_k, rounds))
        if looked_up.tokens:  # a copy that pays more than the draft model this round: trim it like a free draft
            k = self.schedule.free_k(params, len(looked_up.tokens), looked_up.key)
            draft = looked_up.first(k)
        elif k > 0 and isinstance(self.drafter, ModelDrafter) and matching(params, generator):
            stage = ["drafting"]  # where an out-of-memory struck, for the notice
            (draft, verdict, t_draft), dropped = self._guarded(
                lambda: draft_and_verify(self.target, self.drafter, self.device, seq, k, params, generator, stage),  # type: ignore[arg-type]
                lambda: f"out of memory while {stage[0]}",
                lambda: self._verify_alone(seq, params, generator),
            )
            notice = dropped or notice
        elif k > 0 and self.drafter is not None:
            # Free proposals (a lookup): ask for the most, then keep the K that
            # pays for this kind of draft: the match and the fitted verification
            # cost are the limit, not caution. (The lambda reads self.drafter when
            # called, so no local reference keeps a failed draft alive.)
            n = min(params.k_max, remaining - 1) if free else k
            draft, dropped = self._guarded(
                lambda: self.drafter.propose(seq, n, params.sampling, generator),  # type: ignore[union-attr]
                "out of memory while drafting",
                lambda: EMPTY_DRAFT,
            )
            notice = dropped or notice
            if free and draft.tokens:
                k = self.schedule.free_k(params, len(draft.tokens), draft.key)
            draft = draft.first(k)
        if verdict is None:
            t_draft = self.device.mark()
            verdict, dropped = self._guarded(
                lambda: self._verify(seq, draft, params, generator),
                "out of memory while verifying a draft",
                lambda: self._verify(seq, EMPTY_DRAFT, params, generator),
            )
            if dropped is not None:
                notice, draft = dropped, EMPTY_DRAFT
        t_verify = self.device.mark()

        sources: list[TokenSource] = ["draft"] * verdict.n_accepted + ["target"]
        emitted, finish = self._emit(seq, [*draft.tokens[: verdict.n_accepted], verdict.next_token], params, budget,
                                     remaining)
        t_end = self.device.mark()

        draft_s, verify_s, other_s = self.device.seconds_between([t_start, t_draft, t_verify, t_end])
        drafted = len(draft.tokens)
        copied = free or bool(looked_up.tokens)
        # With bursts (a card), only a burst samples the plain step (CostModel.observe).
        plain_step = self.burst == 1
        self.costs.observe(drafted, verdict.n_accepted, draft_s, verify_s, other_s, draft.key, free=copied,
                           plain_step=plain_step)
        # The K shown: the policy's, or for a free draft the K it was trimmed to (kept on a miss).
        shown_k = policy_k if not copied else (k if drafted else stats.k)
        origin = draft.origin if drafted else None
        stats.record(shown_k, drafted, verdict.n_accepted, len(emitted), draft_s, verify_s, other_s,
                     mode=round_mode, origin=origin, plain_step=plain_step)
        plain_equivalent = self.costs.plain_equivalent(drafted, verify_s, draft_s + verify_s + other_s, plain_step)
        switched = self.schedule.verdict(params, round_mode, len(emitted), plain_equivalent)
        self._apply_switch(switched)
        notice = self._close_round(stats, notice, switched)
        event = RoundEvent(tuple(emitted), tuple(sources[: len(emitted)]), stats.snapshot(), finish, notice, origin)
        return event, len(emitted)

    def _room(self, seq: list[int], params: GenerationParams, produced: int) -> tuple[int, int]:
        """``(budget, remaining)``: the reply's tokens still allowed, and of those the ones the
        window still has room for (a round feeds no position at or past the window, and the
        reply ends when it is full)."""
        budget = params.max_new_tokens - produced
        return budget, budget if self.window is None else min(budget, self.window - len(seq))

    def _emit(self, seq: list[int], tokens: list[int], params: GenerationParams, budget: int,
              remaining: int) -> tuple[list[int], FinishReason | None]:
        """Keep the round's ``tokens`` up to a stop condition: extend ``seq``, crop the target's
        cache to all of it but its last token (the one place a round crops) and tell the drafter.
        Returns the kept tokens and the finish reason (``context`` where the window ended it)."""
        emitted, finish = params.cut(tokens, remaining)
        if finish == "length" and remaining < budget:
            finish = "context"
        seq.extend(emitted)
        self.target.truncate(len(seq) - 1)
        if self.drafter is not None:
            self.drafter.commit(seq)
        return emitted, finish

    def _apply_switch(self, switched: tuple[bool, str] | None) -> None:
        """Speculation switched on or off by the schedule's verdict, if it was (quiet: the stats
        say it, :data:`NOT_PAYING`, no notice)."""
        if switched is not None:
            on, detail = switched
            self.speculation_enabled, self.off_reason = on, None if on else NOT_PAYING
            self.off_detail = None if on else detail

    def _close_round(self, stats: ReplyTally, notice: str | None, switched: tuple[bool, str] | None) -> str | None:
        """The round's notice (with news of a runner's passes) and, where something changed, the
        mode and the reason for plain decoding that the stats show from now on."""
        stats.mode = self.mode
        notice = notice or self._capture_notice()
        if notice is not None or switched is not None:
            stats.speculation_off_reason = self.plain_reason
            stats.speculation_off_detail = self.off_detail if self.fallback_reason is None else None
        return notice

    def _runners(self) -> list[ModelRunner]:
        draft_runner = getattr(self.drafter, "runner", None)
        return [self.target, *([draft_runner] if isinstance(draft_runner, ModelRunner) else [])]

    def _plan_captures(self, params: GenerationParams) -> None:
        """Tell the runners which pass shapes this reply's schedule uses (K + 1 up to its widest K)."""
        k_max = params.k if params.k is not None else params.k_max
        for runner in self._runners():
            runner.plan_captures(k_max)

    def _capture_notice(self) -> str | None:
        """Why a runner's passes went eager (a capture failed), once; None when nothing is new."""
        notices = [n for n in (runner.capture.take_notice() for runner in self._runners()) if n]
        return "; ".join(notices) or None

    def _lookup_first(self, seq: list[int], params: GenerationParams, generator: Randomness, remaining: int) -> Draft:
        """The model drafter's lookup's copy of what followed the context's last tokens, when
        it has one and the measured costs say it beats the model this round; else empty."""
        lookup = getattr(self.drafter, "lookup", None)
        if lookup is None or params.k is not None:
            return EMPTY_DRAFT
        draft: Draft = lookup.propose(seq, min(params.k_max, remaining - 1), params.sampling, generator)
        if draft.tokens and self.schedule.lookup_pays(params, len(draft.tokens), draft.key):
            return draft
        return EMPTY_DRAFT

    def _verify(
        self,
        seq: list[int],
        draft: Draft,
        params: GenerationParams,
        generator: Randomness,
    ) -> Verdict:
        """Score ``[pending, *draft]`` in one target pass and decide.

        Row ``r`` of the target's logits chooses the token at sequence index
        ``len(seq) + r``: seeded sampling takes that position's Gumbel row.
        """
        if len(self.target) != len(seq) - 1:
            raise AssertionError(f"target cache holds {len(self.target)} tokens, expected {len(seq) - 1}")
        fed = [seq[-1], *draft.tokens]
        logits = self.target.forward(fed, logits_to_keep=len(fed))
        if params.sampling.greedy:
            return verify_greedy(logits, draft.tokens)
        if isinstance(generator, GumbelNoise):
            return verify_coupled(logits, draft.tokens, params.sampling, generator.rows(len(seq), len(fed)))
        p = warp(logits, params.sampling)
        return verify_sampled(p, draft.tokens, draft.probs, generator, self.device)

    def _prefill(self, seq: list[int], cancel: threading.Event | None = None) -> str | None:
        """Feed the uncached part of the prompt, all but its last token, to the target and
        then to the drafter (not billed as draft-step cost); returns an OOM fallback's notice.
        With ``cancel``, the target stops reading between two pieces once it is set
        (:meth:`ModelRunner.catch_up`; the reply's first round sees the flag and ends it)."""
        read = lambda: self.target.catch_up(seq, cancel)  # noqa: E731
        _, notice = self._guarded(read, "out of memory while reading the prompt", read)
        if cancel is not None and cancel.is_set():
            return notice
        if self.drafter is not None and self.speculation_enabled:
            _, dropped = self._guarded(
                lambda: self.drafter.prefill(seq, cancel),  # type: ignore[union-attr]
                "out of memory while the draft read the prompt",
                lambda: None,
            )
            notice = dropped or notice
        return notice
