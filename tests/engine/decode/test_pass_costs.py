"""The plain-speed estimator behind the speedup.

Rounds are fed with synthetic times (a fake clock): the figures must follow
the costs, not the load, and a single slow round must not move them.
"""
from __future__ import annotations

import random

import pytest

from engine.decode.pass_costs import MIN_PLAIN, PassCosts, speedup_upper_bound
from engine.decode.cost_model import CostModel
from engine.decode.tally import SPEEDUP_FLOOR, ReplyTally
from engine.events import PLAIN_REPLY, TOO_SHORT

# The int4 pocket target as the lead measured it: 1 token 10 ms, 5 tokens 16 ms.
ONE, SLOPE, BASE, OTHER = 0.010, 0.0015, 0.0085, 0.001


def verify_cost(n: int) -> float:
    return ONE if n == 1 else BASE + SLOPE * n


def play(stats: ReplyTally, costs: CostModel, proposed: int, accepted: int, emitted: int, load: float,
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


def test_a_one_token_round_that_looked_for_a_draft_counts_in_the_plain_step_without_the_look() -> None:
    """An n-gram round that found nothing fed one token, but plain decoding would not have
    looked: counting the lookup made plain decoding read slower than it is."""
    costs, model = PassCosts(), CostModel()
    for _ in range(MIN_PLAIN):
        costs.add(1, 0.010, 0.0115, draft_s=0.0005)
        model.observe(0, 0, 0.0005, 0.010, 0.001)
    assert costs.plain_step_s == pytest.approx(0.011)
    assert model.passes.plain_step_s == pytest.approx(0.011)


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
    stats = ReplyTally("plain", "none", True, costs)
    for i in range(60):
        load = 1.0 if i < 20 else 3.0  # another process takes the core a third of the way in
        play(stats, costs, 0, 0, 1, load, stall=1.0 if i == 40 else 0.0)
        if i < MIN_PLAIN - 1:
            assert stats.snapshot().plain_tokens_per_s is None  # not sound yet
    snap = stats.snapshot()
    assert snap.plain_tokens_per_s is not None and snap.tokens_per_s is not None
    assert snap.tokens_per_s / snap.plain_tokens_per_s == pytest.approx(1.0, abs=0.01)
    assert snap.speedup is None and snap.speedup_note == PLAIN_REPLY  # a plain reply shows no "× vs plain"
    assert snap.plain_rounds == 60 and snap.mode_tokens == (("plain", 60),)


def test_speculative_speedup_follows_the_costs_not_the_load() -> None:
    costs = CostModel()
    stats = ReplyTally("ngram", "n-gram lookup", True, costs)
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


def test_upper_bound_needs_consistent_evidence() -> None:
    steady = [(1, 2.0)] * 16  # 0.5x every round
    ratio, upper = speedup_upper_bound(steady)
    assert ratio == pytest.approx(0.5) and upper == pytest.approx(0.5)
    noisy = [(4, 2.0), (1, 6.0)] * 4  # 0.625x overall, rounds all over the place
    ratio, upper = speedup_upper_bound(noisy)
    assert ratio == pytest.approx(0.625) and upper > 1.0


def test_one_estimate_with_its_error_and_none_below_the_floor() -> None:
    """The speedup comes with a standard error, and no figure is given from too little evidence:
    too few tokens, drafting rounds or plain-step samples say "too short to measure"."""
    costs = CostModel()
    stats = ReplyTally("ngram", "n-gram lookup", True, costs)
    rng = random.Random(3)
    floor = SPEEDUP_FLOOR
    seen_too_short = False
    for i in range(120):
        load = 1.0 + 0.2 * rng.random()
        if i % 4 == 0:
            play(stats, costs, 0, 0, 1, load)
        else:
            play(stats, costs, 4, 2, 3, load)
        snap = stats.snapshot()
        short = (snap.tokens < floor["tokens"] or stats.drafting_rounds < floor["drafting_rounds"]
                 or costs.passes.plain_samples < floor["plain_samples"])
        if short and snap.proposed:
            seen_too_short = True
            assert snap.speedup is None and snap.speedup_se is None and snap.speedup_note == TOO_SHORT
    assert seen_too_short
    snap = stats.snapshot()
    assert snap.speedup is not None and snap.speedup_note is None
    assert snap.speedup_se is not None and 0 < snap.speedup_se < 0.1 * snap.speedup
    assert snap.speedup == pytest.approx(snap.tokens_per_s / snap.plain_tokens_per_s)


def test_a_noisy_plain_step_widens_the_error() -> None:
    def final(spread: float) -> tuple[float, float]:
        costs = CostModel()
        stats = ReplyTally("ngram", "n-gram lookup", True, costs)
        rng = random.Random(5)
        for i in range(80):
            if i % 4 == 0:
                verify = ONE * (1 + spread * rng.random())
                costs.observe(0, 0, 0.0, verify, OTHER, key=8)
                stats.record(0, 0, 0, 1, 0.0, verify, OTHER)
            else:
                play(stats, costs, 4, 2, 3, 1.0)
        snap = stats.snapshot()
        assert snap.speedup is not None and snap.speedup_se is not None
        return snap.speedup, snap.speedup_se

    assert final(1.0)[1] > 2 * final(0.0)[1]


def test_a_speedup_known_only_to_within_its_own_size_is_not_shown() -> None:
    """Past the floor, a figure whose standard error exceeds SPEEDUP_MAX_RELATIVE_SE of it (a busy
    machine's plain step, here spread over 1 to 51 times its cost) is None and "too uncertain"."""
    from engine.events import TOO_NOISY

    costs = CostModel()
    stats = ReplyTally("ngram", "n-gram lookup", True, costs)
    rng = random.Random(5)
    for i in range(80):
        if i % 4 == 0:
            verify = ONE * (1 + 50 * rng.random())
            costs.observe(0, 0, 0.0, verify, OTHER, key=8)
            stats.record(0, 0, 0, 1, 0.0, verify, OTHER)
        else:
            play(stats, costs, 4, 2, 3, 1.0)
    snap = stats.snapshot()
    assert snap.tokens >= SPEEDUP_FLOOR["tokens"] and stats.drafting_rounds >= SPEEDUP_FLOOR["drafting_rounds"]
    assert snap.speedup is None and snap.speedup_se is None and snap.speedup_note == TOO_NOISY


def test_a_step_that_is_not_plain_decodings_is_valued_apart_from_t1() -> None:
    """On a card, plain decoding runs in bursts and a lookup's miss is one synchronised step: the
    miss is measured under its own key, so t(1) and the plain step stay the burst's, and a miss
    is worth its own time over the plain step, not one plain token."""
    from engine.decode.pass_costs import SYNCED_STEP, size_key

    costs = PassCosts()
    for _ in range(8):
        costs.add(1, 1.0, 1.1)  # a burst's step: pass 1.0, round 1.1
        costs.add(1, 2.0, 2.1, plain_sample=False)  # a miss
    assert costs.typical(1) == 1.0 and costs.plain_step_s == 1.1
    assert costs.typical(SYNCED_STEP) == 2.0 and size_key(1, plain_sample=False) == SYNCED_STEP
    assert costs.plain_equivalent(1, 1.0, 1.1) == 1.0
    assert abs(costs.plain_equivalent(SYNCED_STEP, 2.0, 2.1) - 2.1 / 1.1) < 1e-9
    assert costs.predict(1) == 1.0  # choosing K never borrows the miss's cost


def test_a_reply_that_grew_quieter_is_valued_at_the_load_each_round_ran_under() -> None:
    """Drafting rounds under 3x load, then the machine grows quiet and every round is plain: a
    plain step measured quiet against a pass cost measured loaded read 0.69x ("± 0.03") where the
    rounds said 1.29x. Pass and plain step are compared only when timed close together."""
    costs = CostModel()

    def round_(stats: ReplyTally, proposed: int, emitted: int, pass_s: float) -> None:
        costs.observe(proposed, proposed, 0.0, pass_s, 0.0)
        stats.record(proposed, proposed, proposed, emitted, 0.0, pass_s, 0.0)

    warm = ReplyTally("ngram", "n-gram lookup", True, costs)
    for _ in range(12):
        round_(warm, 0, 1, 0.010)  # loaded: a plain step 10 ms
    for _ in range(8):
        round_(warm, 1, 2, 0.012)  # and a two-token pass 12 ms
    stats = ReplyTally("ngram", "n-gram lookup", True, costs)
    for _ in range(20):
        round_(stats, 1, 2, 0.012)  # still loaded: 2 tokens for 1.2 plain steps
    for _ in range(32):
        round_(stats, 0, 1, 0.0033)  # quiet: plain steps of 3.3 ms
    truth = (20 * 2 + 32) / (20 * 1.2 + 32)
    snap = stats.snapshot()
    assert snap.speedup == pytest.approx(truth, rel=0.01)
    assert snap.speedup_se is not None and snap.speedup_se < 0.1 * truth
    assert snap.speedup == pytest.approx(snap.tokens_per_s / snap.plain_tokens_per_s)


def test_one_stalled_plain_step_neither_moves_the_step_nor_widens_its_error() -> None:
    """With the spread read from the mean, one 2-second step among 31 of 10 ms took the relative
    error from 0.0007 to 1.5, and every speedup read "too uncertain" for the next 32 steps."""
    costs = PassCosts()
    rng = random.Random(1)
    for _ in range(31):
        costs.add(1, 0.009, 0.010 * (1 + 0.01 * rng.random()))
    before = costs.plain_step_relative_se()
    costs.add(1, 2.0, 2.001)
    assert costs.plain_step_s == pytest.approx(0.010, rel=0.01)
    assert before < 0.01 and costs.plain_step_relative_se() < 2 * before


def test_pass_and_plain_step_timed_together_give_the_cost_ratio_whatever_the_load() -> None:
    costs = PassCosts()
    for i in range(40):
        load = 1.0 if i < 20 else 4.0
        costs.add(1, 0.009 * load, 0.010 * load)
        costs.add(5, 0.016 * load, 0.017 * load)
    assert costs.cost_ratio(5) == pytest.approx(1.6)
    assert costs.cost_ratio(1) == pytest.approx(0.9)
    assert costs.plain_equivalent(5, 0.016 * 7, 0.017 * 7) == pytest.approx(1.7)  # at any load


def test_one_slow_pass_of_a_rare_size_is_no_cost_ratio() -> None:
    """Paired again with every plain round after it, one stalled size-7 pass made the ratio alone
    (4.55 where its size costs about 2 plain steps): each pass pairs once, and a ratio needs
    MIN_SAMPLES plain rounds behind it."""
    costs = PassCosts()
    for _ in range(4):
        costs.add(1, 0.010, 0.011)
    costs.add(7, 0.050, 0.051)  # stalled
    for _ in range(3):
        costs.add(1, 0.010, 0.011)
    assert costs.cost_ratio(7) is None  # one pass: neither enough pairs nor a median of its own
    for _ in range(3):
        costs.add(7, 0.020, 0.021)
        costs.add(1, 0.010, 0.011)
    assert costs.cost_ratio(7) == pytest.approx(0.020 / 0.011)  # the median of the four pairs


def test_in_steady_state_every_round_uses_the_ratio_of_passes_timed_together() -> None:
    """A plain round every 33 passes (calibration) pairs with up to 16 passes; kept pair by pair, 32
    pairs spanned two plain rounds and the ratio fell back to the medians' in 3 rounds of 4 (a
    review), which a load that changes between their windows tilts. Each plain round votes once."""
    costs = PassCosts()
    off: list[float] = []
    for i in range(1200):
        load = 1.0 if (i // 150) % 2 == 0 else 3.0  # the machine busy and quiet by turns
        if i % 33 == 0:
            costs.add(1, 0.009 * load, 0.010 * load)
        else:
            costs.add(5, 0.016 * load, 0.017 * load)
        if i > 200:
            ratio = costs.cost_ratio(5)
            off.append(abs((ratio or 0.0) / 1.6 - 1))
    assert max(off) < 1e-9  # always the paired ratio, at every load
