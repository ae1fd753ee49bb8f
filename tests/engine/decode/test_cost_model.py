"""CostModel and ReplyTally: acceptance per draft position, K chosen from measured costs, a reply's counts.

Rounds are fed with synthetic times (a fake clock), so every figure follows from the costs given.
"""
from __future__ import annotations

import random

import pytest

from engine.decode.cost_model import REFRESH_EVERY, CostModel, PositionCounts, expected_tokens
from engine.decode.tally import ReplyTally
from engine.decode.pass_costs import MIN_PLAIN

# The int4 pocket target as the lead measured it: 1 token 10 ms, 5 tokens 16 ms.
ONE, SLOPE, BASE, OTHER = 0.010, 0.0015, 0.0085, 0.001


def verify_cost(n: int) -> float:
    return ONE if n == 1 else BASE + SLOPE * n


# -- K chosen from measured acceptance and costs ----------------------------------------------


def test_expected_tokens_matches_the_closed_form() -> None:
    alpha = 0.7
    for k in range(0, 8):
        closed = (1 - alpha ** (k + 1)) / (1 - alpha)
        assert abs(expected_tokens([alpha] * k, k) - closed) < 1e-12


def feed(costs: CostModel, accept_prob: float, rounds: int = 200, k: int = 4, step: float = 0.010) -> None:
    """Synthetic rounds: draft step ``step`` (10 ms), target pass 50 ms + 5 ms per extra token."""
    rng = random.Random(0)
    for _ in range(rounds):
        n = 0
        while n < k and rng.random() < accept_prob:
            n += 1
        costs.observe(k, n, draft_s=step * k, verify_s=0.050 + 0.005 * k, other_s=0.001)
    costs.observe(0, 0, draft_s=0.0, verify_s=0.050, other_s=0.001)


def test_adaptive_k_is_large_when_acceptance_is_high_and_small_when_low() -> None:
    high, low = CostModel(), CostModel()
    feed(high, 0.95)
    feed(low, 0.2)
    k_high, k_low = high.choose_k(1, 8), low.choose_k(1, 8)
    assert k_high >= 4
    assert k_low <= 2
    assert k_high > k_low


def test_k_follows_the_acceptance_of_the_latest_rounds_not_the_sessions() -> None:
    """A session that drafted prose (drafts mostly rejected) and now drafts code (mostly accepted)
    chooses K for code within a reply's worth of rounds: acceptance counted over the whole session
    held K at 1 on coder's code prompts after chat ones."""
    switched, code_only = CostModel(), CostModel()
    feed(switched, 0.2, rounds=300)
    assert switched.choose_k(1, 8) <= 2
    switched.new_reply()
    assert switched.choose_k(1, 8) <= 2  # a reply starts from what the session saw
    feed(switched, 0.95, rounds=30)
    feed(code_only, 0.95, rounds=30)
    assert switched.acceptance(1)[0] > 0.75  # 30 rounds of the reply against the session's prior of 8
    assert switched.choose_k(1, 8) >= 4 and code_only.choose_k(1, 8) >= 4
    assert switched.positions[0].per_token() < 0.5  # the session's own counts stay whole


def test_adaptive_k_stays_within_bounds_and_accounts_for_draft_cost() -> None:
    cheap, dear = CostModel(), CostModel()
    feed(cheap, 0.8)
    feed(dear, 0.8, step=0.2)  # a draft step four times a target pass
    assert 2 <= cheap.choose_k(2, 3) <= 3
    assert dear.choose_k(1, 8) == 1
    assert cheap.choose_k(1, 8) > dear.choose_k(1, 8)


def test_cost_model_measures_plain_speed_from_k0_rounds() -> None:
    costs = CostModel()
    for _ in range(3):
        costs.observe(0, 0, 0.0, 0.045, 0.005)
    assert costs.plain_tokens_per_s is None  # three one-token rounds are not enough
    costs.observe(0, 0, 0.0, 0.045, 0.005)
    assert abs(costs.plain_tokens_per_s - 20.0) < 1e-9
    assert abs(costs.pass_cost(1) - 0.045) < 1e-9
    assert costs.pass_cost(5) > costs.pass_cost(1)  # one size seen: a prior slope, never flat
    for _ in range(3):
        costs.observe(4, 2, 0.04, 0.065, 0.005)
        costs.observe(2, 2, 0.02, 0.055, 0.005)
    assert abs(costs.pass_cost(4) - 0.060) < 1e-9  # on the line through 3 and 5 tokens fed
    costs.observe(8, 2, 0.08, 0.060, 0.005)  # a noisy cheap pass of 9 tokens
    assert costs.pass_cost(9) >= costs.pass_cost(8) >= costs.pass_cost(2)  # the fit stays monotone


def test_an_unmeasured_kind_of_draft_borrows_pooled_acceptance() -> None:
    costs = CostModel()
    for _ in range(50):
        costs.observe(4, 4, 0.0, 0.05, 0.0, key=3)
    assert costs.acceptance(2, key=3)[0] > 0.9
    assert costs.acceptance(2, key=1)[0] > 0.9  # key 1 never seen: pooled
    for _ in range(50):
        costs.observe(4, 0, 0.0, 0.05, 0.0, key=1)
    assert costs.acceptance(2, key=1)[0] < 0.1 < 0.9 < costs.acceptance(2, key=3)[0]


def test_a_longer_match_than_any_seen_borrows_from_the_longest_seen() -> None:
    costs = CostModel()
    for _ in range(200):
        costs.observe(4, 0, 0.0, 0.05, 0.0, key=1)  # chance matches: many, never accepted
    for _ in range(10):
        costs.observe(4, 4, 0.0, 0.05, 0.0, key=4)  # a few long ones: always accepted
    assert costs.acceptance(2, key=16)[0] > 0.8  # like key 4, not like the pooled mass of key 1
    assert costs.acceptance(2, key=2)[0] < 0.1  # key 1 is the nearest below


def test_two_acceptance_figures() -> None:
    """A per-token α of 0.8 at K = 5 shows as an acceptance rate of 0.54."""
    costs = CostModel()
    stats = ReplyTally("spec", "d", False, costs)
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


# -- per-position counts, the model's running figures, one reply's counters -------------------


def test_positions_reached_and_accepted() -> None:
    counts = PositionCounts()
    counts.add(3, 1)  # position 1 accepted, 2 reached and rejected, 3 never reached
    counts.add(3, 3)
    counts.add(2, 0)
    assert (counts.reached, counts.accepted) == ([3, 2, 1], [2, 1, 1])
    assert counts.per_token() == pytest.approx(4 / 6)
    assert counts.rates() == pytest.approx((2 / 3, 1 / 2, 1.0))
    pooled = PositionCounts()
    pooled.add_counts(counts)
    pooled.add_counts(PositionCounts([1], [1]))
    assert (pooled.reached, pooled.accepted) == ([4, 2, 1], [3, 1, 1])


def test_nothing_drafted_has_no_figures_and_smoothing_starts_at_one_half() -> None:
    empty = PositionCounts()
    assert empty.per_token() is None and empty.rates() == ()
    assert empty.smoothed(3) == [0.5, 0.5, 0.5]


def test_each_position_is_shrunk_towards_the_one_before() -> None:
    counts = PositionCounts([3, 2, 1], [2, 1, 1])
    # (accepted + 2 * prior) / (reached + 2), the prior being the previous position's estimate
    assert counts.smoothed(4) == pytest.approx([3 / 5, 2.2 / 4, 2.1 / 3, 2.1 / 3])


def test_the_draft_step_is_a_running_average_and_plain_rounds_reset_the_calibration_count() -> None:
    costs = CostModel()
    costs.observe(4, 2, 0.040, 0.05, 0.001)
    assert costs.draft_step_s == pytest.approx(0.010)
    costs.observe(2, 2, 0.040, 0.05, 0.003)  # 20 ms a step: weighted 0.2 against the 10 ms seen
    assert costs.draft_step_s == pytest.approx(0.012)
    costs.observe(2, 0, 0.500, 0.05, 0.003, key=1, free=True)  # a lookup's time is not a draft step
    assert costs.draft_step_s == pytest.approx(0.012)
    costs.observe(0, 0, 0.0, 0.02, 0.002)
    assert costs.rounds_since_plain == 0 and costs.overhead_s == pytest.approx(0.0025)  # median of four
    costs.observe(3, 1, 0.03, 0.05, 0.0)
    assert costs.rounds_since_plain == 1
    assert sorted(costs.positions) == [0, 1]  # the plain round counted no position


def test_before_anything_is_measured_k_starts_in_the_middle() -> None:
    costs = CostModel()
    assert costs.plain_step_s is None and costs.plain_tokens_per_s is None and costs.pass_cost(3) is None
    assert costs.overhead_s == 0.0 and costs.round_cost(3, 0.01) == pytest.approx(0.03)
    assert (costs.choose_k(1, 8), costs.choose_k(5, 8), costs.choose_k(1, 2)) == (4, 5, 2)
    assert costs.choose_k(3, 3) == 3 and costs.choose_k(6, 2) == 6  # no range: k_min


def test_a_reply_counts_its_rounds() -> None:
    stats = ReplyTally("spec", "draft", True, CostModel())
    stats.record(4, 4, 2, 3, 0.04, 0.05, 0.01)
    stats.record(4, 0, 0, 1, 0.0, 0.02, 0.0, mode="plain")  # a calibration round: K shown, nothing drafted
    stats.prefill_s = 0.5
    snap = stats.snapshot()
    assert (snap.mode, snap.drafter, snap.k, snap.adaptive) == ("spec", "draft", 4, True)
    assert (snap.rounds, snap.target_passes, snap.proposed, snap.accepted, snap.tokens) == (2, 2, 4, 2, 4)
    assert snap.alpha == 0.5 and snap.alpha_per_token == pytest.approx(2 / 3) and snap.tau == 2.0
    assert snap.per_position == (1.0, 1.0, 0.0)
    assert snap.elapsed_s == pytest.approx(0.62) and snap.tokens_per_s == pytest.approx(4 / 0.12)
    assert snap.itl_ms == pytest.approx(30.0)
    assert snap.plain_rounds == 1 and snap.plain_measured_tokens_per_s == pytest.approx(50.0)
    assert snap.mode_tokens == (("spec", 3), ("plain", 1))
    assert snap.speedup is None and snap.plain_tokens_per_s is None  # the plain speed is not sound yet


def test_drafts_cut_off_by_a_stop_are_not_counted_accepted() -> None:
    """The last round drafted [end of text, x], both accepted; the stop keeps one token. Counted as
    verified, the reply read accepted 0.50 with τ 1.00 (every pass one token)."""
    stats = ReplyTally("ngram", "n-gram lookup", True, CostModel())
    for _ in range(7):
        stats.record(2, 0, 0, 1, 0.0, 0.01, 0.0)
    stats.record(2, 2, 0, 1, 0.0, 0.01, 0.0, origin="chat")
    stats.record(2, 2, 2, 1, 0.0, 0.01, 0.0, origin="chat")  # cut at the drafted stop token
    stats.record(4, 4, 3, 2, 0.0, 0.01, 0.0, origin="chat")  # cut by the length limit after two drafts
    snap = stats.snapshot()
    assert (snap.tokens, snap.target_passes, snap.proposed, snap.accepted) == (11, 10, 5, 3)
    assert snap.tokens - snap.target_passes <= snap.accepted  # τ above 1 only by what was accepted
    assert snap.per_position == (2 / 3, 1.0)
    assert [(o.rounds, o.proposed, o.accepted, o.tokens) for o in snap.by_origin] == [(3, 5, 3, 4)]
    stats.record(4, 4, 1, 2, 0.0, 0.01, 0.0, origin="chat")  # not cut: one accepted and the target's own
    assert (stats.snapshot().proposed, stats.snapshot().accepted) == (9, 4)


def test_a_reply_with_no_rounds_has_no_rates() -> None:
    stats = ReplyTally("ngram", "n-gram lookup", False, CostModel())
    stats.speculation_off_reason = "switched off"
    snap = stats.snapshot()
    assert (snap.alpha, snap.alpha_per_token, snap.tau, snap.tokens_per_s, snap.itl_ms) == (None,) * 5
    assert snap.mode_tokens == () and snap.plain_measured_tokens_per_s is None
    assert snap.speculation_off_reason == "switched off"


def test_a_refresh_round_lets_a_k_measured_only_when_slow_win_again() -> None:
    """coder's trace: the first passes of three tokens after a prompt were slow (58 ms, 48 later),
    K = 1 looked best from then on and K = 2 was never measured again. A refresh round tries the
    neighbour; once its new rounds outnumber the slow ones, it wins."""
    costs = CostModel()
    for _ in range(MIN_PLAIN):
        costs.observe(0, 0, 0.0, 0.036, 0.0)
    for accepted in (2, 1, 2):
        costs.observe(2, accepted, 0.0285, 0.058, 0.0)
    for _ in range(20):
        costs.observe(1, 1, 0.015, 0.043, 0.0)
    assert costs.passes.passes // REFRESH_EVERY % 2 == 0  # this refresh tries one more
    assert costs.choose_k(1, 8) == 1
    assert costs.choose_k(1, 8, refresh=True) == 2
    for accepted in (2, 2, 1, 2):
        costs.observe(2, accepted, 0.0245, 0.048, 0.0)
    assert costs.choose_k(1, 8) == 2
    assert costs.choose_k(1, 8, refresh=True) in (1, 3)  # the neighbours, in turn
