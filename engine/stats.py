"""Measuring speculation, and choosing K from the measurements.

:class:`CostModel` lives as long as the loaded pair: it learns what a draft
step and a target pass of ``n`` tokens cost on this machine, how often each
draft position is accepted, and how fast plain decoding is. :class:`ReplyStats`
counts one reply and produces the :class:`~engine.events.Stats` snapshots.

How the speedup is measured: some rounds run with K = 0, that is one plain
decoding step of the target through the same code path (the first round of
every reply, then every ``calibrate_every`` rounds, and any n-gram round that
found no match). Their wall time is the cost of plain decoding on this machine
at this context length; ``plain_tokens_per_s`` is the inverse of its recent
mean, and ``speedup = tokens_per_s / plain_tokens_per_s``.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.events import Mode, Stats

EMA = 0.2  # weight of the newest sample in running cost averages


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


@dataclass
class LinearCost:
    """A target pass's cost as ``t(n) = a + b * n`` over ``n`` tokens fed.

    Least squares with exponential forgetting (old rounds fade, so a longer
    context's higher cost is followed), fitted from every round: cheap, and
    unlike per-size averages it never predicts 9 tokens cheaper than 8.
    Until two sizes were seen, the slope is assumed to be ``PRIOR_SLOPE`` of
    the mean cost per extra token.
    """

    PRIOR_SLOPE = 0.1
    decay: float = 0.98
    w: float = 0.0
    sn: float = 0.0
    snn: float = 0.0
    st: float = 0.0
    snt: float = 0.0

    def add(self, n: int, t: float) -> None:
        d = self.decay
        self.w, self.sn, self.snn = d * self.w + 1, d * self.sn + n, d * self.snn + n * n
        self.st, self.snt = d * self.st + t, d * self.snt + n * t

    def predict(self, n: int) -> float | None:
        if self.w == 0:
            return None
        mean_n, mean_t = self.sn / self.w, self.st / self.w
        var = self.snn / self.w - mean_n**2
        if var > 0.05:
            slope = (self.snt / self.w - mean_n * mean_t) / var
        else:
            slope = self.PRIOR_SLOPE * mean_t
        return max(mean_t + max(slope, 0.0) * (n - mean_n), 0.0)


@dataclass
class CostModel:
    """Measured costs and acceptance for one loaded pair (seconds)."""

    draft_step_s: float | None = None
    passes: LinearCost = field(default_factory=LinearCost)  # target pass cost by tokens fed
    overhead_s: float = 0.0
    plain_round_s: deque[float] = field(default_factory=lambda: deque(maxlen=8))
    positions: dict[int, PositionCounts] = field(default_factory=dict)  # by Draft.key

    def observe(
        self, proposed: int, n_accepted: int, draft_s: float, verify_s: float, other_s: float, key: int = 0
    ) -> None:
        """Learn from one round that proposed ``proposed`` tokens of kind ``key``."""
        self.passes.add(proposed + 1, verify_s)
        self.overhead_s = (1 - EMA) * self.overhead_s + EMA * other_s
        if proposed == 0:
            self.plain_round_s.append(draft_s + verify_s + other_s)
            return
        per_step = draft_s / proposed
        self.draft_step_s = per_step if self.draft_step_s is None else (1 - EMA) * self.draft_step_s + EMA * per_step
        self.positions.setdefault(key, PositionCounts()).add(proposed, n_accepted)

    @property
    def plain_tokens_per_s(self) -> float | None:
        if not self.plain_round_s:
            return None
        return len(self.plain_round_s) / sum(self.plain_round_s)

    def acceptance(self, k: int, key: int = 0) -> list[float]:
        """Per-position acceptance estimates for positions ``1..k`` of drafts of
        kind ``key``; a kind not measured yet borrows from all kinds pooled."""
        counts = self.positions.get(key)
        if counts is None or not counts.reached:
            counts = PositionCounts()
            for other in self.positions.values():
                counts.add_counts(other)
        return counts.smoothed(k)

    def pass_cost(self, fed: int) -> float | None:
        """Estimated cost of a target pass over ``fed`` tokens (None before any pass)."""
        return self.passes.predict(fed)

    def choose_k(self, k_min: int, k_max: int, key: int = 0, draft_step_s: float | None = None) -> int:
        """K in ``[k_min, k_max]`` maximising expected tokens per second of a round.

        Rate(K) = expected_tokens(K) / (K * draft_step + pass(K + 1) + overhead),
        with acceptance measured for drafts of kind ``key``. ``draft_step_s``
        overrides the measured draft cost (0 for a drafter whose proposals are
        free, which is then trimmed to K after proposing). Before anything is
        measured, start in the middle of the range.
        """
        if k_max <= k_min:
            return k_min
        step = self.draft_step_s if draft_step_s is None else draft_step_s
        if step is None or self.passes.w == 0:
            return max(k_min, min(k_max, 4))
        accept = self.acceptance(k_max, key)
        best_k, best_rate = k_min, -1.0
        for k in range(k_min, k_max + 1):
            cost = k * step + (self.pass_cost(k + 1) or 0.0) + self.overhead_s
            rate = expected_tokens(accept, k) / max(cost, 1e-9)
            if rate > best_rate:
                best_k, best_rate = k, rate
        return best_k


@dataclass
class ReplyStats:
    """Counters for one reply; :meth:`snapshot` turns them into :class:`Stats`."""

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

    def record(self, k: int, proposed: int, n_accepted: int, emitted: int, draft_s: float, verify_s: float, other_s: float) -> None:
        """Count one round: ``k`` is the K in force (shown even on a plain
        calibration round), ``emitted`` the tokens kept after stop conditions."""
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

    def snapshot(self) -> Stats:
        decode_s = self.draft_s + self.verify_s + self.other_s
        tps = self.tokens / decode_s if decode_s > 0 and self.tokens else None
        plain = self.costs.plain_tokens_per_s
        return Stats(
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
            tau=self.tokens / self.target_passes if self.target_passes else None,
            per_position=self.positions.rates(),
            draft_s=self.draft_s,
            verify_s=self.verify_s,
            other_s=self.other_s,
            prefill_s=self.prefill_s,
            elapsed_s=decode_s + self.prefill_s,
            tokens_per_s=tps,
            itl_ms=1000 * decode_s / self.tokens if self.tokens else None,
            plain_tokens_per_s=plain,
            speedup=tps / plain if tps is not None and plain else None,
            speculation_off_reason=self.speculation_off_reason,
        )
