"""The prompt-lookup (n-gram) drafter: what it proposes, and the match length it reports."""
from __future__ import annotations

from engine.decode.drafters import NgramDrafter, match_key
from engine.events import SamplingParams

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
