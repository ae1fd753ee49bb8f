"""One reply's counts, and the speedup it shows: :class:`ReplyTally`.

The decoder records every round here (:meth:`ReplyTally.record`); :meth:`ReplyTally.snapshot`
turns the counts into the :class:`~engine.events.ReplyStats` each event carries.

How the speedup is measured: from every round, not from a few plain ones.
:class:`~engine.decode.pass_costs.PassCosts` fits the target's pass cost t(n) against the
tokens fed robustly (per-size medians, a line through them, slow forgetting)
and takes the plain step from the median one-token round; a round's own target
pass tells the machine's load at that moment, so the plain speed is estimated
for the same stretch of time as the measured one (the module docstring of
:mod:`engine.decode.pass_costs` gives the estimator). Rounds with K = 0 (plain mode,
n-gram misses, rare calibration rounds) are counted and timed separately as a
cross-check (``ReplyStats.plain_rounds``, ``ReplyStats.plain_measured_tokens_per_s``).

The two acceptance figures (Leviathan et al. 2022 call the per-token one α):

* ``ReplyStats.alpha``, the **acceptance rate**: accepted ÷ proposed draft tokens.
  It depends on K: a per-token α of 0.8 at K = 5 accepts on average
  0.8 + 0.8² + ... + 0.8⁵ = 2.69 of 5 proposed, an acceptance rate of 0.54.
* ``ReplyStats.alpha_per_token``, the **per-token α** of the paper's formula
  τ = (1 - α^(K+1)) / (1 - α): the chance that a drafted token is accepted
  given that the ones before it were, estimated from per-position counts as
  (accepted) ÷ (positions reached), the maximum-likelihood α when every
  position is accepted with the same chance.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine.decode.cost_model import CostModel, PositionCounts
from engine.decode.pass_costs import size_key
from engine.events import PLAIN_REPLY, TOO_NOISY, TOO_SHORT, DraftOrigin, Mode, OriginFigures, ReplyStats

SPEEDUP_FLOOR = {"tokens": 32, "drafting_rounds": 8, "plain_samples": 8}
"""The evidence a reply's speedup needs before any view shows it: this many tokens in the
reply, rounds of it that drafted something, and one-token rounds (the plain step's samples,
session-wide). Below it the speedup is None and ``speedup_note`` says
:data:`~engine.events.TOO_SHORT`: an 8-token reply, or a plain speed from a handful of
calibration rounds, gave figures like 0.37× and 4.16×."""

SPEEDUP_MAX_RELATIVE_SE = 0.25
"""The largest standard error, relative to the figure, at which a speedup is shown (two standard
errors then span ±50% of it); above it the speedup is None and ``speedup_note`` says
:data:`~engine.events.TOO_NOISY`. The app on a loaded machine showed "1.07× ± 3.22"."""


@dataclass
class ReplyTally:
    """Counters for one reply; :meth:`snapshot` turns them into :class:`ReplyStats`."""

    mode: Mode
    drafter: str
    adaptive: bool
    costs: CostModel
    k: int = 0
    rounds: int = 0
    target_passes: int = 0
    proposed: int = 0
    accepted: int = 0
    tokens: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    other_s: float = 0.0
    prefill_s: float = 0.0
    positions: PositionCounts = field(default_factory=PositionCounts)
    speculation_off_reason: str | None = None
    speculation_off_detail: str | None = None
    mode_tokens: dict[str, int] = field(default_factory=dict)
    plain_rounds: int = 0
    plain_rounds_s: float = 0.0
    origins: dict[DraftOrigin, list[int]] = field(default_factory=dict)
    """Per draft origin: rounds, proposed, accepted, emitted (the order they first drafted)."""
    drafting_rounds: int = 0
    evidence: list[float] = field(default_factory=lambda: [0.0] * 6)
    """Sums over rounds with a plain equivalent ``c`` (tokens emitted ``e``), each valued as the round
    ended: count, e, c, e², ec, c². The speedup is e ÷ c, and its standard error comes from the same
    sums (the spread of the per-round ratio): one estimate and its own uncertainty."""

    def record(
        self, k: int, proposed: int, n_accepted: int, emitted: int, draft_s: float, verify_s: float,
        other_s: float, mode: Mode | None = None, origin: DraftOrigin | None = None, plain_step: bool = True,
        fed: int = 0,
    ) -> None:
        """Count one round: ``k`` is the K in force (shown even on a plain
        calibration round), ``emitted`` the tokens kept after stop conditions,
        ``mode`` the mode the round ran in (default: the reply's), ``origin`` who
        drafted it (None: nothing was proposed), ``plain_step`` and ``fed`` as for
        :meth:`CostModel.observe` (a round that is not a sample of the plain step is neither
        valued at t(1) nor counted among the plain rounds).

        A stop condition that cut the round inside its accepted draft (a drafted end of
        text, the length limit) leaves the drafts after the cut unused: the reply's counts
        take the ``emitted`` kept ones, all accepted, so α and τ describe the same tokens
        (a 9-token reply read "accepted 0.50 · τ 1.00" from two drafts accepted past its end).
        The pass's width and the cost model (its caller's) keep the round as verified."""
        width = fed or proposed + 1
        if emitted <= n_accepted:
            proposed = n_accepted = emitted
        self.k = k
        self.rounds += 1
        self.target_passes += 1
        self.proposed += proposed
        self.accepted += n_accepted
        self.tokens += emitted
        self.draft_s += draft_s
        self.verify_s += verify_s
        self.other_s += other_s
        self.positions.add(proposed, n_accepted)
        wall = draft_s + verify_s + other_s
        size = size_key(width, plain_step)
        plain_equivalent = self.costs.passes.plain_equivalent(size, verify_s, wall)
        if plain_equivalent is not None:
            e, c = float(emitted), plain_equivalent
            for i, x in enumerate((1.0, e, c, e * e, e * c, c * c)):
                self.evidence[i] += x
        round_mode = mode or self.mode
        self.mode_tokens[round_mode] = self.mode_tokens.get(round_mode, 0) + emitted
        if width == 1 and plain_step:
            self.plain_rounds += 1
            self.plain_rounds_s += wall
        elif proposed:
            self.drafting_rounds += 1
        if proposed and origin is not None:
            counts = self.origins.setdefault(origin, [0, 0, 0, 0])
            for i, n in enumerate((1, proposed, n_accepted, emitted)):
                counts[i] += n

    def ratio(self) -> float | None:
        """Tokens emitted over their plain equivalent, over the rounds valued so far; None while
        those rounds hold under half of the reply's tokens (the rest came before the plain step
        and the pass costs were known)."""
        _, e, c, *_ = self.evidence
        if c <= 0 or 2 * e < self.tokens:
            return None
        return e / c

    def speedup(self) -> tuple[float | None, float | None, str | None]:
        """``(speedup, standard error, note)``: :meth:`ratio` when the reply is past
        :data:`SPEEDUP_FLOOR` and known to within :data:`SPEEDUP_MAX_RELATIVE_SE`, else None and
        why (:data:`~engine.events.PLAIN_REPLY`, :data:`~engine.events.TOO_SHORT`,
        :data:`~engine.events.TOO_NOISY`).

        The error combines the spread of the rounds' own ratios (tokens emitted over
        plain equivalent; a ratio estimator's delta-method error) with that of the
        plain step it is measured against (the median of the one-token rounds)."""
        if self.tokens and not self.proposed:
            return None, None, PLAIN_REPLY
        floor = SPEEDUP_FLOOR
        value = self.ratio()
        if (value is None or value <= 0 or self.tokens < floor["tokens"]
                or self.drafting_rounds < floor["drafting_rounds"]
                or self.costs.passes.plain_samples < floor["plain_samples"]):
            return None, None, TOO_SHORT
        n, e, c, ee, ec, cc = self.evidence
        relative = 0.0
        if n >= 2:
            spread = max(ee - 2 * value * ec + value * value * cc, 0.0) / (n - 1)
            relative += spread / n / (c / n) ** 2 / value ** 2
        relative += self.costs.passes.plain_step_relative_se() ** 2
        if math.sqrt(relative) > SPEEDUP_MAX_RELATIVE_SE:
            return None, None, TOO_NOISY
        return value, value * math.sqrt(relative), None

    def snapshot(self) -> ReplyStats:
        decode_s = self.draft_s + self.verify_s + self.other_s
        tps = self.tokens / decode_s if decode_s > 0 and self.tokens else None
        ratio = self.ratio() if self.tokens else None
        speedup, speedup_se, speedup_note = self.speedup()
        return ReplyStats(
            mode=self.mode,
            drafter=self.drafter,
            k=self.k,
            adaptive=self.adaptive,
            rounds=self.rounds,
            target_passes=self.target_passes,
            proposed=self.proposed,
            accepted=self.accepted,
            tokens=self.tokens,
            alpha=self.accepted / self.proposed if self.proposed else None,
            alpha_per_token=self.positions.per_token(),
            tau=self.tokens / self.target_passes if self.target_passes else None,
            per_position=self.positions.rates(),
            draft_s=self.draft_s,
            verify_s=self.verify_s,
            other_s=self.other_s,
            prefill_s=self.prefill_s,
            elapsed_s=decode_s + self.prefill_s,
            tokens_per_s=tps,
            itl_ms=1000 * decode_s / self.tokens if self.tokens else None,
            plain_tokens_per_s=tps / ratio if tps and ratio else None,  # so speedup = tok/s ÷ plain tok/s
            speedup=speedup,
            speedup_se=speedup_se,
            speedup_note=speedup_note,
            plain_rounds=self.plain_rounds,
            plain_measured_tokens_per_s=self.plain_rounds / self.plain_rounds_s if self.plain_rounds_s > 0 else None,
            mode_tokens=tuple((m, n) for m, n in self.mode_tokens.items() if n),
            speculation_off_reason=self.speculation_off_reason,
            speculation_off_detail=self.speculation_off_detail,
            by_origin=tuple(OriginFigures(o, *counts) for o, counts in self.origins.items()),
        )
