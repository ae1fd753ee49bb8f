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
class CostModel:
    """Measured costs and acceptance for one loaded pair (seconds)."""

    draft_step_s: float | None = None
    pass_s: dict[int, float] = field(default_factory=dict)  # target pass cost by tokens fed
    overhead_s: float = 0.0
    plain_round_s: deque[float] = field(default_factory=lambda: deque(maxlen=8))
    reached: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)

    def observe(self, proposed: int, n_accepted: int, draft_s: float, verify_s: float, other_s: float) -> None:
        """Learn from one round that proposed ``proposed`` tokens."""
        fed = proposed + 1
        old = self.pass_s.get(fed)
        self.pass_s[fed] = verify_s if old is None else (1 - EMA) * old + EMA * verify_s
        self.overhead_s = (1 - EMA) * self.overhead_s + EMA * other_s
        if proposed == 0:
            self.plain_round_s.append(draft_s + verify_s + other_s)
            return
        per_step = draft_s / proposed
        self.draft_step_s = per_step if self.draft_step_s is None else (1 - EMA) * self.draft_step_s + EMA * per_step
        while len(self.reached) < proposed:
            self.reached.append(0)
            self.accepted.append(0)
        for i in range(min(n_accepted + 1, proposed)):
            self.reached[i] += 1
        for i in range(n_accepted):
            self.accepted[i] += 1

    @property
    def plain_tokens_per_s(self) -> float | None:
        if not self.plain_round_s:
            return None
        return len(self.plain_round_s) / sum(self.plain_round_s)

    def acceptance(self, k: int) -> list[float]:
        """Per-position acceptance estimates for positions ``1..k``.

        Each is smoothed with a Beta(1, 1) prior; a position never reached
        borrows the estimate of the deepest one measured.
        """
        rates: list[float] = []
        for i in range(k):
            if i < len(self.reached) and self.reached[i] > 0:
                rates.append((self.accepted[i] + 1) / (self.reached[i] + 2))
            else:
                rates.append(rates[-1] if rates else 0.5)
        return rates

    def pass_cost(self, fed: int) -> float | None:
        """Estimated cost of a target pass over ``fed`` tokens: measured, or
        linearly inter-/extrapolated from the two nearest measured sizes."""
        if fed in self.pass_s:
            return self.pass_s[fed]
        sizes = sorted(self.pass_s)
        if not sizes:
            return None
        if len(sizes) == 1:
            return self.pass_s[sizes[0]]
        below = [s for s in sizes if s < fed]
        above = [s for s in sizes if s > fed]
        a, b = (below[-1], above[0]) if below and above else ((sizes[-2], sizes[-1]) if below else (sizes[0], sizes[1]))
        slope = (self.pass_s[b] - self.pass_s[a]) / (b - a)
        return max(self.pass_s[a] + slope * (fed - a), 0.0)

    def choose_k(self, k_min: int, k_max: int) -> int:
        """K in ``[k_min, k_max]`` maximising expected tokens per second of a round.

        Rate(K) = expected_tokens(K) / (K * draft_step + pass(K + 1) + overhead).
        Before anything is measured, start in the middle of the range.
        """
        if k_max <= k_min:
            return k_min
        if self.draft_step_s is None or not self.pass_s:
            return max(k_min, min(k_max, 4))
        accept = self.acceptance(k_max)
        best_k, best_rate = k_min, -1.0
        for k in range(k_min, k_max + 1):
            cost = k * self.draft_step_s + (self.pass_cost(k + 1) or 0.0) + self.overhead_s
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
    reached_pos: list[int] = field(default_factory=list)
    accepted_pos: list[int] = field(default_factory=list)
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
        while len(self.reached_pos) < proposed:
            self.reached_pos.append(0)
            self.accepted_pos.append(0)
        for i in range(min(n_accepted + 1, proposed)):
            self.reached_pos[i] += 1
        for i in range(n_accepted):
            self.accepted_pos[i] += 1

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
            per_position=tuple(a / r for a, r in zip(self.accepted_pos, self.reached_pos) if r),
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
