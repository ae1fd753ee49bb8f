"""Prompt-lookup drafter and the adaptive choice of K."""
from __future__ import annotations

from engine.decode.drafters import NgramDrafter, match_key
from engine.events import SamplingParams
from engine.decode.cost_model import CostModel, expected_tokens

GREEDY = SamplingParams()


def propose(drafter: NgramDrafter, context: list[int], k: int) -> tuple[int, ...]:
    return drafter.propose(context, k, GREEDY, None).tokens


def test_proposes_what_followed_the_suffix() -> None:
    context = [5, 6, 7, 8, 9, 1, 2, 5, 6, 7]
    assert propose(NgramDrafter(), context, 3) == (8, 9, 1)
    assert propose(NgramDrafter(), context, 10) == (8, 9, 1, 2, 5, 6, 7)  # up to the end of the context


def test_longest_match_wins_over_a_more_recent_short_one() -> None:
    # "3 4" occurred followed by 10; "4" alone occurred most recently followed by 20.
    context = [3, 4, 10, 11, 4, 20, 3, 4]
    assert propose(NgramDrafter(max_ngram=2), context, 2) == (10, 11)
    assert propose(NgramDrafter(max_ngram=1), context, 2) == (20, 3)


def test_most_recent_occurrence_wins() -> None:
    context = [1, 2, 3, 9, 1, 2, 4, 9, 1, 2]
    assert propose(NgramDrafter(), context, 2) == (4, 9)


def test_no_match_proposes_nothing_and_never_matches_itself() -> None:
    assert propose(NgramDrafter(), [1, 2, 3, 4], 4) == ()
    assert propose(NgramDrafter(), [7], 4) == ()
    assert propose(NgramDrafter(), [1, 2, 3], 0) == ()


def test_index_follows_a_growing_then_diverging_context() -> None:
    drafter = NgramDrafter()
    context = [1, 2, 3, 4, 1, 2]
    assert propose(drafter, context, 2) == (3, 4)
    context += [3, 4, 7, 1, 2, 3]  # grows: the latest "1 2 3" is followed by 4 at index 3 and 7 later
    assert propose(drafter, context, 2) == (4, 7)
    assert propose(drafter, [9, 8, 9], 2) == (8, 9)  # a new conversation: the index is rebuilt


def test_expected_tokens_matches_the_closed_form() -> None:
    alpha = 0.7
    for k in range(0, 8):
        closed = (1 - alpha ** (k + 1)) / (1 - alpha)
        assert abs(expected_tokens([alpha] * k, k) - closed) < 1e-12


def feed(costs: CostModel, accept_prob: float, rounds: int = 200, k: int = 4) -> None:
    """Synthetic rounds: draft step 10 ms, target pass 50 ms + 5 ms per extra token."""
    import random

    rng = random.Random(0)
    for _ in range(rounds):
        n = 0
        while n < k and rng.random() < accept_prob:
            n += 1
        costs.observe(k, n, draft_s=0.010 * k, verify_s=0.050 + 0.005 * k, other_s=0.001)
    costs.observe(0, 0, draft_s=0.0, verify_s=0.050, other_s=0.001)


def test_adaptive_k_is_large_when_acceptance_is_high_and_small_when_low() -> None:
    high, low = CostModel(), CostModel()
    feed(high, 0.95)
    feed(low, 0.2)
    k_high, k_low = high.choose_k(1, 8), low.choose_k(1, 8)
    assert k_high >= 4
    assert k_low <= 2
    assert k_high > k_low


def test_adaptive_k_stays_within_bounds_and_accounts_for_draft_cost() -> None:
    cheap, dear = CostModel(), CostModel()
    feed(cheap, 0.8)
    feed(dear, 0.8)
    dear.draft_step_s = 0.2  # a draft step four times a target pass
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


def test_the_key_is_the_match_length_counted_past_max_ngram() -> None:
    span = list(range(100, 140))
    context = [1, 2, *span, 3, *span[:20]]  # the reply is copying the span
    draft = NgramDrafter(max_ngram=4).propose(context, 16, GREEDY, None)
    assert draft.tokens == tuple(span[20:36]) and draft.key == 16
    chance = NgramDrafter(max_ngram=4).propose([5, 6, 7, 9, 8, 1, 9], 4, GREEDY, None)
    assert chance.tokens == (8, 1, 9) and chance.key == 1
    assert [match_key(n) for n in (1, 2, 3, 4, 5, 7, 8, 15, 16, 40)] == [1, 2, 3, 4, 4, 4, 8, 8, 16, 16]


def test_the_index_grows_with_commits_and_prefill_notices_a_changed_prompt() -> None:
    drafter = NgramDrafter()
    context = [1, 2, 3, 4]
    drafter.prefill(context)
    context += [1, 2]
    drafter.commit(context)
    assert propose(drafter, context, 2) == (3, 4)
    # A new reply whose prompt differs early on (not at its end) is re-indexed.
    other = [9, 2, 3, 4, 1, 2, 7, 7, 1, 2]
    drafter.prefill(other)
    assert propose(drafter, other, 2) == (7, 7)


def test_a_longer_match_than_any_seen_borrows_from_the_longest_seen() -> None:
    costs = CostModel()
    for _ in range(200):
        costs.observe(4, 0, 0.0, 0.05, 0.0, key=1)  # chance matches: many, never accepted
    for _ in range(10):
        costs.observe(4, 4, 0.0, 0.05, 0.0, key=4)  # a few long ones: always accepted
    assert costs.acceptance(2, key=16)[0] > 0.8  # like key 4, not like the pooled mass of key 1
    assert costs.acceptance(2, key=2)[0] < 0.1  # key 1 is the nearest below
