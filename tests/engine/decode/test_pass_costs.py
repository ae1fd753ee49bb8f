"""The plain-speed estimator behind the speedup, and K chosen from recorded costs.

Rounds are fed with synthetic times (a fake clock): the figures must follow
the costs, not the load, and a single slow round must not move them.
"""
from __future__ import annotations

import random

import pytest

from engine.decode.pass_costs import MIN_PLAIN, PassCosts, speedup_upper_bound
from engine.decode.cost_model import CostModel, ReplyStats, expected_tokens

# The int4 pocket target as the lead measured it: 1 token 10 ms, 5 tokens 16 ms.
ONE, SLOPE, BASE, OTHER = 0.010, 0.0015, 0.0085, 0.001


def verify_cost(n: int) -> float:
    return ONE if n == 1 else BASE + SLOPE * n


def play(stats: ReplyStats, costs: CostModel, proposed: int, accepted: int, emitted: int, load: float,
         stall: float = 0.0) -> None:
    """One round at ``load`` (every cost multiplied), its target pass delayed by ``stall`` seconds."""
    verify = verify_cost(proposed + 1) * load + stall
    other = OTHER * load
    costs.observe(proposed, accepted, 0.0, verify, other, key=8)
    stats.record(proposed, proposed, accepted, emitted, 0.0, verify, other)


def test_plain_step_is_a_median_and_one_slow_round_does_not_move_it() -> None:
    costs = PassCosts()
    for _ in range(MIN_PLAIN - 1):
        costs.add(1, 0.010, 0.011)
    assert costs.plain_step_s is None  # not sound yet
    costs.add(1, 0.010, 0.011)
    assert costs.plain_step_s == pytest.approx(0.011)
    costs.add(1, 1.0, 1.001)  # a stall of a second
    assert costs.plain_step_s == pytest.approx(0.011)


def test_line_through_sizes_two_up_ignores_outliers_and_never_gives_the_one_token_cost() -> None:
    costs = PassCosts()
    rng = random.Random(0)
    for _ in range(6):
        costs.add(1, 0.004, 0.005)  # the one-token kernel is much cheaper than the line says
        for n in (3, 5, 9):
            costs.add(n, verify_cost(n) * (1 + 0.01 * rng.random()), 0.0)
    costs.add(5, 2.0, 2.0)  # one pathological pass
    assert costs.line_sound
    assert costs.predict(7) == pytest.approx(verify_cost(7), rel=0.02)
    assert costs.typical(5) == pytest.approx(verify_cost(5), rel=0.02)
    assert costs.typical(1) == pytest.approx(0.004)  # measured, not the line's 0.010


def test_plain_decoding_reads_one_under_changing_load_and_a_stall() -> None:
    costs = CostModel()
    stats = ReplyStats("plain", "none", True, costs)
    for i in range(60):
        load = 1.0 if i < 20 else 3.0  # another process takes the core a third of the way in
        play(stats, costs, 0, 0, 1, load, stall=1.0 if i == 40 else 0.0)
        if i < MIN_PLAIN - 1:
            assert stats.snapshot().speedup is None  # "measuring…"
    snap = stats.snapshot()
    assert snap.speedup == pytest.approx(1.0, abs=0.01)
    assert snap.plain_rounds == 60 and snap.mode_tokens == (("plain", 60),)


def test_speculative_speedup_follows_the_costs_not_the_load() -> None:
    costs = CostModel()
    stats = ReplyStats("ngram", "n-gram lookup", True, costs)
    for i in range(80):
        load = 1.0 if i < 30 else 2.5
        stall = 0.5 if i == 50 else 0.0
        if i % 8 == 0:
            play(stats, costs, 0, 0, 1, load, stall)  # a miss: one plain step
        else:
            play(stats, costs, 4, 2, 3, load, stall)  # K = 4, two accepted plus the target's own
    # Ground truth at a steady load: plain costs ONE + OTHER per token; a miss
    # emits 1 token at that cost; a drafting round emits 3 for t(5) + OTHER.
    plain_tokens = 10 * 1 + 70 * (verify_cost(5) + OTHER) / (ONE + OTHER)
    truth = (10 + 70 * 3) / plain_tokens
    snap = stats.snapshot()
    assert snap.speedup == pytest.approx(truth, rel=0.01)
    assert snap.plain_rounds == 10
    assert snap.plain_measured_tokens_per_s is not None
    assert snap.speedup == pytest.approx(snap.tokens_per_s / snap.plain_tokens_per_s)


def test_two_acceptance_figures() -> None:
    """A per-token α of 0.8 at K = 5 shows as an acceptance rate of 0.54."""
    costs = CostModel()
    stats = ReplyStats("spec", "d", False, costs)
    rng = random.Random(1)
    for _ in range(20000):
        n = 0
        while n < 5 and rng.random() < 0.8:
            n += 1
        stats.record(5, 5, n, n + 1, 0.0, 0.0, 0.0)
    snap = stats.snapshot()
    assert snap.alpha_per_token == pytest.approx(0.8, abs=0.01)
    assert snap.alpha == pytest.approx(sum(0.8**i for i in range(1, 6)) / 5, abs=0.01)
    assert round(sum(0.8**i for i in range(1, 6)) / 5, 2) == 0.54


def test_upper_bound_needs_consistent_evidence() -> None:
    steady = [(1, 2.0)] * 16  # 0.5x every round
    ratio, upper = speedup_upper_bound(steady)
    assert ratio == pytest.approx(0.5) and upper == pytest.approx(0.5)
    noisy = [(4, 2.0), (1, 6.0)] * 4  # 0.625x overall, rounds all over the place
    ratio, upper = speedup_upper_bound(noisy)
    assert ratio == pytest.approx(0.625) and upper > 1.0


def recorded(costs: CostModel, key: int, alpha: float, rounds: int = 400, k: int = 16) -> None:
    """Rounds with the int4 costs (1% jitter) and geometric acceptance ``alpha`` at each position."""
    rng = random.Random(key)
    for _ in range(rounds):
        n = 0
        while n < k and rng.random() < alpha:
            n += 1
        fed = rng.choice([k, 6, 10])
        costs.observe(fed, min(n, fed), 0.0, verify_cost(fed + 1) * (1 + 0.01 * rng.random()), OTHER, key=key)
    for _ in range(MIN_PLAIN):
        costs.observe(0, 0, 0.0, ONE, OTHER)


@pytest.mark.parametrize("alpha, key", [(0.95, 16), (0.8, 8), (0.5, 3), (0.2, 1)])
def test_free_proposals_take_the_k_the_formula_says(alpha: float, key: int) -> None:
    costs = CostModel()
    recorded(costs, key, alpha)
    accept = costs.acceptance(16, key)
    assert accept[0] == pytest.approx(alpha, abs=0.06)
    rates = {k: expected_tokens(accept, k) / (BASE + SLOPE * (k + 1) + OTHER) for k in range(1, 17)}
    best = max(rates, key=rates.__getitem__)
    chosen = costs.choose_k(1, 16, key, draft_step_s=0.0)
    assert rates[chosen] >= 0.99 * rates[best]  # the fitted line is within jitter of the true one
    if alpha >= 0.9:
        assert chosen >= 10  # a copy in progress: as long as the verification cost allows
    if alpha <= 0.2:
        assert chosen <= 2


def test_a_one_token_kernel_step_no_longer_holds_k_at_one() -> None:
    """The old least-squares line through one-token and two-token passes read the
    step between the kernels (42 ms -> 70 ms here) as 28 ms per token and chose K = 1
    at α 0.82 forever, since only two sizes were ever fed."""
    costs = CostModel()
    for _ in range(8):
        costs.observe(0, 0, 0.0, 0.042, 0.0)
        costs.observe(1, 1 if random.Random(_).random() < 0.82 else 0, 0.0, 0.070, 0.0, key=3)
    assert not costs.passes.line_sound
    assert costs.choose_k(1, 16, 3, draft_step_s=0.0) > 1
    best = costs.choose_k(1, 16, 3, draft_step_s=0.0)
    assert costs.choose_k(1, 16, 3, draft_step_s=0.0, explore=True) == min(best + 1, 16)


def test_a_lookup_copy_is_taken_only_when_it_beats_the_model_draft() -> None:
    fresh = CostModel()
    assert fresh.lookup_pays(1, 8, 5, key=8) and not fresh.lookup_pays(1, 8, 5, key=2)  # nothing measured: long matches only

    def measured(model_accepts: int, model_step_s: float, copy_accepts: int) -> CostModel:
        costs = CostModel()
        for _ in range(12):
            costs.observe(0, 0, 0.0, 0.010, 0.0)  # plain steps
            costs.observe(3, model_accepts, 3 * model_step_s, 0.014, 0.0)  # the model's rounds
            costs.observe(3, copy_accepts, 0.0, 0.014, 0.0, key=2, free=True)  # copies of 2-token matches
        return costs

    good_copies = measured(model_accepts=0, model_step_s=0.010, copy_accepts=3)
    assert good_copies.lookup_pays(1, 8, 3, key=2)
    assert good_copies.draft_step_s == pytest.approx(0.010)  # a copy's round does not move the model's step
    assert not measured(model_accepts=3, model_step_s=0.002, copy_accepts=0).lookup_pays(1, 8, 3, key=2)
