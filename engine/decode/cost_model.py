"""Choosing K from what speculation is measured to cost and to accept.

:class:`CostModel` lives as long as the loaded pair: it learns what a draft
step and a target pass of ``n`` tokens cost on this machine, how often each
draft position is accepted, and how fast plain decoding is, and chooses K
(:meth:`CostModel.choose_k`). One reply's counts and the speedup shown for it
are :mod:`engine.decode.tally`'s.
"""
from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

from engine.decode.pass_costs import MIN_SAMPLES, WINDOW, PassCosts, size_key

EMA = 0.2  # weight of the newest sample in the running draft-step average


REFRESH_EVERY = 6
"""Every this many decisions (rounds, a chain of rounds counting once; :attr:`CostModel.decisions`),
once the pass line is sound, adaptive K tries a neighbour of its best K (one more, then one
less), so that the costs it compares stay measured: on coder, slow passes
of three tokens in the first rounds after a prompt held K at 1 for a whole reply (31 tok/s
where K = 2 made 35), since K = 2 was never tried again to show it had got cheaper."""

REPLY_PRIOR = 8.0
"""Rounds' worth of weight the session's acceptance has in a reply's estimate for choosing K
(:meth:`CostModel.acceptance`): a reply starts from what the session saw and is soon judged by its
own rounds. How often drafts are accepted follows what is being written: on the bench's coder prompts
the per-token α was 0.64 on chat and 0.91-0.94 on code, and counts pooled over the session held K at
1 (1.1 drafted a pass) on code prompts that came after chat ones, where code alone chose K = 2-3."""

LOOKUP_TRUSTED = 4
"""Before anything is measured, a lookup match of at least this many tokens is taken over
the draft model (a copy in progress is accepted nearly always)."""


def expected_tokens(accept: list[float], k: int) -> float:
    """Expected tokens emitted by a round of K drafted tokens.

    ``accept[i]`` is the probability that position ``i + 1`` is accepted given
    that the ones before it were. With a constant α this is the paper's
    ``(1 - α^(K+1)) / (1 - α)``.
    """
    total, survive = 1.0, 1.0
    for i in range(k):
        survive *= accept[i]
        total += survive
    return total


@dataclass
class PositionCounts:
    """How often each draft position was reached and accepted.

    Position ``i + 1`` is *reached* when the ``i`` before it were accepted; its
    conditional acceptance rate is ``accepted[i] / reached[i]``.
    """

    reached: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)

    def add(self, proposed: int, n_accepted: int) -> None:
        while len(self.reached) < proposed:
            self.reached.append(0)
            self.accepted.append(0)
        for i in range(min(n_accepted + 1, proposed)):
            self.reached[i] += 1
        for i in range(n_accepted):
            self.accepted[i] += 1

    def add_counts(self, other: "PositionCounts") -> None:
        for i, (r, a) in enumerate(zip(other.reached, other.accepted)):
            if i == len(self.reached):
                self.reached.append(0)
                self.accepted.append(0)
            self.reached[i] += r
            self.accepted[i] += a

    def per_token(self) -> float | None:
        """The per-token α: accepted ÷ reached over all positions (None before any draft)."""
        reached = sum(self.reached)
        return sum(self.accepted) / reached if reached else None

    def rates(self) -> tuple[float, ...]:
        """Measured conditional acceptance per position (positions never reached left out)."""
        return tuple(a / r for a, r in zip(self.accepted, self.reached) if r)

    def smoothed(self, k: int, prior_weight: float = 2.0) -> list[float]:
        """Estimates for positions ``1..k``.

        Each position's rate is shrunk towards the estimate of the position
        before it (``prior_weight`` pseudo-observations; position 1 towards
        0.5), so a deep position reached once or never follows the shallower
        ones instead of jumping to 0 or 1 on a single round.
        """
        rates: list[float] = []
        prior = 0.5
        for i in range(k):
            reached = self.reached[i] if i < len(self.reached) else 0
            accepted = self.accepted[i] if i < len(self.accepted) else 0
            prior = (accepted + prior_weight * prior) / (reached + prior_weight)
            rates.append(prior)
        return rates


def _kind(positions: dict[int, PositionCounts], key: int) -> PositionCounts:
    """The counts of drafts of kind ``key``: its own, else the nearest measured kind below it,
    else all kinds pooled."""
    counts = positions.get(key)
    if counts is not None and counts.reached:
        return counts
    lower = [other for other, c in positions.items() if other < key and c.reached]
    if lower:
        return positions[max(lower)]
    pooled = PositionCounts()
    for other_counts in positions.values():
        pooled.add_counts(other_counts)
    return pooled


@dataclass
class CostModel:
    """Measured costs and acceptance for one loaded pair (seconds), for the whole session."""

    draft_step_s: float | None = None
    passes: PassCosts = field(default_factory=PassCosts)  # target pass cost by tokens fed, plain step
    decisions: int = 0
    """Rounds whose K the schedule chose: every round, except that a chain of rounds or a burst of
    plain steps on a card (one choice for all of them) counts once. The explore and refresh
    cadences count these, so that they keep their rhythm when rounds come eight at a time."""
    overheads: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))  # bookkeeping per round
    positions: dict[int, PositionCounts] = field(default_factory=dict)  # by Draft.key, the whole session
    reply_positions: dict[int, PositionCounts] = field(default_factory=dict)
    """The same counts for the reply being written (:meth:`new_reply` clears them)."""
    rounds_since_plain: int = 1 << 30  # rounds since the last one-token pass (calibration schedule)
    draft_rounds: dict[int, deque[float]] = field(default_factory=dict)
    """Draft time of the draft model's rounds by K (the newest :data:`WINDOW` of each). A round's
    first draft pass catches the draft up on what it has not seen: two tokens after a round whose
    K were all accepted, which is most rounds at small K, so a round of K costs more than K steps,
    and more so the smaller K is. A K's own median is its cost once it has :data:`MIN_SAMPLES`."""

    def observe(
        self, proposed: int, n_accepted: int, draft_s: float, verify_s: float, other_s: float, key: int = 0,
        free: bool = False, plain_step: bool = True, fed: int = 0, decided: bool = True,
    ) -> None:
        """Learn from one round that proposed ``proposed`` tokens of kind ``key`` (``free``: from a
        lookup, whose cost says nothing of the draft model's step), its target pass over ``fed``
        tokens (0: ``proposed + 1``; a chained lookup's round verifies ``K + 1`` whatever it found).
        A round whose pass fed one token is a sample of the plain step unless ``plain_step`` is
        False: on a card, plain decoding runs in bursts, so a lookup's miss (one synchronised
        step) costs more than a step of plain decoding and says nothing of it; the burst that
        calibrates does. ``decided``: whether the schedule chose this round's K (not so for the
        second and later rounds of a chain or steps of a burst: :attr:`decisions`)."""
        self.decisions += decided
        width = fed or proposed + 1
        self.passes.add(width, verify_s, draft_s + verify_s + other_s, draft_s, plain_sample=plain_step)
        self.overheads.append(other_s)
        if width == 1 and plain_step:
            self.rounds_since_plain = 0
            return
        self.rounds_since_plain += 1
        if proposed == 0:
            return
        if not free:
            per_step = draft_s / proposed
            self.draft_step_s = per_step if self.draft_step_s is None else (1 - EMA) * self.draft_step_s + EMA * per_step
            self.draft_rounds.setdefault(proposed, deque(maxlen=WINDOW)).append(draft_s)
        self.positions.setdefault(key, PositionCounts()).add(proposed, n_accepted)
        self.reply_positions.setdefault(key, PositionCounts()).add(proposed, n_accepted)

    def new_reply(self) -> None:
        """A reply starts: its acceptance is counted afresh (the session's stays, as its prior)."""
        self.reply_positions = {}

    @property
    def overhead_s(self) -> float:
        """Median bookkeeping time of a round (0 before any round)."""
        return statistics.median(self.overheads) if self.overheads else 0.0

    @property
    def plain_step_s(self) -> float | None:
        """The typical plain step here (median one-token round); None until sound."""
        return self.passes.plain_step_s

    @property
    def plain_tokens_per_s(self) -> float | None:
        """Typical plain speed (not load-corrected; a reply's figure is in its ReplyStats)."""
        step = self.passes.plain_step_s
        return 1.0 / step if step else None

    def plain_equivalent(self, proposed: int, verify_s: float, round_s: float, plain_step: bool = True,
                         fed: int = 0) -> float | None:
        """Plain tokens a round's time would have bought at its own load (None while unsound;
        ``plain_step`` and ``fed`` as for :meth:`observe`)."""
        return self.passes.plain_equivalent(size_key(fed or proposed + 1, plain_step), verify_s, round_s)

    def acceptance(self, k: int, key: int = 0) -> list[float]:
        """Per-position acceptance estimates for positions ``1..k`` of drafts of
        kind ``key``: this reply's counts, with the session's estimate as a prior worth
        :data:`REPLY_PRIOR` rounds. A kind not measured yet borrows from the nearest measured
        kind below it (an n-gram match longer than any seen is at least as good
        as the longest seen), else from all kinds pooled."""
        session = _kind(self.positions, key).smoothed(k)
        reply = _kind(self.reply_positions, key)
        rates = []
        for i, prior in enumerate(session):
            reached = reply.reached[i] if i < len(reply.reached) else 0
            accepted = reply.accepted[i] if i < len(reply.accepted) else 0
            rates.append((accepted + REPLY_PRIOR * prior) / (reached + REPLY_PRIOR))
        return rates

    def pass_cost(self, fed: int) -> float | None:
        """Estimated cost of a target pass over ``fed`` tokens, for choosing K (None before any pass)."""
        return self.passes.predict(fed)

    def draft_cost(self, k: int, step: float) -> float:
        """Seconds of the draft model's part of a round of K: the median of K's own rounds once
        measured (:attr:`draft_rounds`), else K steps of ``step``."""
        samples = self.draft_rounds.get(k)
        if samples is not None and len(samples) >= MIN_SAMPLES:
            return statistics.median(samples)
        return k * step

    def draft_measured(self, k: int) -> bool:
        """Whether rounds of K have given the draft's cost at K (:meth:`draft_cost`)."""
        return len(self.draft_rounds.get(k, ())) >= MIN_SAMPLES

    def round_cost(self, k: int, step: float, model: bool = False) -> float:
        """Predicted seconds of a round of K drafted tokens: the draft's part (``model``: the draft
        model's, :meth:`draft_cost`; else K steps of ``step``), a pass of K + 1, bookkeeping."""
        drafting = self.draft_cost(k, step) if model else k * step
        return drafting + (self.pass_cost(k + 1) or 0.0) + self.overhead_s

    def choose_k(
        self, k_min: int, k_max: int, key: int = 0, draft_step_s: float | None = None, explore: bool = False,
        refresh: bool = False,
    ) -> int:
        """K in ``[k_min, k_max]`` maximising expected tokens per second of a round.

        Rate(K) = expected_tokens(K) / (draft(K) + t(K + 1) + overhead),
        with acceptance measured per draft position for drafts of kind ``key``,
        t from the fitted line (:meth:`PassCosts.predict`; never the
        one-token cost, which takes another kernel) and draft(K) the draft model's
        measured rounds of K (:meth:`draft_cost`). ``draft_step_s``
        overrides the draft's cost with this much a step (0 for a drafter whose proposals are
        free: K is then bounded by the match and the verification cost only).
        Before anything is measured, start in the middle of the range.

        ``explore`` (a round that may try another K): while the line is not sound, one more
        than the best K, so that a second pass size gets measured (a line through one size
        and one-token passes once held K at 1: the step from the one-token kernel to the
        multi-token one read as a steep cost per token); then a neighbour of the best K whose
        draft cost is not measured yet. ``refresh``: a neighbour of the best K even when
        measured (one more, or one less on every other call), so old samples do not decide
        forever (:data:`REFRESH_EVERY`).
        """
        if k_max <= k_min:
            return k_min
        best = self._best(k_min, k_max, key, draft_step_s)
        if best is None:
            return max(k_min, min(k_max, 4))
        best_k = best[0]
        if explore and not self.passes.line_sound:
            return min(best_k + 1, k_max)
        if explore and draft_step_s is None:
            for k in (best_k + 1, best_k - 1):
                if k_min <= k <= k_max and not self.draft_measured(k):
                    return k
        if refresh:  # one refresh a REFRESH_EVERY passes: one more, then one less, in turn
            down = (self.decisions // REFRESH_EVERY) % 2 == 1 and best_k > k_min
            return best_k - 1 if down else min(best_k + 1, k_max)
        return best_k

    def _best(self, k_min: int, k_max: int, key: int, draft_step_s: float | None) -> tuple[int, float] | None:
        """The K in ``[k_min, k_max]`` with the highest expected rate (tokens per second of a
        round) and that rate; None until a draft step and a pass have been measured."""
        step = self.draft_step_s if draft_step_s is None else draft_step_s
        if step is None or self.passes.passes == 0:
            return None
        accept = self.acceptance(k_max, key)
        best_k, best_rate = k_min, -1.0
        for k in range(k_min, k_max + 1):
            rate = expected_tokens(accept, k) / max(self.round_cost(k, step, model=draft_step_s is None), 1e-9)
            if rate > best_rate:
                best_k, best_rate = k, rate
        return best_k, best_rate

    def lookup_pays(self, k_min: int, k_max: int, proposed: int, key: int) -> bool:
        """Whether a free lookup draft of ``proposed`` tokens whose match is of kind ``key`` is
        expected to emit tokens faster than the draft model would this round (kind 0, its
        measured step). Until both can be estimated, only a long match (at least
        ``LOOKUP_TRUSTED`` tokens) is taken."""
        lookup = self._best(min(k_min, proposed), proposed, key, 0.0)
        model = self._best(k_min, k_max, 0, None)
        if lookup is None or model is None or 0 not in self.positions:
            return key >= LOOKUP_TRUSTED
        return lookup[1] >= model[1]
